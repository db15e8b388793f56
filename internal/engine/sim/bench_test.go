package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// BenchmarkSimulate steps simulate over a mix of outcomes — successes,
// rate limits with hints, server errors, network failures, refusals —
// from 200 agents on 8 providers, one second apart: what a shadow replay
// of history costs per outcome (100k outcomes should take seconds).
func BenchmarkSimulate(b *testing.B) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mk := func(i int) *events.Outcome {
		o := &events.Outcome{
			ID: fmt.Sprintf("o%d", i), At: events.At(base.Add(time.Duration(i) * time.Second)),
			Agent: fmt.Sprintf("a%d", i%200), Session: fmt.Sprintf("s%d", i%200), Turn: i / 200, Step: 1,
			Provider: fmt.Sprintf("p%d", i%8), Profile: fmt.Sprintf("k%d", i%3), Model: "m",
		}
		switch i % 10 {
		case 0, 1, 2, 3, 4:
			o.OK, o.Status = true, 200
		case 5:
			o.Status, o.Headers = 429, map[string]string{"retry-after": "2"}
			o.Body = `{"error":{"type":"rate_limit_error","message":"rate limited"}}`
		case 6:
			o.Status, o.Body = 503, "upstream connect error or disconnect/reset before headers"
		case 7:
			o.TransportError = "read ECONNRESET"
		case 8:
			o.OK, o.Status, o.StopReason, o.RefusalScope = true, 200, "refusal", "history"
		case 9:
			o.Status, o.Body = 401, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}`
		}
		return o
	}
	s, err := New(Config{Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		o := mk(i)
		if out := s.Step(Input{Type: InputOutcome, At: o.At, Outcome: o}); len(out) == 0 {
			b.Fatal("no output")
		}
	}
}
