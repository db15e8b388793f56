package recovery_test

import (
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/recovery"
)

func TestConfigValidateNamesTheKey(t *testing.T) {
	ok := recovery.DefaultConfig()
	if err := ok.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, c := range []struct {
		name string
		edit func(*recovery.Config)
		key  string
	}{
		{"negative stale_after", func(c *recovery.Config) { c.StaleAfter = -time.Second }, "recovery.stale_after"},
		{"no catch-up window", func(c *recovery.Config) { c.CatchupWindow = 0 }, "recovery.catchup_window"},
		{"no catch-up runs", func(c *recovery.Config) { c.MaxCatchupRuns = 0 }, "recovery.max_catchup_runs"},
		{"drain rate 0", func(c *recovery.Config) { c.DrainRate = 0 }, "recovery.drain_rate"},
		{"probe every 10ms", func(c *recovery.Config) { c.ProbeInterval = 10 * time.Millisecond }, "recovery.probe_interval"},
		{"probe without url", func(c *recovery.Config) { c.Probes = map[string]recovery.HTTPProbe{"openai": {}} }, "recovery.probes.openai.url"},
		{"probe url not http", func(c *recovery.Config) {
			c.Probes = map[string]recovery.HTTPProbe{"openai": {URL: "ftp://x"}}
		}, "recovery.probes.openai.url"},
		{"probe status 42", func(c *recovery.Config) {
			c.Probes = map[string]recovery.HTTPProbe{"openai": {URL: "https://x", ExpectStatus: 42}}
		}, "recovery.probes.openai.expect_status"},
		{"probe header from nowhere", func(c *recovery.Config) {
			c.Probes = map[string]recovery.HTTPProbe{"openai": {URL: "https://x", HeadersEnv: map[string]string{"Authorization": ""}}}
		}, "recovery.probes.openai.headers_env.Authorization"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := recovery.DefaultConfig()
			c.edit(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), c.key) {
				t.Fatalf("Validate() = %v, want an error naming %s", err, c.key)
			}
		})
	}
}
