// Package traces_test checks that one LLM call is one trace across the
// whole bus: the agent's Call, the classifier, the scheduler, the due
// retry and the next attempt. Its own package, because it installs a
// global TracerProvider that no other test may share.
package traces_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/tracing"
	"github.com/failbus/failbus/pkg/agent"
)

// TestRateLimitedCallRetriedIsOneTrace: a Call whose first attempt gets a
// 429 and whose second succeeds, on a real bus with every service, is one
// trace, and each hop is the child of the one before it: the call, its
// attempts, each outcome's send, the classifier's and the scheduler's
// processing, the decision and the due retry the agent received.
func TestRateLimitedCallRetriedIsOneTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	before := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		otel.SetTracerProvider(before)
		_ = tp.Shutdown(context.Background())
	})
	if !tracing.Enabled() {
		t.Fatal("tracing.Enabled is false with an SDK provider installed")
	}

	bus, err := devbus.Start(devbus.Options{Server: embedded.Options{Dir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	nc, err := bus.Srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ag, err := agent.New(nc, "tracer")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	req := agent.Request{Provider: "openai", Model: "gpt-4o", Profile: "p1", Turn: 1, Step: 1}
	answer, trail, err := agent.Call(ctx, ag, req, func(_ context.Context, at *agent.Attempt) (string, error) {
		if at.N == 1 {
			return "", &agent.HTTPError{Status: 429, Body: `{"error":"rate limited"}`, Headers: map[string]string{"retry-after-ms": "300"}}
		}
		return "hello", nil
	})
	if err != nil || answer != "hello" || len(trail) != 2 {
		t.Fatalf("Call = %q, %d attempts, %v; want hello after 2 attempts", answer, len(trail), err)
	}
	if d := trail[0].Decision; d == nil || d.Action != "retry" {
		t.Fatalf("first attempt decided %+v, want retry", trail[0].Decision)
	}
	first, second := trail[0].Outcome.ID, trail[1].Outcome.ID

	// The classifier and scheduler handle the success after Call
	// returned: wait for the classifier's span of it and the scheduler's.
	var spans tracetest.SpanStubs
	deadline := time.Now().Add(30 * time.Second)
	for {
		spans = exp.GetSpans()
		if len(find(spans, "process failbus.outcome.{provider}.{agent}", second)) == 1 &&
			len(findGroup(spans, "process failbus.classified.{provider}.{class}", "scheduler")) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the success's classification and decision spans did not arrive; spans:\n%s", names(spans))
		}
		time.Sleep(20 * time.Millisecond)
	}

	root := one(t, spans, "call", func(s tracetest.SpanStub) bool {
		return s.Name == "chat gpt-4o" && s.SpanKind == trace.SpanKindInternal
	})
	tid := root.SpanContext.TraceID()
	if root.Parent.IsValid() {
		t.Errorf("the call's span has a parent %s: a call starts its trace", root.Parent.SpanID())
	}
	traces := map[trace.TraceID]bool{}
	for _, s := range spans {
		traces[s.SpanContext.TraceID()] = true
	}
	if len(traces) != 1 {
		t.Errorf("%d traces, want 1 for the whole call:\n%s", len(traces), names(spans))
	}

	attempts := map[int]tracetest.SpanStub{}
	for _, s := range spans {
		if s.Name == "chat gpt-4o" && s.SpanKind == trace.SpanKindClient {
			attempts[int(attr(s, "failbus.attempt").AsInt64())] = s
		}
	}
	if len(attempts) != 2 {
		t.Fatalf("%d attempt spans, want 2:\n%s", len(attempts), names(spans))
	}
	for n, s := range attempts {
		childOf(t, s, root, "attempt")
		if n == 1 && attr(s, "error.type").AsString() != "429" {
			t.Errorf("attempt 1 error.type %q, want 429", attr(s, "error.type").AsString())
		}
	}
	for i, id := range []string{first, second} {
		send := oneOf(t, find(spans, "send failbus.outcome.{provider}.{agent}", id), "send of outcome "+id)
		childOf(t, send, attempts[i+1], "outcome send")
		classify := oneOf(t, find(spans, "process failbus.outcome.{provider}.{agent}", id), "classification of "+id)
		childOf(t, classify, send, "classifier")
		if g := attr(classify, "messaging.consumer.group.name").AsString(); g != "classifier" {
			t.Errorf("the outcome was processed by %q, want the classifier", g)
		}
	}
	classify1 := oneOf(t, find(spans, "process failbus.outcome.{provider}.{agent}", first), "classification")
	var decide tracetest.SpanStub
	for _, s := range findGroup(spans, "process failbus.classified.{provider}.{class}", "scheduler") {
		if s.Parent.SpanID() == classify1.SpanContext.SpanID() {
			decide = s
		}
	}
	if !decide.SpanContext.IsValid() {
		t.Fatalf("no scheduler span is the child of the first classification:\n%s", names(spans))
	}
	for _, name := range []string{"process failbus.decision.{agent}", "process failbus.retry.due.{agent}"} {
		s := one(t, spans, name, func(s tracetest.SpanStub) bool { return s.Name == name })
		childOf(t, s, decide, name)
	}
	if s := attempts[2]; !s.StartTime.After(one(t, spans, "due retry", func(s tracetest.SpanStub) bool { return s.Name == "process failbus.retry.due.{agent}" }).StartTime) {
		t.Error("the second attempt started before its due retry was received")
	}
	for _, s := range spans {
		if s.SpanContext.TraceID() != tid {
			continue
		}
		if strings.HasPrefix(s.Name, "process ") && attr(s, "messaging.system").AsString() != "nats" {
			t.Errorf("%s: messaging.system %q, want nats", s.Name, attr(s, "messaging.system").AsString())
		}
	}
}

func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// find returns the spans called name about message id.
func find(spans tracetest.SpanStubs, name, id string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name && attr(s, "messaging.message.id").AsString() == id {
			out = append(out, s)
		}
	}
	return out
}

// findGroup returns the spans called name of consumer group.
func findGroup(spans tracetest.SpanStubs, name, group string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name && attr(s, "messaging.consumer.group.name").AsString() == group {
			out = append(out, s)
		}
	}
	return out
}

func one(t *testing.T, spans tracetest.SpanStubs, what string, match func(tracetest.SpanStub) bool) tracetest.SpanStub {
	t.Helper()
	var out []tracetest.SpanStub
	for _, s := range spans {
		if match(s) {
			out = append(out, s)
		}
	}
	return oneOf(t, out, what)
}

func oneOf(t *testing.T, spans []tracetest.SpanStub, what string) tracetest.SpanStub {
	t.Helper()
	if len(spans) != 1 {
		t.Fatalf("%d spans for the %s, want 1", len(spans), what)
	}
	return spans[0]
}

func childOf(t *testing.T, child, parent tracetest.SpanStub, what string) {
	t.Helper()
	if child.Parent.SpanID() != parent.SpanContext.SpanID() || child.SpanContext.TraceID() != parent.SpanContext.TraceID() {
		t.Errorf("%s (%s) is not the child of %s", what, child.Name, parent.Name)
	}
}

func names(spans tracetest.SpanStubs) string {
	var lines []string
	for _, s := range spans {
		lines = append(lines, s.SpanContext.TraceID().String()[:8]+" "+s.SpanContext.SpanID().String()[:8]+" <- "+s.Parent.SpanID().String()[:8]+" "+s.Name+" "+attr(s, "messaging.consumer.group.name").AsString())
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
