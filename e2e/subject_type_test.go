package e2e

// A subject carries its type (CONTRACT.md "On the bus"): a foreign client
// publishes bare msgpack maps, without Failbus-Schema or Content-Type, with
// nothing but nats.go and msgpack, to every subject an agent writes, and each
// service reads them as their subject's type; a header naming another type
// is dead-lettered with that reason. Against a real `failbus dev`.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/service/scheduler"
)

// webhookCounter counts the POSTs a webhook sink receives, by dedupe key.
type webhookCounter struct {
	mu    sync.Mutex
	byKey map[string]int
	last  map[string]map[string]any
}

func newWebhookCounter(t *testing.T) (*webhookCounter, *httptest.Server) {
	w := &webhookCounter{byKey: map[string]int{}, last: map[string]map[string]any{}}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var p map[string]any
		if err := json.Unmarshal(body, &p); err != nil {
			http.Error(rw, "not JSON", http.StatusBadRequest)
			return
		}
		key, _ := p["dedupe_key"].(string)
		w.mu.Lock()
		w.byKey[key]++
		w.last[key] = p
		w.mu.Unlock()
		rw.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return w, srv
}

func (w *webhookCounter) count(key string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.byKey[key]
}

func (w *webhookCounter) total() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, c := range w.byKey {
		n += c
	}
	return n
}

// pollUntil calls ok until it is true, failing the test at ctx's deadline.
func pollUntil(ctx context.Context, t *testing.T, what string, ok func() bool) {
	t.Helper()
	for !ok() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// bare publishes v as a bare msgpack map: no headers at all, the way a
// client in another language that read only the contract would.
// It returns the stream sequence the message was stored at.
func bare(ctx context.Context, t *testing.T, js jetstream.JetStream, subject string, v map[string]any) uint64 {
	t.Helper()
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: mustMsgpack(t, v)})
	if err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
	return ack.Sequence
}

// waitAcked waits until a durable consumer has had everything up to stream
// sequence seq acknowledged (its ack floor reached seq): unlike waitIdle it
// suits a consumer filtered on part of a busy stream.
func waitAcked(ctx context.Context, t *testing.T, js jetstream.JetStream, stream, consumer string, seq uint64) {
	t.Helper()
	pollUntil(ctx, t, consumer+" acknowledging up to "+stream+" seq", func() bool {
		c, err := js.Consumer(ctx, stream, consumer)
		if err != nil {
			t.Fatalf("consumer %s: %v", consumer, err)
		}
		return c.CachedInfo().AckFloor.Stream >= seq
	})
}

