package streamread_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/streamread"
	topology "github.com/failbus/failbus/jetstream"
)

// TestKeyValueRecreatesADeletedBucket: a bucket deleted under a running
// service comes back, with the topology's configuration, on the next
// operation, which then succeeds; the recreation is logged with its cause.
func TestKeyValueRecreatesADeletedBucket(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := topology.Apply(b.ctx, b.js, topology.Options{}); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	kv, err := streamread.KeyValue(b.ctx, b.js, topology.BucketRefusals)
	if err != nil {
		t.Fatal(err)
	}
	logger := zerolog.New(&logs)
	b.ctx = logger.WithContext(b.ctx) // the operation's logger (a handler's, in a service)
	if _, err := kv.Put(b.ctx, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	before, err := b.js.Stream(b.ctx, "KV_"+topology.BucketRefusals)
	if err != nil {
		t.Fatal(err)
	}

	ops := []struct {
		name string
		run  func() error
	}{
		{"get", func() error {
			_, err := kv.Get(b.ctx, "k")
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				return nil // recreated empty: the key is gone, the bucket works
			}
			return err
		}},
		{"put", func() error { _, err := kv.Put(b.ctx, "k", []byte("v2")); return err }},
		{"create", func() error { _, err := kv.Create(b.ctx, "new", []byte("v")); return err }},
	}
	for _, op := range ops {
		if err := b.js.DeleteKeyValue(b.ctx, topology.BucketRefusals); err != nil {
			t.Fatal(err)
		}
		if err := op.run(); err != nil {
			t.Fatalf("%s after the bucket was deleted: %v", op.name, err)
		}
		after, err := b.js.Stream(b.ctx, "KV_"+topology.BucketRefusals)
		if err != nil {
			t.Fatalf("%s: bucket not recreated: %v", op.name, err)
		}
		h, w := before.CachedInfo().Config, after.CachedInfo().Config
		if h.MaxAge != w.MaxAge || h.MaxMsgsPerSubject != w.MaxMsgsPerSubject || h.Replicas != w.Replicas || h.Storage != w.Storage {
			t.Fatalf("%s: recreated as %+v, want %+v", op.name, w, h)
		}
	}
	if n := strings.Count(logs.String(), "bucket was deleted: recreated"); n != len(ops) {
		t.Fatalf("%d recreations logged, want %d:\n%s", n, len(ops), logs.String())
	}
	if !strings.Contains(logs.String(), `"cause"`) {
		t.Fatalf("log does not say why: %s", logs.String())
	}
}
