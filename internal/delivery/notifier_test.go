package delivery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/delivery"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/notify"
)

func TestDedupeAcrossRequestsAndRedeliveries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		requests  []string // request ids, all with the same dedupe key
		wantKinds map[string]int
	}{
		{"one request is sent once", []string{"r1"}, map[string]int{delivery.AuditSent: 1}},
		{"a repeat with another request id is deduplicated", []string{"r1", "r2"}, map[string]int{delivery.AuditSent: 1, delivery.AuditDeduped: 1}},
		{"a redelivery of the sending request only repeats its audit record", []string{"r1", "r1"}, map[string]int{delivery.AuditSent: 1}},
		{"three repeats and a redelivery", []string{"r1", "r2", "r1", "r3", "r4"}, map[string]int{delivery.AuditSent: 1, delivery.AuditDeduped: 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			sink := newRecSink("hook", false)
			n := b.notifier(t, delivery.Config{Routes: []delivery.Route{{Sink: sink}}})
			for _, id := range tc.requests {
				if res := process(t, n, id, note("provider-refusal:s#1:0:openai", events.SeverityNormal)); res.Action != delivery.Ack {
					t.Fatalf("request %s: %+v, want ack", id, res)
				}
			}
			if got := len(sink.deliveries()); got != 1 {
				t.Errorf("deliveries = %d, want 1", got)
			}
			got := kinds(b.audits(t))
			for k, want := range tc.wantKinds {
				if got[k] != want {
					t.Errorf("audit %s = %d, want %d (all: %v)", k, got[k], want, got)
				}
			}
		})
	}
}

func TestConcurrentReplicasSendEachKeyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	idem, plain := newRecSink("idem", true), newRecSink("plain", false)
	routes := []delivery.Route{{Sink: idem}, {Sink: plain}}
	replicas := []*delivery.Notifier{
		b.notifier(t, delivery.Config{Routes: routes, Replica: "a"}),
		b.notifier(t, delivery.Config{Routes: routes, Replica: "b"}),
	}
	const keys, repeats = 20, 6
	var wg sync.WaitGroup
	for i := range keys * repeats {
		wg.Go(func() {
			n := replicas[i%2]
			key := fmt.Sprintf("k-%d", i%keys)
			for {
				res, err := n.Process(context.Background(), delivery.Request{ID: reqID(i), Notification: note(key, events.SeverityNormal)})
				if err != nil {
					t.Errorf("Process: %v", err)
					return
				}
				if res.Action == delivery.Ack {
					return
				}
				// A lost compare-and-set race: try again at once (the
				// clock is manual, so no lease runs out meanwhile).
			}
		})
	}
	wg.Wait()
	for _, s := range []*recSink{idem, plain} {
		per := s.perKey()
		if len(per) != keys {
			t.Errorf("%s: %d keys delivered, want %d", s.name, len(per), keys)
		}
		for k, c := range per {
			if c != 1 {
				t.Errorf("%s: key %s delivered %d times", s.name, k, c)
			}
		}
	}
	if plain.maxInflight > delivery.DefaultMaxUnconfirmed {
		t.Errorf("non-idempotent sink had %d sends in flight, want at most %d", plain.maxInflight, delivery.DefaultMaxUnconfirmed)
	}
}