func TestHeaderlessRecordsAreTheirSubjectsType(t *testing.T) {
	t.Parallel()
	hook, hookSrv := newWebhookCounter(t)
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(`
notify:
  daily_budget: 100
  sinks:
    - name: ops
      type: webhook
      url: `+hookSrv.URL+`
      idempotent: true
`), 0o600); err != nil {
		t.Fatal(err)
	}
	dev := startDev(t, freePort(t), filepath.Join(dir, "data"), "--policy", pol)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nc, err := nats.Connect(dev.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("notification request reaches the webhook exactly once", func(t *testing.T) {
		note := map[string]any{
			"dedupe_key": "plain-client:disk-full", "severity": "normal",
			"title": "disk full", "text": "the agent host ran out of disk", "labels": map[string]string{"host": "h1"},
		}
		// Published twice, as a client that lost its ack would: the dedupe
		// key makes it one notification.
		bare(ctx, t, js, "failbus.notify.normal", note)
		bare(ctx, t, js, "failbus.notify.normal", note)
		pollUntil(ctx, t, "the webhook delivery", func() bool { return hook.count("plain-client:disk-full") >= 1 })
		waitIdle(ctx, t, js, "FAILBUS_NOTIFY", "notifier")
		if n := hook.count("plain-client:disk-full"); n != 1 {
			t.Errorf("webhook got the notification %d times, want exactly 1", n)
		}
		if n := hook.total(); n != 1 {
			t.Errorf("webhook got %d requests in all, want 1", n)
		}
		hook.mu.Lock()
		got := hook.last["plain-client:disk-full"]
		hook.mu.Unlock()
		if got["title"] != "disk full" || got["severity"] != "normal" {
			t.Errorf("webhook payload %v", got)
		}
		if dl := deadLetterReasons(ctx, t, js, "notifier"); len(dl) != 0 {
			t.Errorf("dead letters: %v", dl)
		}
	})

	t.Run("boundary retires the refused segment", func(t *testing.T) {
		bare(ctx, t, js, "failbus.outcome.openai.plain", map[string]any{
			"id": "plain-refusal-1", "agent": "plain", "provider": "openai", "session": "ps", "segment": 1,
			"ok": false, "status": 200, "stop_reason": "refusal", "refusal_scope": "history", "at": time.Now().UnixMilli(),
		})
		kv, err := js.KeyValue(ctx, "FAILBUS_REFUSALS")
		if err != nil {
			t.Fatal(err)
		}
		key := "ps.1.openai"
		pollUntil(ctx, t, "refusal state for ps#1", func() bool { _, err := kv.Get(ctx, key); return err == nil })
		seq := bare(ctx, t, js, "failbus.segment.plain", map[string]any{
			"agent": "plain", "session": "ps", "segment": 2, "reason": "compaction", "at": time.Now().UnixMilli(),
		})
		waitAcked(ctx, t, js, "FAILBUS_OUTCOMES", "refusals-boundaries", seq)
		if _, err := kv.Get(ctx, key); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("refusal state of ps#1 after the boundary: %v, want it retired", err)
		}
		if dl := deadLetterReasons(ctx, t, js, "refusals-boundaries"); len(dl) != 0 {
			t.Errorf("dead letters: %v", dl)
		}
	})

	t.Run("retry started and cancel mark the ledger", func(t *testing.T) {
		dec, err := js.OrderedConsumer(ctx, "FAILBUS_DECISIONS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"failbus.decision.plain-r"}})
		if err != nil {
			t.Fatal(err)
		}
		retryIDs := map[string]string{}
		for turn, id := range []string{"plain-429-a", "plain-429-b"} {
			bare(ctx, t, js, "failbus.outcome.openai.plain-r", map[string]any{
				"id": id, "agent": "plain-r", "provider": "openai", "turn": turn + 1, "status": 429,
				"headers": map[string]string{"retry-after": "30"}, "at": time.Now().UnixMilli(),
			})
		}
		for len(retryIDs) < 2 {
			m, err := dec.Next(jetstream.FetchMaxWait(time.Until(deadlineOf(ctx))))
			if err != nil {
				t.Fatalf("decision: %v", err)
			}
			var d map[string]any
			if err := msgpack.Unmarshal(m.Data(), &d); err != nil {
				t.Fatal(err)
			}
			if d["action"] != "retry" {
				t.Fatalf("decision %v, want retry", d)
			}
			retryIDs[d["outcome_id"].(string)] = d["retry_id"].(string)
		}
		bare(ctx, t, js, "failbus.retry.started.plain-r", map[string]any{"retry_id": retryIDs["plain-429-a"], "agent": "plain-r"})
		seq := bare(ctx, t, js, "failbus.retry.cancel.plain-r", map[string]any{"retry_id": retryIDs["plain-429-b"], "agent": "plain-r"})
		waitAcked(ctx, t, js, "FAILBUS_RETRIES", "scheduler-control", seq)
		started, cancelled := map[string]bool{}, map[string]bool{}
		for _, m := range readAll(ctx, t, js, "FAILBUS_RETRIES", "failbus.retry.ledger.>") {
			e, err := scheduler.DecodeLedgerEntry(m.Headers(), m.Data())
			if err != nil {
				t.Fatal(err)
			}
			started[e.RetryID] = started[e.RetryID] || e.Started()
			cancelled[e.RetryID] = cancelled[e.RetryID] || e.Cancelled()
		}
		if a := retryIDs["plain-429-a"]; !started[a] || cancelled[a] {
			t.Errorf("retry %s: started %v cancelled %v, want started only", a, started[a], cancelled[a])
		}
		if b := retryIDs["plain-429-b"]; started[b] || !cancelled[b] {
			t.Errorf("retry %s: started %v cancelled %v, want cancelled only", b, started[b], cancelled[b])
		}
		if dl := deadLetterReasons(ctx, t, js, "scheduler-control"); len(dl) != 0 {
			t.Errorf("dead letters: %v", dl)
		}
	})

	t.Run("recovery records: heartbeat, cron spec and run, write, task", func(t *testing.T) {
		now := time.Now()
		recs := []struct {
			stream, consumer, subject string
			v                         map[string]any
		}{
			{"FAILBUS_LIVENESS", "recovery-heartbeats", "failbus.heartbeat.plain", map[string]any{"agent": "plain", "subagent": "sub-1", "provider": "openai", "status": "running", "interval_ms": 5000, "at": now.UnixMilli()}},
			{"FAILBUS_REPORTS", "recovery-reports", "failbus.cron.spec.plain", map[string]any{"agent": "plain", "cron": "nightly", "schedule": "0 3 * * *", "provider": "openai", "at": now.UnixMilli()}},
			{"FAILBUS_REPORTS", "recovery-reports", "failbus.cron.run.plain", map[string]any{"agent": "plain", "cron": "nightly", "scheduled_at": now.Truncate(time.Hour).Format(time.RFC3339), "status": "ok", "at": now.UnixMilli()}},
			{"FAILBUS_REPORTS", "recovery-reports", "failbus.write.plain", map[string]any{"agent": "plain", "key": "memory/a.md", "ok": true, "at": now.UnixMilli()}},
		}
		for _, r := range recs {
			seq := bare(ctx, t, js, r.subject, r.v)
			waitAcked(ctx, t, js, r.stream, r.consumer, seq)
		}
		// A task for a healthy provider is dispatched at once: the task was
		// read as a Task, its id and payload intact.
		bare(ctx, t, js, "failbus.task.openai.plain", map[string]any{"id": "plain-task-1", "agent": "plain", "provider": "openai", "kind": "k", "payload": map[string]any{"n": 7}})
		var got map[string]any
		pollUntil(ctx, t, "the task's dispatch", func() bool {
			for _, m := range readAll(ctx, t, js, "FAILBUS_DISPATCH", "failbus.dispatch.plain") {
				var d map[string]any
				if err := msgpack.Unmarshal(m.Data(), &d); err != nil {
					t.Fatal(err)
				}
				if d["task_id"] == "plain-task-1" {
					got = d
					return true
				}
			}
			return false
		})
		if p, _ := got["payload"].(map[string]any); got["attempt"] != int8(1) || got["kind"] != "k" || p["n"] != int8(7) {
			t.Errorf("dispatch %v", got)
		}
		for _, m := range readAll(ctx, t, js, "FAILBUS_DLQ", "failbus.dlq.>") {
			var d struct {
				Reason  string `msgpack:"reason"`
				Subject string `msgpack:"subject"`
			}
			if err := msgpack.Unmarshal(m.Data(), &d); err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(d.Subject, ".plain") && !strings.HasPrefix(d.Subject, "failbus.outcome.") && !strings.HasPrefix(d.Subject, "failbus.segment.") {
				t.Errorf("%s dead-lettered: %s", d.Subject, d.Reason)
			}
		}
	})

	t.Run("a header naming another type is dead-lettered with that reason", func(t *testing.T) {
		wrong := []struct {
			subject, schema, service string
			data                     map[string]any
		}{
			{"failbus.outcome.openai.plain", "decision/1", "classifier", map[string]any{"outcome_id": "x", "agent": "plain", "action": "retry"}},
			{"failbus.notify.critical", "outcome/1", "notifier", map[string]any{"id": "o", "agent": "plain", "provider": "openai", "dedupe_key": "smuggled", "severity": "critical"}},
			{"failbus.segment.plain", "notification/1", "refusals-boundaries", map[string]any{"dedupe_key": "k", "severity": "normal", "agent": "plain", "session": "ps"}},
			{"failbus.heartbeat.plain-x", "task/1", ">", map[string]any{"id": "t", "agent": "plain-x", "subagent": "s"}},
			{"failbus.task.openai.plain-x", "heartbeat/1", ">", map[string]any{"id": "t2", "agent": "plain-x", "subagent": "s"}},
		}
		for _, w := range wrong {
			h := nats.Header{}
			h.Set("Failbus-Schema", w.schema)
			if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: w.subject, Header: h, Data: mustMsgpack(t, w.data)}); err != nil {
				t.Fatal(err)
			}
		}
		for _, w := range wrong {
			name := strings.Split(w.schema, "/")[0]
			pollUntil(ctx, t, "a dead letter from "+w.service+" of "+w.subject, func() bool {
				for _, r := range deadLetterReasons(ctx, t, js, w.service) {
					if strings.Contains(r, w.subject) && strings.Contains(r, name) && strings.Contains(r, "does not belong") {
						return true
					}
				}
				return false
			})
		}
		if n := hook.count("smuggled"); n != 0 {
			t.Errorf("an outcome-typed message on a notify subject was delivered %d times", n)
		}
	})
}

// deadLetterReasons reads the reasons of every dead letter of service (">":
// of every service).
func deadLetterReasons(ctx context.Context, t *testing.T, js jetstream.JetStream, service string) []string {
	t.Helper()
	var out []string
	for _, m := range readAll(ctx, t, js, "FAILBUS_DLQ", "failbus.dlq."+service) {
		var d struct {
			Reason string `msgpack:"reason"`
		}
		if err := msgpack.Unmarshal(m.Data(), &d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d.Reason)
	}
	return out
}

func deadlineOf(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(time.Minute)
	}
	return d
}
