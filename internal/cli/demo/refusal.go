package demo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/delivery"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/internal/service/notifier"
	"github.com/failbus/failbus/internal/service/refusals"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// demoRefusalPolicy is the default re-probe schedule compressed 1:18000 (15m → 50ms,
// 1h → 200ms, 6h → 1.2s), so one segment's whole refusal life takes about
// three seconds.
func demoRefusalPolicy() *policy.Policy {
	p := policy.Default()
	p.Refusal.ReprobeDelays = []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, 1200 * time.Millisecond}
	p.Refusal.StateTTL = time.Hour
	return p
}

// refusalScenario is the refusal tiers in `failbus demo`: one segment's whole refusal life — the first refusal,
// three re-probes measured from the latest refusal, the freeze, the two
// notifications, turns that keep skipping, and a boundary that lets the
// provider try again. It runs on a bus of its own whose policy compresses
// the schedule (demoRefusalPolicy), so it does not depend on the demo bus's
// policy.
var refusalScenario = demoScenario{
	title: "A provider refuses a segment's history: bounded re-probes, then frozen",
	about: "Waiting does not change a refusal of bytes that stay in every request: bounded re-probes after the latest\n" +
		"refusal, then frozen until a boundary. Two notifications, not one and not one per turn.",
	run: func(ctx context.Context, d *demo) error { return runRefusalScenario(ctx, d.printf) },
}

// Names in the refusal scenario.
const (
	demoRefuser  = "strict-llm"
	demoFallback = "fallback-llm"
	demoSession  = "demo-session"
)