// A replica that claimed a key and died before recording the send leaves
// the claim behind. After its lease, a request for the key takes the claim
// over and sends with the same idempotency key.
func TestTakeoverAfterCrashKeepsIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sink := newRecSink("idem", true)
	sink.gate = make(chan struct{}) // never opened: the send hangs
	dead := b.notifier(t, delivery.Config{Routes: []delivery.Route{{Sink: sink, Timeout: time.Second}}, Replica: "dead", ClaimLease: 5 * time.Second})

	// The "dead" replica claims and hangs in Send until its context ends:
	// its claim stays behind with a lease, as after a crash.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = dead.Process(ctx, delivery.Request{ID: "r1", Notification: note("k", events.SeverityCritical)})
	}()
	waitFor(t, "the claim", func() bool { return ledgerState(t, b, "k").State == delivery.LedgerClaimed })
	gen := ledgerState(t, b, "k").Generation
	cancel()
	<-done
	sink.mu.Lock()
	sink.gate = nil
	sink.mu.Unlock()

	live := b.notifier(t, delivery.Config{Routes: []delivery.Route{{Sink: sink, Timeout: time.Second}}, Replica: "live", ClaimLease: 5 * time.Second})
	// The dead replica's Process released the key as pending after its
	// cancelled send; put it back to "claimed" to model a hard crash.
	forceEntry(t, b, "k", func(e *delivery.LedgerEntry) {
		e.State, e.Owner, e.Until = delivery.LedgerClaimed, "dead", b.clock.Now().Add(5*time.Second)
	})

	// Within the lease: another request defers to the claim.
	if res := process(t, live, "r2", note("k", events.SeverityCritical)); res.Action != delivery.Ack || res.Kind != delivery.AuditDeduped {
		t.Fatalf("within the lease: %+v, want deduped", res)
	}
	// The redelivered request itself waits for the lease.
	if res := process(t, live, "r1", note("k", events.SeverityCritical)); res.Action != delivery.Retry {
		t.Fatalf("redelivery within the lease: %+v, want retry", res)
	}
	b.clock.Advance(6 * time.Second)
	if res := process(t, live, "r1", note("k", events.SeverityCritical)); res.Action != delivery.Ack || res.Kind != delivery.AuditSent {
		t.Fatalf("after the lease: %+v, want sent", res)
	}
	got := sink.deliveries()
	if len(got) != 1 || got[0].IdempotencyKey != gen {
		t.Fatalf("deliveries %+v, want one with the claim's idempotency key %s", got, gen)
	}
}

func TestDedupeLifetime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sink := newRecSink("idem", true)
	n := b.notifier(t, delivery.Config{Routes: []delivery.Route{{Sink: sink}}, DedupeLifetime: time.Hour})
	process(t, n, "r1", note("k", events.SeverityNormal))
	b.clock.Advance(59 * time.Minute)
	if res := process(t, n, "r2", note("k", events.SeverityNormal)); res.Kind != delivery.AuditDeduped {
		t.Fatalf("within the lifetime: %+v, want deduped", res)
	}
	b.clock.Advance(2 * time.Minute)
	if res := process(t, n, "r3", note("k", events.SeverityNormal)); res.Kind != delivery.AuditSent {
		t.Fatalf("after the lifetime: %+v, want sent", res)
	}
	got := sink.deliveries()
	if len(got) != 2 || got[0].IdempotencyKey == got[1].IdempotencyKey {
		t.Fatalf("deliveries %+v: want two, with different idempotency keys", got)
	}
}

func TestDedupeLifetimeBeyondBucketTTLIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := delivery.New(context.Background(), delivery.Config{JetStream: b.js, Routes: []delivery.Route{{Sink: newRecSink("x", false)}},
		DedupeLifetime: 30 * 24 * time.Hour})
	if err == nil || !strings.Contains(err.Error(), "TTL") {
		t.Fatalf("New = %v, want an error about the bucket TTL", err)
	}
}

func TestDailyBudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sink := newRecSink("hook", false)
	routes := []delivery.Route{{Sink: sink}}
	n := b.notifier(t, delivery.Config{Routes: routes, DailyBudget: 3})
	for i := range 4 {
		process(t, n, reqID(i), note(fmt.Sprintf("normal-%d", i), events.SeverityNormal))
	}
	process(t, n, "crit", note("critical-0", events.SeverityCritical))
	// A restart keeps the count.
	n = b.notifier(t, delivery.Config{Routes: routes, DailyBudget: 3})
	process(t, n, reqID(10), note("info-0", events.SeverityInfo))
	process(t, n, reqID(11), note("normal-3", events.SeverityNormal)) // repeat of a held key: not counted twice

	per := sink.perKey()
	if len(per) != 4 || per["critical-0"] != 1 || per["normal-3"] != 0 || per["info-0"] != 0 {
		t.Fatalf("delivered %v: want normal-0..2 and critical-0", per)
	}
	day := delivery.UTCDay(b.clock.Now())
	rec, err := n.Budget(context.Background(), day)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Sent != 3 || rec.Held != 2 || !rec.DigestRequested {
		t.Fatalf("budget %+v: want sent 3, held 2, digest requested", rec)
	}
	// Exactly one digest request is on the bus, and it goes out despite
	// the budget, saying how many were held and why.
	var digests []*events.Notification
	for _, m := range b.notifyMsgs(t) {
		if delivery.IsDigest(m) {
			digests = append(digests, m)
		}
	}
	if len(digests) != 1 {
		t.Fatalf("%d digest requests, want 1", len(digests))
	}
	if res := process(t, n, "digest", *digests[0]); res.Kind != delivery.AuditSent {
		t.Fatalf("digest: %+v, want sent", res)
	}
	last := sink.deliveries()[len(sink.deliveries())-1].Notification
	if !strings.Contains(last.Text, "2 non-critical notifications have been held back") || !strings.Contains(last.Text, "budget of 3") {
		t.Errorf("digest text %q: want the held count and the budget", last.Text)
	}
	// Three held requests (normal-3 twice, info-0), two distinct keys.
	if k := kinds(b.audits(t)); k[delivery.AuditHeld] != 3 {
		t.Errorf("held audit records = %d, want 3 (%v)", k[delivery.AuditHeld], k)
	}

	// A new UTC day has a new budget; a key held yesterday can go out.
	b.clock.Advance(24 * time.Hour)
	if res := process(t, n, reqID(20), note("normal-3", events.SeverityNormal)); res.Kind != delivery.AuditSent {
		t.Fatalf("next day: %+v, want sent", res)
	}
}

func TestZeroBudgetHoldsEveryNonCritical(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sink := newRecSink("hook", false)
	n, err := delivery.New(context.Background(), delivery.Config{JetStream: b.js, Now: b.clock.Now, Routes: []delivery.Route{{Sink: sink}}, DailyBudget: 0})
	if err != nil {
		t.Fatal(err)
	}
	if res := process(t, n, "r1", note("n", events.SeverityNormal)); res.Kind != delivery.AuditHeld {
		t.Fatalf("%+v, want held", res)
	}
	if res := process(t, n, "r2", note("c", events.SeverityCritical)); res.Kind != delivery.AuditSent {
		t.Fatalf("%+v, want sent", res)
	}
}

func TestRouting(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		route  delivery.Route
		note   events.Notification
		want   bool
		labels map[string]string
	}{
		{"no filter takes everything", delivery.Route{}, note("a", events.SeverityInfo), true, nil},
		{"a severity filter drops others", delivery.Route{Severities: []string{"critical"}}, note("a", events.SeverityNormal), false, nil},
		{"a severity filter takes its own", delivery.Route{Severities: []string{"normal", "critical"}}, note("a", events.SeverityNormal), true, nil},
		{"a label filter needs the value", delivery.Route{Labels: map[string]string{"team": "infra"}}, note("a", events.SeverityNormal), true, map[string]string{"team": "infra"}},
		{"a label filter refuses another value", delivery.Route{Labels: map[string]string{"team": "infra"}}, note("a", events.SeverityNormal), false, map[string]string{"team": "ml"}},
		{"a label filter refuses a missing label", delivery.Route{Labels: map[string]string{"team": "infra"}}, note("a", events.SeverityNormal), false, nil},
		{"a wildcard needs only presence", delivery.Route{Labels: map[string]string{"provider": "*"}}, note("a", events.SeverityNormal), true, map[string]string{"provider": "openai"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.note
			n.Labels = tc.labels
			if got := tc.route.Matches(&n); got != tc.want {
				t.Errorf("Matches = %v, want %v", got, tc.want)
			}
		})
	}

	t.Run("a request no sink takes is audited as unrouted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pager, chat := newRecSink("pager", true), newRecSink("chat", false)
		n := b.notifier(t, delivery.Config{Routes: []delivery.Route{
			{Sink: pager, Severities: []string{events.SeverityCritical}},
			{Sink: chat, Severities: []string{events.SeverityNormal}, Labels: map[string]string{"team": "infra"}},
		}})
		crit := note("c", events.SeverityCritical)
		infra := note("i", events.SeverityNormal)
		infra.Labels = map[string]string{"team": "infra"}
		process(t, n, "r1", crit)
		process(t, n, "r2", infra)
		if res := process(t, n, "r3", note("x", events.SeverityInfo)); res.Kind != delivery.AuditUnrouted {
			t.Errorf("info: %+v, want unrouted", res)
		}
		if p, c := pager.perKey(), chat.perKey(); len(p) != 1 || p["c"] != 1 || len(c) != 1 || c["i"] != 1 {
			t.Errorf("pager got %v, chat got %v", p, c)
		}
	})
}

