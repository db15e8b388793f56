package topology_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
)

// TestApplyOnAServerWithTooLittleStore: the topology's max_bytes are
// reserved against the server's store limit; a server configured with
// less says so, naming the limit to raise.
func TestApplyOnAServerWithTooLittleStore(t *testing.T) {
	t.Parallel()
	srv := embedded.StartTestOpts(t, embedded.Options{Dir: t.TempDir(), MaxStore: 1 << 30})
	nc := embedded.ConnectTest(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	err = topology.Apply(t.Context(), js, topology.Options{})
	if !errors.Is(err, topology.ErrStore) || !strings.Contains(err.Error(), "max_file_store") {
		t.Fatalf("Apply = %v, want ErrStore naming max_file_store", err)
	}
	// Sized down to fit, the same server takes it.
	small := topology.Options{MaxBytes: map[string]int64{}, BucketMaxBytes: map[string]int64{}}
	for _, s := range topology.Streams() {
		small.MaxBytes[s.Name] = 32 << 20
	}
	for _, b := range topology.Buckets() {
		small.BucketMaxBytes[b.Bucket] = 8 << 20
	}
	if err := topology.Apply(t.Context(), js, small); err != nil {
		t.Fatalf("Apply with smaller max_bytes: %v", err)
	}
}
