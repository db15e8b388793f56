package scheduler_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/internal/streamread"
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

// take returns the requests since the last take that name part (a ledger
// or schedule subject), and forgets every request so far.
func (s *apiSpy) take(nc *nats.Conn, part string) (direct, leader []string) {
	_ = nc.Flush() // what was sent before is in
	s.mu.Lock()
	defer s.mu.Unlock()
	match := func(list []string) []string {
		var out []string
		for _, r := range list {
			if strings.Contains(r, part) {
				out = append(out, r)
			}
		}
		return out
	}
	direct, leader = match(s.direct), match(s.leader)
	s.direct, s.leader = nil, nil
	return direct, leader
}

// On a 3-node cluster with FAILBUS_RETRIES at R3, a decision that appends
// nothing to the retry ledger, which no compare-and-set checks, is made
// from reads of the stream's leader (STREAM.MSG.GET, which only the
// leader answers), never from a direct get alone, which a replica lagging
// the leader may answer: a spent budget's give_up, a redelivery's replay
// and its schedule check, the agent's started mark. A decision that
// appends (the budget's first retry) stays on direct gets: its
// compare-and-set catches a stale read.
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
	first := cls("l-1", "lagger", "openai", "k", events.ClassServerError, 1, 1, 200)
	ledger := events.RetryLedgerSubject(budgetToken(first, pol))

	// The first failure of a step spends the budget's one retry: an
	// append, checked by its compare-and-set.
	b.publish(first, "")
	d := b.decisionOf("lagger", "l-1")
	if _, leader := spy.take(nc, ledger); len(leader) > 0 {
		t.Errorf("an appending decision read the leader: %q", leader)
	}
	// The second finds it spent: give_up, with nothing appended.
	b.publish(cls("l-2", "lagger", "openai", "k", events.ClassServerError, 1, 1, 200), "")
	if d2 := b.decisionOf("lagger", "l-2"); d2.Action != events.ActionGiveUp {
		t.Fatalf("second failure of a spent budget: %s, want %s", d2.Action, events.ActionGiveUp)
	}
	b.waitIdle()
	direct, leader := spy.take(nc, ledger)
	t.Logf("give_up: %d direct gets, %d leader reads of the ledger", len(direct), len(leader))
	if len(leader) == 0 {
		t.Error("the give_up was decided without reading the ledger from the leader")
	}
	if n := len(b.ledger(budgetToken(first, pol))); n != 1 {
		t.Fatalf("ledger holds %d entries, want 1 (a give_up appends nothing)", n)
	}
	// A redelivery of the first: replayed from its record, whose schedule
	// (fired by now) is looked up.
	b.poll("the retry to fire", func() bool { return len(b.dues("lagger")) == 1 })
	spy.take(nc, "")
	b.publish(first, "redelivery:l-1")
	b.waitIdle()
	_, leader = spy.take(nc, events.RetryPrefix+".")
	t.Logf("replay: %d leader reads: %q", len(leader), leader)
	for _, part := range []string{ledger, events.RetryScheduleSubject("lagger", d.RetryID), events.RetryDueSubject("lagger")} {
		if !slices.ContainsFunc(leader, func(r string) bool { return strings.Contains(r, part) }) {
			t.Errorf("the replay did not read %s from the leader", part)
		}
	}
	// The agent starts it: the mark reads the budget's latest entry.
	ag, err := agent.New(nc, "lagger")
	if err != nil {
		t.Fatal(err)
	}
	if err := ag.Started(ctx, d.RetryID); err != nil {
		t.Fatal(err)
	}
	b.poll("the started mark", func() bool {
		es := b.ledger(budgetToken(first, pol))
		return len(es) == 2 && es[1].Started()
	})
	if _, leader := spy.take(nc, ledger); len(leader) == 0 {
		t.Error("the started mark was decided without reading the ledger from the leader")
	}
	if got := labeledCounter(t, reg, "failbus_scheduler_ledger_reads_total", map[string]string{"how": streamread.ReadLeader}); got < 3 {
		t.Errorf("ledger reads counted as the leader's: %v, want at least 3", got)
	}
}