func TestSinkFailures(t *testing.T) {
	t.Parallel()
	temporary := &notify.SinkError{Sink: "hook", Status: 503, Answer: "upstream restarting"}
	permanent := &notify.SinkError{Sink: "hook", Status: 404, Answer: "no such hook", Permanent: true}
	tests := []struct {
		name     string
		failures int // failed attempts before the sink recovers (-1: never)
		err      *notify.SinkError
		attempts int // MaxAttempts
		want     []delivery.Action
	}{
		{"a temporary failure is retried and then sent once", 2, temporary, 5, []delivery.Action{delivery.Retry, delivery.Retry, delivery.Ack}},
		{"a permanent failure is dead-lettered at once", -1, permanent, 5, []delivery.Action{delivery.DeadLetter}},
		{"the retry budget ends in a dead letter", -1, temporary, 3, []delivery.Action{delivery.Retry, delivery.Retry, delivery.DeadLetter}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			sink := newRecSink("hook", false)
			var mu sync.Mutex
			failed := 0
			sink.setFail(func(notify.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				if tc.failures >= 0 && failed >= tc.failures {
					return nil
				}
				failed++
				return tc.err
			})
			n := b.notifier(t, delivery.Config{Routes: []delivery.Route{{Sink: sink, Retry: delivery.RetryPolicy{MaxAttempts: tc.attempts, Initial: time.Second, Max: 4 * time.Second}}}})
			var last delivery.Result
			for i, want := range tc.want {
				last = process(t, n, "r1", note("k", events.SeverityCritical))
				if last.Action != want {
					t.Fatalf("delivery %d: %+v, want action %v", i+1, last, want)
				}
				if last.Action == delivery.Retry {
					if last.After <= 0 || last.After > 4*time.Second {
						t.Errorf("retry after %v: want within (0, 4s]", last.After)
					}
					// While the request waits, a repeat defers to it.
					if res := process(t, n, fmt.Sprintf("repeat-%d", i), note("k", events.SeverityCritical)); res.Kind != delivery.AuditDeduped {
						t.Errorf("repeat while pending: %+v, want deduped", res)
					}
					b.clock.Advance(last.After)
				}
			}
			if last.Action == delivery.DeadLetter && !strings.Contains(last.Reason, tc.err.Answer) {
				t.Errorf("dead-letter reason %q lacks the sink's answer %q", last.Reason, tc.err.Answer)
			}
			wantSent := 0
			if last.Action == delivery.Ack {
				wantSent = 1
			}
			if got := len(sink.deliveries()); got != wantSent {
				t.Errorf("deliveries = %d, want %d", got, wantSent)
			}
			as := b.audits(t)
			finals := 0
			for _, a := range as {
				if a.Kind == delivery.AuditFailed && a.Final {
					finals++
					if a.Answer != tc.err.Answer {
						t.Errorf("final failure answer %q, want %q", a.Answer, tc.err.Answer)
					}
				}
			}
			if want := map[bool]int{true: 1, false: 0}[last.Action == delivery.DeadLetter]; finals != want {
				t.Errorf("final failure records = %d, want %d", finals, want)
			}
		})
	}
}

func TestLastDeliveryDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sink := newRecSink("hook", false)
	sink.setFail(func(notify.Delivery) error {
		return &notify.SinkError{Sink: "hook", Status: 502, Answer: "bad gateway"}
	})
	n := b.notifier(t, delivery.Config{Routes: []delivery.Route{{Sink: sink}}})
	res, err := n.Process(context.Background(), delivery.Request{ID: "r1", Notification: note("k", events.SeverityCritical), LastDelivery: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Action != delivery.DeadLetter || !strings.Contains(res.Reason, "bad gateway") {
		t.Fatalf("%+v: want a dead letter with the sink's answer", res)
	}
	// A redelivery of the dead-lettered request (lost ack) dead-letters it
	// again with the same reason; a new request starts over.
	if again := process(t, n, "r1", note("k", events.SeverityCritical)); again.Action != delivery.DeadLetter || again.Reason != res.Reason {
		t.Errorf("redelivery: %+v", again)
	}
	sink.setFail(nil)
	if fresh := process(t, n, "r2", note("k", events.SeverityCritical)); fresh.Kind != delivery.AuditSent {
		t.Errorf("new request after a dead letter: %+v, want sent", fresh)
	}
}

func TestPartialFailureResendsOnlyTheFailedSink(t *testing.T) {
	t.Parallel()
	b := setup(t)
	good, bad := newRecSink("good", false), newRecSink("bad", false)
	bad.setFail(func(notify.Delivery) error { return &notify.SinkError{Sink: "bad", Answer: "down"} })
	n := b.notifier(t, delivery.Config{Routes: []delivery.Route{{Sink: good}, {Sink: bad}}})
	if res := process(t, n, "r1", note("k", events.SeverityNormal)); res.Action != delivery.Retry {
		t.Fatalf("%+v, want retry", res)
	}
	bad.setFail(nil)
	b.clock.Advance(time.Minute)
	if res := process(t, n, "r1", note("k", events.SeverityNormal)); res.Action != delivery.Ack {
		t.Fatalf("%+v, want ack", res)
	}
	if g, bd := len(good.deliveries()), len(bad.deliveries()); g != 1 || bd != 1 {
		t.Fatalf("good got %d, bad got %d; want 1 each", g, bd)
	}
	if d := bad.deliveries()[0]; d.Attempt != 2 {
		t.Errorf("bad sink attempt = %d, want 2", d.Attempt)
	}
}

func TestSecretsAreRedactedBeforeLeaving(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sink := newRecSink("hook", false)
	n := b.notifier(t, delivery.Config{Routes: []delivery.Route{{Sink: sink}}})
	secret := "sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789"
	req := events.Notification{
		DedupeKey: "auth:anthropic",
		Severity:  events.SeverityCritical,
		Title:     "auth failed with " + secret,
		Text:      `{"error":"Incorrect API key provided: ` + secret + `"} Authorization: Bearer abcdefgh12345678`,
		Labels:    map[string]string{"key": secret},
	}
	process(t, n, "r1", req)
	d := sink.deliveries()[0].Notification
	blob, _ := json.Marshal(d)
	for _, a := range b.audits(t) {
		ab, _ := json.Marshal(a)
		blob = append(blob, ab...)
	}
	if strings.Contains(string(blob), "abcdefghijklmnopqrstuvwxyz") || strings.Contains(string(blob), "abcdefgh12345678") {
		t.Fatalf("a secret left the process: %s", blob)
	}
	if !strings.Contains(d.Title, "sk-ant-***") {
		t.Errorf("title %q: want the secret masked, its kind kept", d.Title)
	}
}

func TestUnconfirmedSendsAreBoundedOnlyForNonIdempotentSinks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	plain, idem := newRecSink("plain", false), newRecSink("idem", true)
	for _, s := range []*recSink{plain, idem} {
		n := b.notifier(t, delivery.Config{Routes: []delivery.Route{{Sink: s}}, MaxUnconfirmed: 2})
		gate := make(chan struct{})
		s.mu.Lock()
		s.gate = gate
		s.mu.Unlock()
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Go(func() { process(t, n, s.name+reqID(i), note(fmt.Sprintf("%s-%d", s.name, i), events.SeverityCritical)) })
		}
		want := 2
		if s.idem {
			want = 6
		}
		waitFor(t, fmt.Sprintf("%d sends in flight to %s", want, s.name), func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.inflight == want
		})
		close(gate)
		wg.Wait()
		if s.maxInflight != want {
			t.Errorf("%s: at most %d sends in flight, want %d", s.name, s.maxInflight, want)
		}
	}
}

