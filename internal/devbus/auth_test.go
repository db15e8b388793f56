package devbus_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/auth"
	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// authPolicy retries quickly, so a due retry arrives within the test.
const authPolicy = `
retry:
  initial_delay: 200ms
  max_delay: 400ms
`

// Every service runs as its own role, with only that role's permissions,
// and does its whole job: outcomes are classified, a retry is decided and
// comes due, a refusal is answered on the route and notified, recovery
// records are taken in; the agent (role agent) reads its decisions and due
// retries. No connection, service or agent, is denied anything.
func TestEveryServiceWorksUnderItsOwnRole(t *testing.T) {
	t.Parallel()
	set, err := auth.Init(filepath.Join(t.TempDir(), "auth"), nil)
	if err != nil {
		t.Fatal(err)
	}
	polFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(polFile, []byte(authPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Load(polFile)
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	b, err := devbus.Start(devbus.Options{
		Server: embedded.Options{ServerName: "failbus-devbus-auth"},
		Policy: pol, PolicyFile: polFile,
		Log:  zerolog.New(logs).Level(zerolog.WarnLevel),
		Auth: set,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if nc, err := nats.Connect(b.Srv.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("a connection without credentials was accepted")
	}

	ac, err := connect.Connect(connect.Options{Servers: b.Srv.ClientURL(), Nkey: set.Seed(auth.RoleAgent)}, "agent")
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	ag, err := agent.New(ac.Conn, "bot", agent.WithDurable())
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	decisions, err := ag.Decisions(rctx)
	if err != nil {
		t.Fatal(ac.Explain(err))
	}
	due, err := ag.DueRetries(rctx)
	if err != nil {
		t.Fatal(ac.Explain(err))
	}

	for _, o := range []*events.Outcome{
		{ID: "ok", Provider: "openai", OK: true, Status: 200},
		{ID: "503", Provider: "openai", Status: 503, Turn: 1, Step: 1},
		{ID: "refusal", Provider: "strict", Session: "s", Segment: 1, OK: true, Status: 200, StopReason: "refusal", RefusalScope: "history"},
	} {
		if err := ag.Report(ctx, o); err != nil {
			t.Fatal(ac.Explain(err))
		}
	}
	// Recovery's inputs, as an agent reports them.
	for subject, m := range map[string]events.Message{
		events.HeartbeatSubject("bot"):      &events.Heartbeat{At: events.At(time.Now()), Agent: "bot", Subagent: "sub-1", Provider: "openai", Status: "running"},
		events.TaskSubject("openai", "bot"): &events.Task{ID: "task-1", At: events.At(time.Now()), Agent: "bot", Provider: "openai", Kind: "summarize"},
	} {
		data, hdr, err := events.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(ac.Conn)
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: hdr, Data: data}); err != nil {
			t.Fatal(ac.Explain(err))
		}
	}

	// The 503 is retried: its decision, then the due retry.
	var retryID string
	for retryID == "" {
		select {
		case d := <-decisions:
			if d.OutcomeID == "503" && d.Action == "retry" {
				retryID = d.RetryID
			}
		case <-ctx.Done():
			t.Fatalf("no retry decision for the 503; denials %v\n%s", b.Denials(), logs.String())
		}
	}
	select {
	case r := <-due:
		if r.RetryID != retryID {
			t.Errorf("due retry %s, want %s", r.RetryID, retryID)
		}
	case <-ctx.Done():
		t.Fatalf("the retry did not come due; denials %v\n%s", b.Denials(), logs.String())
	}
	if err := ag.Started(ctx, retryID); err != nil {
		t.Fatal(ac.Explain(err))
	}
	// The refused segment is skipped for strict on the route.
	res, err := ag.Route(ctx, "s", 1, []string{"strict", "openai"})
	if err != nil {
		t.Fatal(ac.Explain(err))
	}
	if len(res.Allowed) != 1 || res.Allowed[0] != "openai" {
		t.Errorf("route allowed %v, want only openai", res.Allowed)
	}

	// Every consumer got through its input (the recovery ones too).
	for _, c := range topology.Consumers() {
		stream, _, _ := topology.Consumer(c)
		for {
			done, err := embedded.CaughtUp(ctx, b.JS, stream, c)
			if err != nil {
				t.Fatal(err)
			}
			if done {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s did not catch up; denials %v\n%s", c, b.Denials(), logs.String())
			case <-time.After(20 * time.Millisecond): // poll interval, bounded by ctx
			}
		}
	}
	// The notifier sent the refusal's notification (audited as sent).
	sent := 0
	c, err := b.JS.OrderedConsumer(ctx, topology.StreamAudit, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.AuditPrefix + ".notifier.>"}})
	if err != nil {
		t.Fatal(err)
	}
	for sent == 0 {
		m, err := c.Next(jetstream.FetchMaxWait(30 * time.Second))
		if err != nil {
			t.Fatalf("no notifier audit record: %v; denials %v", err, b.Denials())
		}
		if m.Subject() == events.AuditSubject("notifier", "sent") {
			sent++
		}
	}
	stopReading()
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	if d := append(b.Denials(), ac.Denials()...); len(d) > 0 {
		t.Errorf("permissions denied while the services did their work: %v", d)
	}
}
