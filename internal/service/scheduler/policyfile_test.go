package scheduler

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
)

// TestPolicyFileChangesSettleBeforeTheyCount drives the looks at the policy
// file by hand (no poll goroutine, no clock): a half-written file, a file
// rewritten back before it settled and a file missing for one look never
// replace the policy; a change that two looks agree on does.
func TestPolicyFileChangesSettleBeforeTheyCount(t *testing.T) {
	t.Parallel()
	srv := embedded.StartTest(t)
	js, err := jetstream.New(embedded.ConnectTest(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := topology.Apply(ctx, js, topology.Options{}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "policy.yaml")
	write := func(doc string) func() {
		return func() {
			if err := os.WriteFile(path, []byte(doc), 0o644); err != nil { // in place, as a torn write leaves it
				t.Fatal(err)
			}
		}
	}
	write("retry:\n  max_retries: 1\n")()
	reg := prometheus.NewRegistry()
	opts := Config{PolicyFile: path}
	opts.Runner.Registerer = reg
	s, err := New(js, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.checkPolicyFile(ctx, true); err != nil {
		t.Fatal(err)
	}
	remove := func() {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
	touch := func() {
		earlier := time.Now().Add(-time.Hour)
		if err := os.Chtimes(path, earlier, earlier); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name             string
		change           func() // nil: just look
		maxRetries       int    // in force after the look
		valid            float64
		applied, rejects float64
	}{
		{"start", nil, 1, 1, 0, 0},
		{"truncated in place: empty, the default policy if it counted", write(""), 1, 1, 0, 0},
		{"written in full before the next look", write("retry:\n  max_retries: 3\n"), 1, 1, 0, 0},
		{"the next look agrees", nil, 3, 1, 1, 0},
		{"half written: not YAML", write("retry: [\n"), 3, 1, 1, 0},
		{"rewritten back before it settled", write("retry:\n  max_retries: 3\n"), 3, 1, 1, 0},
		{"nothing left to settle", nil, 3, 1, 1, 0},
		{"removed", remove, 3, 1, 1, 0},
		{"still missing: rejected", nil, 3, 0, 1, 1},
		{"still missing: reported once", nil, 3, 0, 1, 1},
		{"back with the same content", write("retry:\n  max_retries: 3\n"), 3, 0, 1, 1},
		{"settled: valid again", nil, 3, 1, 2, 1},
		{"touched: the same content", touch, 3, 1, 2, 1},
		{"touched: still nothing", nil, 3, 1, 2, 1},
		{"invalid", write("retry:\n  max_retrys: 9\n"), 3, 1, 2, 1},
		{"invalid, settled: rejected", nil, 3, 0, 2, 2},
		{"invalid, unchanged", nil, 3, 0, 2, 2},
	}
	for _, st := range steps {
		if st.change != nil {
			st.change()
		}
		if st.name != "start" {
			if err := s.checkPolicyFile(ctx, false); err != nil {
				t.Fatalf("%s: look: %v", st.name, err)
			}
		}
		if got := s.Policy().Retry.MaxRetries; got != st.maxRetries {
			t.Errorf("%s: max_retries %d in force, want %d", st.name, got, st.maxRetries)
		}
		applied, rejected, valid := fileMetrics(t, reg)
		if applied != st.applied || rejected != st.rejects || valid != st.valid {
			t.Errorf("%s: file applied %v, rejected %v, valid %v; want %v, %v, %v",
				st.name, applied, rejected, valid, st.applied, st.rejects, st.valid)
		}
	}
}

// fileMetrics reads the policy file's reload counters and validity gauge.
func fileMetrics(t *testing.T, reg *prometheus.Registry) (applied, rejected, valid float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "failbus_scheduler_policy_file_valid":
			valid = mf.GetMetric()[0].GetGauge().GetValue()
		case "failbus_scheduler_policy_reloads_total":
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["source"] != reloadFile {
					continue
				}
				switch labels["result"] {
				case PolicyApplied:
					applied = m.GetCounter().GetValue()
				case PolicyRejected:
					rejected = m.GetCounter().GetValue()
				}
			}
		}
	}
	return applied, rejected, valid
}
