package streamread_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/streamread"
)

// TestIsWrongLastSeq: the server's own answers to a compare-and-set that
// lost, as a publish and as a KV update receive them, wrapped or not, are
// conflicts; success, other refusals and other errors are not.
func TestIsWrongLastSeq(t *testing.T) {
	b := setup(t)
	if _, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "CAS", Subjects: []string{"cas.>"}}); err != nil {
		t.Fatal(err)
	}
	first, err := b.js.Publish(b.ctx, "cas.a", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	_, perSubject := b.js.Publish(b.ctx, "cas.a", []byte("2"), jetstream.WithExpectLastSequencePerSubject(first.Sequence+5))
	_, ofStream := b.js.Publish(b.ctx, "cas.b", []byte("2"), jetstream.WithExpectLastSequence(first.Sequence+5))
	_, otherStream := b.js.Publish(b.ctx, "cas.b", []byte("2"), jetstream.WithExpectStream("NOT_CAS"))
	_, ok := b.js.Publish(b.ctx, "cas.a", []byte("3"), jetstream.WithExpectLastSequencePerSubject(first.Sequence))
	kv, err := b.js.CreateKeyValue(b.ctx, jetstream.KeyValueConfig{Bucket: "CASKV"})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(b.ctx, "k", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	_, kvUpdate := kv.Update(b.ctx, "k", []byte("2"), rev+5)
	_, notFound := b.js.Publish(b.ctx, "nobody.listens", []byte("x"))

	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"expected last sequence per subject", perSubject, true},
		{"expected last sequence of the stream", ofStream, true},
		{"wrapped", fmt.Errorf("append: %w", perSubject), true},
		{"KV update on a stale revision", kvUpdate, true},
		{"another refusal (expected stream)", otherStream, false},
		{"a publish that succeeded", ok, false},
		{"no stream for the subject", notFound, false},
		{"a plain error", errors.New("wrong last sequence"), false},
		{"a connection error", nats.ErrConnectionClosed, false},
	} {
		if got := streamread.IsWrongLastSeq(tc.err); got != tc.want {
			t.Errorf("%s: IsWrongLastSeq(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
