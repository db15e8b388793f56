package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/failbus/failbus/pkg/events"
)

func TestCLIDemo(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := run(nil, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("demo exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{
		"bus    ok ·",
		"bus    rate_limit · retryable",
		"provider asks to retry after 7s",
		"bus    server_error · retryable · rule gateway.",
		`overruled: the claim "context_overflow"`,
		"bus    context_overflow · not retryable",
		"bus    transport · retryable",
		"dead letter on failbus.dlq.classifier",
		"All 10 scenarios went as expected.",
		"7 release     4 held tasks released in submission order",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
}

// A scenario whose expectation fails makes the demo fail, and says which.
func TestCLIDemoReportsAFailedScenario(t *testing.T) {
	t.Parallel()
	wrong := demoScenario{
		title: "A success expected to be a rate limit",
		run: func(ctx context.Context, d *demo) error {
			return d.expectClass(ctx, &events.Outcome{ID: "x", Provider: "openai", OK: true, Status: 200}, events.ClassRateLimit, "")
		},
	}
	var out bytes.Buffer
	err := runScenarios(context.Background(), []demoScenario{demoScenarios[0], wrong}, zerolog.Nop(), &out)
	if err == nil || !strings.Contains(err.Error(), "1 of 2 scenarios") || !strings.Contains(out.String(), "✗ expected rate_limit") {
		t.Fatalf("err %v, output:\n%s", err, out.String())
	}
}

func TestCLIDescribeOutcome(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		o    events.Outcome
		want string
	}{
		{"describe an empty-body gateway 400 with tokens", events.Outcome{Provider: "gw", Model: "m", Status: 400, UpstreamCode: "X", RequestTokens: 41000, ContextWindow: 256000},
			"gw/m  status 400  upstream_code X  41k of 256k tokens  empty body"},
		{"describe a transport error", events.Outcome{Provider: "p", Model: "m", TransportError: "ECONNRESET"},
			`p/m  no response  error "ECONNRESET"`},
		{"describe headers in order and a long body", events.Outcome{Provider: "p", Model: "m", Status: 429, Headers: map[string]string{"x-b": "2", "retry-after": "1"}, Body: strings.Repeat("a", 100)},
			"p/m  status 429  retry-after: 1  x-b: 2  body " + strings.Repeat("a", 57) + "..."},
	}
	for _, tt := range tests {
		if got := describeOutcome(&tt.o); got != tt.want {
			t.Errorf("%s:\n got %q\nwant %q", tt.name, got, tt.want)
		}
	}
	if got := kTokens(130900); got != "130.9k" {
		t.Errorf("kTokens(130900) = %s", got)
	}
}