// A replica that recorded a send in the ledger and died before its audit
// record leaves a claim behind. Whichever request takes the claim over
// repeats the missing "sent" record, and the record is stored once however
// many requests repeat it.
func TestTakeoverRepeatsTheDeadReplicasSentRecordOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	chat, pager := newRecSink("chat", false), newRecSink("pager", true)
	routes := []delivery.Route{{Sink: chat}, {Sink: pager}}
	now := b.clock.Now()
	forceEntry(t, b, "k", func(e *delivery.LedgerEntry) {
		*e = delivery.LedgerEntry{DedupeKey: "k", State: delivery.LedgerClaimed, Generation: "gen-k", Request: "r1", Owner: "dead",
			Until: now.Add(time.Second), Created: now,
			Sinks: map[string]*delivery.SinkState{"chat": {Sent: true, SentAt: now, Attempts: 1}}}
	})
	b.clock.Advance(2 * time.Second)
	n := b.notifier(t, delivery.Config{Routes: routes, Replica: "live"})
	if res := process(t, n, "r2", note("k", events.SeverityCritical)); res.Kind != delivery.AuditSent {
		t.Fatalf("takeover by a repeat: %+v, want sent", res)
	}
	// The original request comes back: the key is sent, it is deduplicated.
	if res := process(t, n, "r1", note("k", events.SeverityCritical)); res.Kind != delivery.AuditDeduped {
		t.Fatalf("redelivery of the dead replica's request: %+v, want deduped", res)
	}
	if c, p := len(chat.deliveries()), len(pager.deliveries()); c != 0 || p != 1 {
		t.Fatalf("chat got %d, pager got %d: want 0 (already sent) and 1", c, p)
	}
	if got := pager.deliveries()[0].IdempotencyKey; got != "gen-k" {
		t.Errorf("pager idempotency key %q, want the claim's gen-k", got)
	}
	sent := map[string]int{}
	for _, a := range b.audits(t) {
		if a.Kind == delivery.AuditSent {
			sent[a.Sink]++
		}
	}
	if sent["chat"] != 1 || sent["pager"] != 1 {
		t.Errorf("sent audit records per sink %v: want one each", sent)
	}
}

// A request without a time is sent with the time its key was first
// claimed, so every attempt carries the same bytes (a webhook's signature
// does not change between retries).
func TestAttemptsCarryTheSameTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sink := newRecSink("hook", false)
	var (
		mu       sync.Mutex
		attempts []events.Time
	)
	sink.setFail(func(d notify.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, d.Notification.At)
		if len(attempts) < 3 {
			return &notify.SinkError{Sink: "hook", Status: 503, Answer: "later"}
		}
		return nil
	})
	n := b.notifier(t, delivery.Config{Routes: []delivery.Route{{Sink: sink}}})
	first := b.clock.Now()
	for i, want := range []delivery.Action{delivery.Retry, delivery.Retry, delivery.Ack} {
		if res := process(t, n, "r1", note("k", events.SeverityNormal)); res.Action != want {
			t.Fatalf("attempt %d: %+v, want %v", i+1, res, want)
		}
		b.clock.Advance(time.Minute)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, at := range attempts {
		if !at.Equal(first) {
			t.Errorf("attempt %d carries at %v, want %v (the first claim)", i+1, at.Time, first)
		}
	}
}

// ledgerState reads the ledger entry of a dedupe key.
func ledgerState(t *testing.T, b *bundle, key string) *delivery.LedgerEntry {
	t.Helper()
	kv, err := b.js.KeyValue(context.Background(), "FAILBUS_NOTIFY_DEDUPE")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(context.Background(), delivery.LedgerKey(key))
	if err != nil {
		return &delivery.LedgerEntry{}
	}
	var le delivery.LedgerEntry
	if err := json.Unmarshal(e.Value(), &le); err != nil {
		t.Fatal(err)
	}
	return &le
}

// forceEntry rewrites a ledger entry, modelling a replica that died at a
// chosen point.
func forceEntry(t *testing.T, b *bundle, key string, change func(*delivery.LedgerEntry)) {
	t.Helper()
	kv, err := b.js.KeyValue(context.Background(), "FAILBUS_NOTIFY_DEDUPE")
	if err != nil {
		t.Fatal(err)
	}
	e := ledgerState(t, b, key)
	change(e)
	data, _ := json.Marshal(e)
	if _, err := kv.Put(context.Background(), delivery.LedgerKey(key), data); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds; the deadline is a safety net only.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
