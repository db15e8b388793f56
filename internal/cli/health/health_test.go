package health

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/pkg/events"
)

func TestCLIHealth(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, time.Minute)
	now := time.Now()
	for _, h := range []events.Health{
		{At: events.At(now.Add(-10 * time.Minute)), Provider: "openai", State: events.HealthDegraded, Reason: "2 profiles failing"},
		{At: events.At(now.Add(-5 * time.Minute)), Provider: "openai", State: events.HealthOutage, Reason: "every profile down"},
		{At: events.At(now.Add(-2 * time.Minute)), Provider: "anthropic", State: events.HealthDegraded, Reason: "recovering"},
		{At: events.At(now.Add(-1 * time.Minute)), Provider: "openai", State: events.HealthRecovered, Reason: "3 successes over 2m"},
	} {
		data, hdr, err := events.Encode(&h)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.JS.PublishMsg(b.Ctx, &nats.Msg{Subject: events.HealthSubject(h.Provider), Header: hdr, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name  string
		args  []string
		code  int
		lines []string // the first two columns of each output line, in order
	}{
		{"every provider's latest state, sorted", nil, 0, []string{
			"PROVIDER STATE", "anthropic degraded", "openai recovered",
		}},
		{"asked providers, one never reported", []string{"openai", "mistral"}, 0, []string{
			"PROVIDER STATE", "openai recovered", "mistral healthy",
		}},
		{"check fails on a degraded provider", []string{"--check"}, 3, []string{"PROVIDER STATE", "anthropic degraded", "openai recovered"}},
		{"check passes on a recovered one", []string{"--check", "openai"}, 0, []string{"PROVIDER STATE", "openai recovered"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if code := run(append([]string{"--server", b.Srv.ClientURL()}, tt.args...), nil, &stdout, &stderr); code != tt.code {
				t.Fatalf("exit %d, want %d: %s", code, tt.code, stderr.String())
			}
			got := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			if len(got) != len(tt.lines) {
				t.Fatalf("%d lines, want %d:\n%s", len(got), len(tt.lines), stdout.String())
			}
			for i, want := range tt.lines {
				if f := strings.Fields(got[i]); len(f) < 2 || f[0]+" "+f[1] != want {
					t.Errorf("line %d %q does not start with %q", i+1, got[i], want)
				}
			}
		})
	}
	if !strings.Contains(runOut(t, b), "(1m ago)  3 successes over 2m") {
		t.Errorf("no age and reason:\n%s", runOut(t, b))
	}

	var stdout, stderr bytes.Buffer
	if code := run([]string{"--server", b.Srv.ClientURL(), "--json"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("--json: exit %d: %s", code, stderr.String())
	}
	var got []events.Health
	dec := json.NewDecoder(&stdout)
	for dec.More() {
		var h events.Health
		if err := dec.Decode(&h); err != nil {
			t.Fatal(err)
		}
		got = append(got, h)
	}
	if len(got) != 2 || got[0].Provider != "anthropic" || got[1].State != events.HealthRecovered || got[1].Reason != "3 successes over 2m" {
		t.Errorf("--json: %+v", got)
	}
}

func runOut(t *testing.T, b *bustest.Bus) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--server", b.Srv.ClientURL(), "openai"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	return stdout.String()
}

func TestCLIHealthEmptyAndMissing(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, time.Minute)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--server", b.Srv.ClientURL()}, nil, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "no health records") {
		t.Errorf("empty stream: exit %d, %q %q", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	if code := run([]string{"--server", "nats://127.0.0.1:1"}, nil, &stdout, &stderr); code != 1 {
		t.Errorf("no server: exit %d", code)
	}
}
