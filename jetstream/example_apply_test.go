package topology_test

import (
	"context"
	"fmt"
	"time"

	"github.com/failbus/failbus/failbustest"
	topology "github.com/failbus/failbus/jetstream"
)

// A service applies the topology at start-up (it is idempotent) and binds
// to its durable consumer by name, never by spelling it.
func ExampleApply() {
	bus, err := failbustest.New() // its services applied the topology already
	if err != nil {
		panic(err)
	}
	defer bus.Close()
	js := bus.JetStream()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	opts := topology.Options{
		// Keep dead letters for a year instead of topology.DefaultMaxAgeDLQ.
		MaxAge: map[string]time.Duration{topology.StreamDLQ: 365 * 24 * time.Hour},
	}
	if err := topology.Apply(ctx, js, opts); err != nil {
		panic(err)
	}

	stream, cfg, _ := topology.Consumer(topology.ConsumerClassifier)
	cons, err := js.Consumer(ctx, stream, cfg.Durable)
	if err != nil {
		panic(err)
	}
	fmt.Println(cons.CachedInfo().Stream, cons.CachedInfo().Name, cfg.MaxDeliver, cfg.MaxAckPending)
	// Output: FAILBUS_OUTCOMES classifier 10 1000
}
