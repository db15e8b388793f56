// Package sinktest is the conformance suite every notification sink passes
// (after Watermill's pubsub test suite): one set of behaviours —
// delivery with every field intact, failures classified and carrying the
// receiver's answer, contexts honoured, concurrent use, a stable
// idempotency key where the sink claims one — checked against a real
// receiver (an httptest server, an in-process SMTP server) rather than a
// mock of the sink.
//
// A new sink gets a Harness: how to start its receiver and build the sink
// pointed at it, and how to read back what the receiver got. Then
//
//	func TestMySinkConformance(t *testing.T) { sinktest.Run(t, myHarness) }
package sinktest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/notify"
)

// Failure is how a receiver answers.
type Failure int

// Receiver behaviours.
const (
	// Accept: the receiver takes every request.
	Accept Failure = iota
	// Temporary: the receiver says "try later" (HTTP 503, SMTP 451).
	Temporary
	// Permanent: the receiver rejects the request (HTTP 400, SMTP 550).
	Permanent
	// Hang: the receiver reads the request and never answers.
	Hang
)

// Received is what a receiver got, decoded from the sink's wire format.
type Received struct {
	// Text is everything a human would read (title, text, labels), as
	// plain text: escaping and transfer encodings undone.
	Text string
	// Severity is the failbus severity the receiver can tell, mapped back
	// from the format's own scale; "" when the format does not carry one.
	Severity string
	// DedupeKey is the dedupe key when the format carries it, else "".
	DedupeKey string
	// IdempotencyKey is what the receiver would deduplicate on, when the
	// format carries one, else "".
	IdempotencyKey string
}

// Endpoint is a running receiver and the sink pointed at it.
type Endpoint struct {
	// Sink is the sink under test.
	Sink notify.Sink
	// SetFailure changes how the receiver answers from now on. nil when
	// the receiver cannot fail (the log sink): failure cases are skipped.
	SetFailure func(Failure)
	// Received returns what the receiver accepted so far, in order.
	Received func() []Received
	// Hung receives a value each time the receiver starts hanging on a
	// request (SetFailure(Hang)).
	Hung <-chan struct{}
	// TemporaryAnswer and PermanentAnswer are words of the receiver's
	// failure answers; a SinkError's Answer must contain them.
	TemporaryAnswer, PermanentAnswer string
}

// Harness starts a receiver and a sink for one test.
type Harness struct {
	// Name names the sink type in subtests.
	Name string
	// Start starts a fresh receiver and sink; both end with the test.
	Start func(t testing.TB) *Endpoint
}

// wait bounds how long the suite waits for a Send that should return; it
// is a safety net against a hanging sink, not a performance threshold.
const wait = 30 * time.Second

// Run runs the suite against h.
func Run(t *testing.T, h Harness) {
	t.Helper()
	cases := []struct {
		name string
		run  func(t *testing.T, ep *Endpoint)
	}{
		{"delivers one notification with its title, text and labels", deliversOne},
		{"keeps unicode, markup characters and awkward lines intact", keepsText},
		{"maps every severity", mapsSeverities},
		{"is safe for concurrent use", concurrent},
		{"carries a stable idempotency key when it claims to be idempotent", idempotencyKey},
		{"reports a temporary failure with the receiver's answer, then recovers", temporaryFailure},
		{"reports a permanent failure with the receiver's answer", permanentFailure},
		{"returns when its context ends while the receiver hangs", honoursContext},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ep := h.Start(t)
			if name := ep.Sink.Name(); name == "" || name != ep.Sink.Name() {
				t.Fatalf("Name() = %q: must be non-empty and stable", ep.Sink.Name())
			}
			c.run(t, ep)
		})
	}
}

// Sample is the notification the suite sends, with a distinguishing
// suffix on its dedupe key.
func Sample(suffix string) events.Notification {
	return events.Notification{
		DedupeKey: "provider-outage:openai:" + suffix,
		Severity:  events.SeverityNormal,
		Title:     "Provider openai is down",
		Text:      "fetch failed on every auth profile\nsince 10:42 UTC; waiting, not switching models",
		Labels:    map[string]string{"provider": "openai", "scope": "provider"},
		At:        events.At(time.Date(2026, 1, 2, 10, 42, 0, 0, time.UTC)),
	}
}

