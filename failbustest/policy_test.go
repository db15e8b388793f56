package failbustest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/pkg/policy"
)

// A test's policy lays over ShortTimes key by key; WithProductTimes keeps
// the product's times; a policy the product refuses is refused with the
// product's message, naming the test's own line.
func TestPolicyOptions(t *testing.T) {
	def := policy.Default()
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte("scope:\n  outage_min_failures: 5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		opts  []Option
		check func(*policy.Policy) string
		err   string
	}{
		{"short times by default", nil, func(p *policy.Policy) string {
			if p.Retry.InitialDelay != 10*time.Millisecond || p.Scope.RecoveryMinTime != 200*time.Millisecond ||
				p.Recovery.ProbeInterval != 100*time.Millisecond || p.Retry.MaxDelay != def.Retry.MaxDelay {
				return "not ShortTimes on the defaults"
			}
			return ""
		}, ""},
		{"own keys over short times", []Option{WithPolicy("retry:\n  max_retries: 1\nscope:\n  recovery_min_time: 1s\n")}, func(p *policy.Policy) string {
			if p.Retry.MaxRetries != 1 || p.Retry.InitialDelay != 10*time.Millisecond ||
				p.Scope.RecoveryMinTime != time.Second || p.Recovery.ProbeInterval != 100*time.Millisecond {
				return "the test's keys did not lay over ShortTimes key by key"
			}
			return ""
		}, ""},
		{"a policy file", []Option{WithPolicyFile(file)}, func(p *policy.Policy) string {
			if p.Scope.OutageMinFailures != 5 || p.Retry.InitialDelay != 10*time.Millisecond {
				return "the file's key is not read over ShortTimes"
			}
			return ""
		}, ""},
		{"product times", []Option{WithProductTimes(), WithPolicy("retry: {max_retries: 1}")}, func(p *policy.Policy) string {
			if p.Retry.MaxRetries != 1 || p.Retry.InitialDelay != def.Retry.InitialDelay || p.Scope.RecoveryMinTime != def.Scope.RecoveryMinTime {
				return "not the product's times"
			}
			return ""
		}, ""},
		{"an unknown key", []Option{WithPolicy("retry:\n  max_retrys: 1\n")}, nil, "max_retrys"},
		{"a missing file", []Option{WithPolicyFile(filepath.Join(t.TempDir(), "none.yaml"))}, nil, "none.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config{}
			for _, o := range tt.opts {
				o(&c)
			}
			p, err := buildPolicy(c)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one naming %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if msg := tt.check(p); msg != "" {
				t.Errorf("%s: %+v", msg, p)
			}
		})
	}
}
