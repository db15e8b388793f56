// Package topology is failbus's JetStream topology as data: every stream,
// durable consumer and KV bucket of failbus, one JSON file each, and
// Apply, which makes a server match them.
//
// The directory is called jetstream/ because the design card names it so:
// it holds the topology. The package is named topology for what it provides,
// and so that it never clashes with nats.go's own jetstream package, which
// every caller imports beside it:
//
//	import (
//		"github.com/nats-io/nats.go/jetstream"
//		topology "github.com/failbus/failbus/jetstream"
//	)
//
// The JSON files under streams/, consumers/<STREAM>/ and buckets/ are the
// source of truth. They are in the nats server API form (durations in
// nanoseconds), so an operator can apply them by hand with
// `nats stream add --config` and `nats consumer add --config` (see
// README.md), and they are compiled into the binary with go:embed, so a
// service never depends on files next to it.
//
// Services never spell a name: they use the constants (StreamOutcomes,
// ConsumerClassifier, BucketRefusals, ...) and read a consumer's settings
// with Consumer, so the runner knows its stream, filter and MaxDeliver.
package topology
