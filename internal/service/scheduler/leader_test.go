package scheduler_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/internal/testcluster"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// apiSpy records the JetStream API requests for one stream's messages
// sent from connections whose inbox starts with inbox: a plain
// subscription on the API subjects gets a copy of each request, whoever
// answers it.
type apiSpy struct {
	mu     sync.Mutex
	direct []string // DIRECT.GET requests: subject and body
	leader []string // STREAM.MSG.GET requests: body
}

func spyOn(t *testing.T, nc *nats.Conn, stream, inbox string) *apiSpy {
	t.Helper()
	s := &apiSpy{}
	record := func(m *nats.Msg) {
		if !strings.HasPrefix(m.Reply, inbox) {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if strings.Contains(m.Subject, ".DIRECT.GET.") {
			s.direct = append(s.direct, m.Subject+" "+string(m.Data))
		} else {
			s.leader = append(s.leader, string(m.Data))
		}
	}
	for _, subj := range []string{"$JS.API.DIRECT.GET." + stream, "$JS.API.DIRECT.GET." + stream + ".>", "$JS.API.STREAM.MSG.GET." + stream} {
		if _, err := nc.Subscribe(subj, record); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return s
}

// of returns the requests so far that name one of the subjects parts
// (a ledger or schedule subject).
func (s *apiSpy) of(parts ...string) (direct, leader []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	match := func(list []string) []string {
		var out []string
		for _, r := range list {
			for _, p := range parts {
				if strings.Contains(r, p) {
					out = append(out, r)
					break
				}
			}
		}
		return out
	}
	return match(s.direct), match(s.leader)
}

// On a 3-node cluster with FAILBUS_RETRIES at R3, every read of the
// retry ledger whose answer decides goes to the stream's leader
// (STREAM.MSG.GET), never to a direct get, which a replica lagging the
// leader may answer: a decision that appends nothing (a spent budget's
// give_up), a redelivery's replay and its schedule check, and the agent's
// started mark, whose "not the latest retry" would drop it.
func TestLedgerReadsThatDecideAreTheLeadersOnAReplicatedStream(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{InProcess: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	nc, err := nats.Connect(c.URLs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := topology.Apply(ctx, js, topology.Options{Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	const inbox = "_INBOX_SCHEDULER"
	spy := spyOn(t, nc, topology.StreamRetries, inbox)
	snc, err := nats.Connect(c.URLs(), nats.CustomInboxPrefix(inbox))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(snc.Close)
	sjs, err := jetstream.New(snc)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse([]byte("retry:\n  max_retries: 1\n  initial_delay: 100ms\n  max_delay: 1s\n"))
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{t: t, ctx: ctx, nc: nc, js: js}
	sb := &bench{t: t, ctx: ctx, js: sjs}
	reg := prometheus.NewRegistry()
	sb.start(scheduler.Config{Policy: pol, Runner: consumer.Config{Registerer: reg}})

	// The first failure of a step spends the budget's one retry; the
	// second finds it spent: give_up, with nothing appended.
	first := cls("l-1", "lagger", "openai", "k", events.ClassServerError, 1, 1, 200)
	b.publish(first, "")
	d := b.decisionOf("lagger", "l-1")
	b.publish(cls("l-2", "lagger", "openai", "k", events.ClassServerError, 1, 1, 200), "")
	if d2 := b.decisionOf("lagger", "l-2"); d2.Action != events.ActionGiveUp {
		t.Fatalf("second failure of a spent budget: %s, want %s", d2.Action, events.ActionGiveUp)
	}
	token := budgetToken(first, pol)
	ledger := events.RetryLedgerSubject(token)
	if n := len(b.ledger(token)); n != 1 {
		t.Fatalf("ledger holds %d entries, want 1 (a give_up appends nothing)", n)
	}
	// A redelivery of the first: replayed from its record, whose schedule
	// (fired by now, or pending) is looked up.
	b.poll("the retry to fire", func() bool { return len(b.dues("lagger")) == 1 })
	b.publish(first, "redelivery:l-1")
	b.waitIdle()
	// The agent starts it: the mark reads the budget's latest entry.
	ag, err := agent.New(nc, "lagger")
	if err != nil {
		t.Fatal(err)
	}
	if err := ag.Started(ctx, d.RetryID); err != nil {
		t.Fatal(err)
	}
	b.poll("the started mark", func() bool {
		es := b.ledger(token)
		return len(es) == 2 && es[1].Started()
	})

	direct, leader := spy.of(ledger, events.RetryPrefix+".sched.", events.RetryDueSubject("lagger"))
	for _, r := range direct {
		t.Errorf("a read that decides went to a direct get, which a lagging replica may answer: %s", r)
	}
	if len(leader) < 4 {
		t.Errorf("%d reads of the ledger and schedules from the leader, want at least 4 (give_up, replay, schedule, mark): %q", len(leader), leader)
	}
	t.Logf("reads from the leader: %d; direct gets: %d", len(leader), len(direct))
	if got := labeledCounter(t, reg, "failbus_scheduler_ledger_reads_total", map[string]string{"how": topology.ReadLeader}); got < 2 {
		t.Errorf("ledger reads counted as the leader's: %v, want at least 2", got)
	}
}