func send(t *testing.T, s notify.Sink, d notify.Delivery) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return s.Send(ctx, d)
}

func deliversOne(t *testing.T, ep *Endpoint) {
	n := Sample("one")
	if err := send(t, ep.Sink, notify.Delivery{Notification: n, IdempotencyKey: "gen-one", Attempt: 1}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	got := ep.Received()
	if len(got) != 1 {
		t.Fatalf("receiver got %d requests, want 1", len(got))
	}
	r := got[0]
	for _, want := range []string{n.Title, "fetch failed on every auth profile", "since 10:42 UTC; waiting, not switching models", "openai"} {
		if !strings.Contains(r.Text, want) {
			t.Errorf("receiver text %q lacks %q", r.Text, want)
		}
	}
	if r.Severity != "" && r.Severity != n.Severity {
		t.Errorf("severity = %q, want %q", r.Severity, n.Severity)
	}
	if r.DedupeKey != "" && r.DedupeKey != n.DedupeKey {
		t.Errorf("dedupe key = %q, want %q", r.DedupeKey, n.DedupeKey)
	}
}

func keepsText(t *testing.T, ep *Endpoint) {
	n := Sample("text")
	n.Title = "断了的电话线 — provider ✗ & <gateway>"
	long := strings.Repeat("0123456789", 100)
	n.Text = "first line\n.\n..leading dots\nFrom the gateway: a < b && c > d\n" + long + "\nдо свидания"
	if err := send(t, ep.Sink, notify.Delivery{Notification: n, IdempotencyKey: "gen-text", Attempt: 1}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	got := ep.Received()
	if len(got) != 1 {
		t.Fatalf("receiver got %d requests, want 1", len(got))
	}
	for _, want := range []string{n.Title, "\n.\n", "\n..leading dots\n", "From the gateway: a < b && c > d", long, "до свидания"} {
		if !strings.Contains(got[0].Text, want) {
			t.Errorf("receiver text lacks %q:\n%s", want, got[0].Text)
		}
	}
}

func mapsSeverities(t *testing.T, ep *Endpoint) {
	sevs := []string{events.SeverityInfo, events.SeverityNormal, events.SeverityCritical}
	for i, sev := range sevs {
		n := Sample("sev-" + sev)
		n.Severity = sev
		if err := send(t, ep.Sink, notify.Delivery{Notification: n, IdempotencyKey: fmt.Sprintf("gen-sev-%d", i), Attempt: 1}); err != nil {
			t.Fatalf("Send %s: %v", sev, err)
		}
	}
	got := ep.Received()
	if len(got) != len(sevs) {
		t.Fatalf("receiver got %d requests, want %d", len(got), len(sevs))
	}
	for i, r := range got {
		if r.Severity != "" && r.Severity != sevs[i] {
			t.Errorf("request %d: severity %q, want %q", i, r.Severity, sevs[i])
		}
	}
}

func concurrent(t *testing.T, ep *Endpoint) {
	const k = 16
	var wg sync.WaitGroup
	errs := make(chan error, k)
	for i := range k {
		wg.Go(func() {
			n := Sample(fmt.Sprintf("concurrent-%02d", i))
			n.Title = fmt.Sprintf("concurrent %02d", i)
			errs <- send(t, ep.Sink, notify.Delivery{Notification: n, IdempotencyKey: fmt.Sprintf("gen-c-%02d", i), Attempt: 1})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Send: %v", err)
		}
	}
	got := ep.Received()
	if len(got) != k {
		t.Fatalf("receiver got %d requests, want %d", len(got), k)
	}
	seen := map[string]bool{}
	for _, r := range got {
		for i := range k {
			if strings.Contains(r.Text, fmt.Sprintf("concurrent %02d", i)) {
				seen[fmt.Sprint(i)] = true
			}
		}
	}
	if len(seen) != k {
		t.Errorf("receiver got %d distinct notifications, want %d", len(seen), k)
	}
}

func idempotencyKey(t *testing.T, ep *Endpoint) {
	if !idempotent(ep.Sink) {
		t.Skip("sink does not claim to be idempotent")
	}
	d := notify.Delivery{Notification: Sample("idem"), IdempotencyKey: "gen-idem", Attempt: 1}
	for attempt := 1; attempt <= 2; attempt++ {
		d.Attempt = attempt
		if err := send(t, ep.Sink, d); err != nil {
			t.Fatalf("Send attempt %d: %v", attempt, err)
		}
	}
	got := ep.Received()
	if len(got) != 2 {
		t.Fatalf("receiver got %d requests, want 2 (deduplicating is the receiver's job)", len(got))
	}
	if got[0].IdempotencyKey == "" || got[0].IdempotencyKey != got[1].IdempotencyKey {
		t.Errorf("idempotency keys %q and %q: want the same non-empty key for both attempts", got[0].IdempotencyKey, got[1].IdempotencyKey)
	}
}

func temporaryFailure(t *testing.T, ep *Endpoint) {
	if ep.SetFailure == nil {
		t.Skip("receiver cannot fail")
	}
	ep.SetFailure(Temporary)
	err := send(t, ep.Sink, notify.Delivery{Notification: Sample("temp"), IdempotencyKey: "gen-temp", Attempt: 1})
	se := mustSinkError(t, ep, err)
	if se.Permanent {
		t.Errorf("temporary failure reported as permanent: %v", se)
	}
	if !strings.Contains(se.Answer, ep.TemporaryAnswer) {
		t.Errorf("answer %q lacks the receiver's %q", se.Answer, ep.TemporaryAnswer)
	}
	if n := len(ep.Received()); n != 0 {
		t.Errorf("receiver accepted %d requests while failing", n)
	}
	ep.SetFailure(Accept)
	if err := send(t, ep.Sink, notify.Delivery{Notification: Sample("temp"), IdempotencyKey: "gen-temp", Attempt: 2}); err != nil {
		t.Fatalf("Send after recovery: %v", err)
	}
	if n := len(ep.Received()); n != 1 {
		t.Errorf("receiver got %d requests after recovery, want 1", n)
	}
}

func permanentFailure(t *testing.T, ep *Endpoint) {
	if ep.SetFailure == nil {
		t.Skip("receiver cannot fail")
	}
	ep.SetFailure(Permanent)
	err := send(t, ep.Sink, notify.Delivery{Notification: Sample("perm"), IdempotencyKey: "gen-perm", Attempt: 1})
	se := mustSinkError(t, ep, err)
	if !se.Permanent {
		t.Errorf("permanent failure reported as temporary: %v", se)
	}
	if !strings.Contains(se.Answer, ep.PermanentAnswer) {
		t.Errorf("answer %q lacks the receiver's %q", se.Answer, ep.PermanentAnswer)
	}
}

func honoursContext(t *testing.T, ep *Endpoint) {
	if ep.SetFailure == nil {
		t.Skip("receiver cannot fail")
	}
	ep.SetFailure(Hang)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- ep.Sink.Send(ctx, notify.Delivery{Notification: Sample("hang"), IdempotencyKey: "gen-hang", Attempt: 1})
	}()
	select {
	case <-ep.Hung:
	case err := <-done:
		t.Fatalf("Send returned %v before the receiver had the request", err)
	case <-time.After(wait):
		t.Fatal("the receiver never got the request")
	}
	cancel()
	select {
	case err := <-done:
		se := mustSinkError(t, ep, err)
		if se.Permanent {
			t.Errorf("a cancelled send is not a permanent failure: %v", se)
		}
	case <-time.After(wait):
		t.Fatal("Send did not return after its context was cancelled")
	}
}

func mustSinkError(t *testing.T, ep *Endpoint, err error) *notify.SinkError {
	t.Helper()
	if err == nil {
		t.Fatal("Send returned nil, want an error")
	}
	var se *notify.SinkError
	if !errors.As(err, &se) {
		t.Fatalf("Send returned %T %v, want a *notify.SinkError", err, err)
	}
	if se.Sink != ep.Sink.Name() {
		t.Errorf("SinkError.Sink = %q, want %q", se.Sink, ep.Sink.Name())
	}
	return se
}

// idempotent reports whether s declares that its receiver deduplicates
// (notify.Idempotent).
func idempotent(s notify.Sink) bool {
	i, ok := s.(notify.Idempotent)
	return ok && i.Idempotent()
}