// runRefusalScenario starts a bus with demoRefusalPolicy, then drives one agent
// through the segment's life, printing with printf. It fails when the bus
// decides anything but the refusal tiers' rule.
func runRefusalScenario(ctx context.Context, printf func(string, ...any)) (err error) {
	pol := demoRefusalPolicy()
	cfg := pol.Refusal
	b, err := devbus.Start(devbus.Options{Server: embedded.Options{ServerName: "failbus-demo-refusals"}, Policy: pol, Log: zerolog.Nop()})
	if err != nil {
		return err
	}
	defer func() {
		if serr := b.Stop(); serr != nil && err == nil {
			err = serr
		}
	}()

	nc, err := b.Srv.Connect(nats.Name("failbus demo refusal agent"))
	if err != nil {
		return err
	}
	defer nc.Close()
	sc := &refusalDemo{printf: printf, js: b.JS, cfg: cfg}
	if sc.ag, err = agent.New(nc, demoAgent); err != nil {
		return err
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if sc.decisions, err = sc.ag.Decisions(dctx); err != nil {
		return err
	}
	return sc.run(ctx)
}

// refusalDemo is the state of one run of the scenario.
type refusalDemo struct {
	printf    func(string, ...any)
	js        jetstream.JetStream
	cfg       refusal.Config
	ag        *agent.Agent
	decisions <-chan events.Decision
	segment   int
	turn      int
	sends     int
	notes     []*events.Notification
	latest    time.Time // the latest refusal
}

func (s *refusalDemo) run(ctx context.Context) error {
	s.segment = 1
	s.printf("on a bus of its own whose policy compresses refusal.reprobe_delays 1:18000 (15m → 50ms, 1h → 200ms, 6h → 1.2s);")
	s.printf("the rule, worded from those values: %s", refusal.Rule(s.cfg))
	providers := []string{demoRefuser, demoFallback}

	// The first refusal, then one re-probe per delay.
	for probe := 0; probe <= s.cfg.MaxReprobes(); probe++ {
		if probe > 0 {
			waited, fallbacks, err := s.awaitProbe(ctx, providers)
			if err != nil {
				return err
			}
			s.printf("route  %d turns went to %s; at +%s after the latest refusal %s may be re-probed (%d of %d)",
				fallbacks, demoFallback, roundMS(waited), demoRefuser, probe, s.cfg.MaxReprobes())
		} else {
			r, err := s.route(ctx, providers)
			if err != nil {
				return err
			}
			s.printf("route  segment %s: allowed %s", events.SegmentKey(demoSession, s.segment), strings.Join(r.Allowed, ", "))
		}
		d, err := s.send(ctx)
		if err != nil {
			return err
		}
		s.printf("bus    %s: %s", d.Action, d.Reason)
		if err := s.printNotifications(ctx); err != nil {
			return err
		}
		if probe == 0 {
			r, err := s.route(ctx, providers)
			if err != nil {
				return err
			}
			if slices.Contains(r.Allowed, demoRefuser) && !d.DueAt.IsZero() && !time.Now().Before(d.DueAt.Time) {
				// A slow machine: the first delay had already passed when
				// route was asked, so the re-probe is allowed at once — the
				// rule, not a failure.
				s.printf("route  the first delay (+%s) had already passed when route was asked: %s may be re-probed at once",
					roundMS(d.DueAt.Sub(s.latest)), demoRefuser)
				continue
			}
			if len(r.Skipped) != 1 || r.Skipped[0].Provider != demoRefuser || r.Skipped[0].NextProbeAt == nil {
				return fmt.Errorf("right after the first refusal route answered %+v; want %s skipped with a next probe time", r, demoRefuser)
			}
			s.printf("route  the same turn falls back: allowed %s; %s skipped until +%s",
				strings.Join(r.Allowed, ", "), demoRefuser, roundMS(r.Skipped[0].NextProbeAt.Sub(s.latest)))
		}
	}

	// Frozen: turns go on, well past the longest delay, and none reaches
	// the refuser.
	until := s.latest.Add(s.cfg.ReprobeDelays[len(s.cfg.ReprobeDelays)-1] * 3 / 2)
	turns := 0
	for time.Now().Before(until) {
		r, err := s.route(ctx, providers)
		if err != nil {
			return err
		}
		if slices.Contains(r.Allowed, demoRefuser) || len(r.Skipped) != 1 || !r.Skipped[0].Frozen {
			return fmt.Errorf("after the freeze route answered %+v; want %s frozen", r, demoRefuser)
		}
		turns++
		if err := pause(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	s.printf("route  %d more turns over %s (past the longest delay; 100 hours on the virtual clock are the same): %s frozen in every one",
		turns, roundMS(time.Since(s.latest)), demoRefuser)
	if s.sends != 1+s.cfg.MaxReprobes() || len(s.notes) != 2 {
		return fmt.Errorf("%s received the segment %d times with %d notifications; want %d and 2", demoRefuser, s.sends, len(s.notes), 1+s.cfg.MaxReprobes())
	}
	s.printf("       %s received segment %s %d times in all, and a human was told twice.", demoRefuser, events.SegmentKey(demoSession, s.segment), s.sends)
	if err := s.printDelivered(ctx); err != nil {
		return err
	}

	// A boundary: the refused bytes leave the request.
	if err := s.ag.Boundary(ctx, events.Boundary{Session: demoSession, Segment: s.segment + 1, Reason: "tool surface changed"}); err != nil {
		return err
	}
	s.segment++
	s.printf("agent  boundary: the tool surface changed, segment %s starts", events.SegmentKey(demoSession, s.segment))
	if err := s.awaitRetired(ctx, events.SegmentKey(demoSession, s.segment-1)); err != nil {
		return err
	}
	r, err := s.route(ctx, providers)
	if err != nil {
		return err
	}
	if len(r.Allowed) == 0 || r.Allowed[0] != demoRefuser {
		return fmt.Errorf("after the boundary route answered %+v; want %s allowed again", r, demoRefuser)
	}
	s.printf("route  segment %s: allowed %s — %s may try again", events.SegmentKey(demoSession, s.segment), strings.Join(r.Allowed, ", "), demoRefuser)
	return nil
}

// awaitRetired waits until the boundary consumer has deleted the refusal
// state of segment.
func (s *refusalDemo) awaitRetired(ctx context.Context, segment string) error {
	store, err := refusals.OpenStore(ctx, s.js)
	if err != nil {
		return err
	}
	key := refusals.Key(segment, demoRefuser)
	wctx, cancel := context.WithTimeout(ctx, demoWait)
	defer cancel()
	for {
		_, found, err := store.Get(wctx, key)
		if err != nil {
			return err
		}
		if !found {
			s.printf("bus    segment %s's refusal state retired from KV %s (key %s)", segment, topology.BucketRefusals, key)
			return nil
		}
		if err := pause(wctx, 10*time.Millisecond); err != nil {
			return fmt.Errorf("refusal state of %s not retired: %w", segment, err)
		}
	}
}

func (s *refusalDemo) route(ctx context.Context, providers []string) (events.RouteResult, error) {
	rctx, cancel := context.WithTimeout(ctx, demoWait)
	defer cancel()
	return s.ag.Route(rctx, demoSession, s.segment, providers)
}

// awaitProbe takes a turn every 20ms until route allows the refuser again;
// it returns the wait since the latest refusal and the turns that fell back.
func (s *refusalDemo) awaitProbe(ctx context.Context, providers []string) (time.Duration, int, error) {
	for fallbacks := 0; ; fallbacks++ {
		r, err := s.route(ctx, providers)
		if err != nil {
			return 0, 0, err
		}
		if len(r.Allowed) > 0 && r.Allowed[0] == demoRefuser {
			return time.Since(s.latest), fallbacks, nil
		}
		if len(r.Skipped) != 1 || r.Skipped[0].Frozen {
			return 0, 0, fmt.Errorf("waiting for a re-probe route answered %+v", r)
		}
		if err := pause(ctx, 20*time.Millisecond); err != nil {
			return 0, 0, err
		}
	}
}

// send reports a refusal of the segment's history by the refuser and
// returns the bus's decision for it.
func (s *refusalDemo) send(ctx context.Context) (events.Decision, error) {
	s.turn++
	s.sends++
	o := &events.Outcome{
		Provider: demoRefuser, Model: "strict-1", Session: demoSession, Segment: s.segment, Turn: s.turn,
		OK: true, Status: 200, StopReason: "refusal", RefusalScope: refusal.ScopeHistory,
	}
	if err := s.ag.Report(ctx, o); err != nil {
		return events.Decision{}, err
	}
	// Route answers carry milliseconds (JSON): measure from the same.
	s.latest = o.At.Time.Truncate(time.Millisecond)
	s.printf("agent  %s: status 200, stop_reason refusal, refusal_scope history (send %d of this segment)", demoRefuser, s.sends)
	wctx, cancel := context.WithTimeout(ctx, demoWait)
	defer cancel()
	for {
		select {
		case d, ok := <-s.decisions:
			if !ok {
				return events.Decision{}, errors.New("decisions closed")
			}
			if d.OutcomeID != o.ID {
				continue
			}
			if d.Action != events.ActionSkipProvider {
				return d, fmt.Errorf("decision %s; want %s", d.Action, events.ActionSkipProvider)
			}
			return d, nil
		case <-wctx.Done():
			return events.Decision{}, fmt.Errorf("no decision for %s within %v", o.ID, demoWait)
		}
	}
}

// printNotifications prints the notification requests published since the
// last call, once the refusal service has settled what it handled.
func (s *refusalDemo) printNotifications(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, demoWait)
	defer cancel()
	for {
		done, err := embedded.CaughtUp(wctx, s.js, topology.StreamClassified, topology.ConsumerRefusals)
		if err != nil {
			return err
		}
		if done {
			break
		}
		if err := pause(wctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
	var all []*events.Notification
	err := watch.Read(wctx, s.js, watch.Config{Stream: topology.StreamNotify, Filters: []string{events.NotifyPrefix + ".>"}}, func(m jetstream.Msg) error {
		v, err := events.DecodeAs[*events.Notification](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			return err
		}
		all = append(all, v)
		return nil
	})
	if err != nil {
		return err
	}
	for _, n := range all[min(len(s.notes), len(all)):] {
		s.printf("notify %s  %s", n.Severity, n.DedupeKey)
		s.printf("       %s", n.Title)
	}
	s.notes = all
	return nil
}

// printDelivered waits until the notifier has delivered both notification
// requests and prints its "sent" audit records: what reached the sink (the
// log sink, with no sinks configured), once each.
func (s *refusalDemo) printDelivered(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, demoWait)
	defer cancel()
	want := map[string]bool{}
	for _, n := range s.notes {
		want[n.DedupeKey] = true
	}
	sent := map[string][]delivery.Audit{}
	var order []string
	cfg := watch.Config{Stream: topology.StreamAudit, Filters: []string{events.AuditSubject(notifier.Name, delivery.AuditSent)}, Follow: true}
	err := watch.Read(wctx, s.js, cfg, func(m jetstream.Msg) error {
		var a delivery.Audit
		if err := msgpack.Unmarshal(m.Data(), &a); err != nil {
			return fmt.Errorf("notifier audit record: %w", err)
		}
		if !want[a.DedupeKey] {
			return nil
		}
		if len(sent[a.DedupeKey]) == 0 {
			order = append(order, a.DedupeKey)
		}
		sent[a.DedupeKey] = append(sent[a.DedupeKey], a)
		if len(order) == len(want) {
			return watch.ErrStop
		}
		return nil
	})
	if err == nil && len(order) < len(want) {
		err = wctx.Err()
	}
	if err != nil {
		return fmt.Errorf("waiting for the notifier to deliver %d notifications (%d so far): %w", len(want), len(order), err)
	}
	for _, k := range order {
		a := sent[k][0]
		s.printf("sent   %s sink ← %s %s (audit failbus.audit.notifier.sent: %d record(s) so far)", a.Sink, a.Severity, a.DedupeKey, len(sent[k]))
	}
	return nil
}

// pause waits d or until ctx ends: the pace of the scripted agent's turns.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// roundMS rounds a duration to whole milliseconds for printing.
func roundMS(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
