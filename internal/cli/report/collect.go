package report

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/cli/shadow"
	"github.com/failbus/failbus/internal/watch"
	"github.com/failbus/failbus/internal/wiretypes"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Options say what to report on.
type Options struct {
	// From and To bound the period by store time: [From, To). Required.
	From, To time.Time
	// Progress receives a progress line while reading, when it is a
	// terminal (nil: none).
	Progress io.Writer
	// Now stamps the report. Defaults to time.Now.
	Now func() time.Time
	// Shadow, when set, replays the period's outcomes and boundaries
	// under Shadow.New as well (Report.Shadow).
	Shadow *ShadowOptions
}

// source is one stream read for the report, in the order they are read:
// classifications before decisions, whose refusal figures join them.
type source struct {
	stream string
	// only, when set, are the subject prefixes of the messages the report
	// uses; the others are read and skipped. The stream is read whole
	// rather than through a consumer filtered on several subjects: on a
	// stream of many subjects (a retry ledger subject per budget, a
	// schedule subject per retry) the server finds the next message of a
	// multi-filter consumer slowly — 10,600 messages of FAILBUS_RETRIES
	// cost it 9.4 s of CPU that way, 0.15 s read whole.
	only []string
	// all reads the whole stream, not just the period (health: the state
	// at the start of the period comes from before it).
	all bool
}

var sources = []source{
	{stream: topology.StreamOutcomes},
	{stream: topology.StreamClassified},
	{stream: topology.StreamDecisions},
	{stream: topology.StreamRetries, only: []string{events.RetryPrefix + ".due.", events.RetryPrefix + ".ledger."}},
	{stream: topology.StreamHealth, all: true},
	{stream: topology.StreamNotify},
	{stream: topology.StreamAudit},
	{stream: topology.StreamDLQ},
	{stream: topology.StreamRecoveries},
}

// Collect reads the period's records from the bus and computes the report.
// It only reads, with direct gets: no consumer is created.
func Collect(ctx context.Context, js jetstream.JetStream, o Options) (*Report, error) {
	if !o.From.Before(o.To) {
		return nil, fmt.Errorf("report: the period is empty (from %s to %s)", o.From.Format(time.RFC3339), o.To.Format(time.RFC3339))
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	a := newAggregator(o.From, o.To)
	if o.Shadow != nil {
		sh, err := newShadowing(*o.Shadow)
		if err != nil {
			return nil, err
		}
		a.shadow = sh
		defer sh.s.Close()
	}
	// Open every reader first: the total for the progress line, and one
	// moment from which on nothing counts.
	readers := make([]*watch.Reader, len(sources))
	defer func() {
		for _, r := range readers {
			if r != nil {
				r.Close(ctx)
			}
		}
	}()
	var total uint64
	for i, s := range sources {
		cfg := watch.Config{Stream: s.stream, DeliverPolicy: jetstream.DeliverByStartTimePolicy, StartTime: &o.From, Direct: true}
		if s.all {
			cfg.DeliverPolicy, cfg.StartTime = jetstream.DeliverAllPolicy, nil
		}
		r, err := watch.Open(ctx, js, cfg)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			a.r.Notes = append(a.r.Notes, fmt.Sprintf("stream %s does not exist: its figures are empty (apply the topology)", s.stream))
			continue
		}
		if err != nil {
			return nil, err
		}
		readers[i] = r
		total += r.Pending()
	}
	progress := cli.NewProgress(o.Progress, "report: reading", total)
	for i, r := range readers {
		if r == nil {
			continue
		}
		stream, only := sources[i].stream, sources[i].only
		progress.Label("report: reading " + stream)
		err := r.Run(ctx, func(m jetstream.Msg) error {
			progress.Add(1)
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("read %s: %w", stream, err)
			}
			if !md.Timestamp.Before(o.To) {
				return watch.ErrStop // stored after the period: so is the rest
			}
			if len(only) > 0 && !hasPrefix(m.Subject(), only) {
				return nil
			}
			if !a.add(m, md.Sequence.Stream, md.Timestamp) {
				a.r.Undecodable[stream]++
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		r.Close(ctx)
		readers[i] = nil
	}
	progress.Label("report: read")
	progress.Done()
	r := a.finish(now())
	if a.shadow != nil {
		r.Shadow = a.shadow.finish()
	}
	return r, nil
}

// add folds one message in; false when it is not a record its subject
// carries.
func (a *aggregator) add(m jetstream.Msg, seq uint64, stored time.Time) bool {
	subject, h, data := m.Subject(), m.Headers(), m.Data()
	v, err := wiretypes.Bus.Decode(subject, h, data)
	if err != nil {
		return false
	}
	switch x := v.(type) {
	case *events.Outcome:
		a.outcome(x, stored)
		if a.shadow != nil {
			a.shadow.step(shadow.Record{Outcome: x, Seq: seq, Stored: stored})
		}
	case *events.Boundary:
		a.r.Totals.Boundaries++
		if a.shadow != nil {
			a.shadow.step(shadow.Record{Boundary: x, Seq: seq, Stored: stored})
		}
	case *events.Classification:
		a.classification(x, stored)
	case *events.Decision:
		a.decision(x)
	case *events.RetryDue:
		a.retryDue()
	case *events.Health:
		a.healthRecord(x, stored)
	case *events.Notification:
		a.notification(x)
	case *events.DeadLetter:
		a.deadLetter(x.Service, x.Reason)
	case *events.Recovery:
		a.recovery(x)
	default:
		return a.serviceRecord(v.SchemaName(), data, stored)
	}
	return true
}

// Schema names of the services' own records (their packages register
// them; they are read here by their wire keys, which are what the bus
// keeps).
const (
	schemaLedger      = "retry_ledger"
	schemaNotifyAudit = "notify_audit"
	schemaPolicyAudit = "scheduler_policy_audit"
)

// serviceKeys are the wire keys of the services' records the report uses.
type serviceKeys struct {
	At          events.Time `msgpack:"at"`
	RetryID     string      `msgpack:"retry_id"`
	StartedAt   events.Time `msgpack:"started_at"`
	CancelledAt events.Time `msgpack:"cancelled_at"`
	Kind        string      `msgpack:"kind"`
	Severity    string      `msgpack:"severity"`
	Final       bool        `msgpack:"final"`
	Source      string      `msgpack:"source"`
	PolicyKey   string      `msgpack:"policy_key"`
	Error       string      `msgpack:"error"`
}

func (a *aggregator) serviceRecord(schema string, data []byte, stored time.Time) bool {
	var k serviceKeys
	if err := msgpack.Unmarshal(data, &k); err != nil {
		return false
	}
	switch schema {
	case schemaLedger:
		a.ledgerEntry(k.RetryID, !k.StartedAt.IsZero(), !k.CancelledAt.IsZero())
	case schemaNotifyAudit:
		a.notifyAudit(k.Kind, k.Severity, k.Final)
	case schemaPolicyAudit:
		at := k.At
		if at.IsZero() {
			at = events.At(stored)
		}
		a.policyChange(PolicyChange{At: at, Kind: k.Kind, Source: k.Source, PolicyKey: k.PolicyKey, Error: k.Error})
	}
	return true // a record of a kind the report does not chart is not an error
}

// hasPrefix reports whether subject starts with one of prefixes.
func hasPrefix(subject string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(subject, p) {
			return true
		}
	}
	return false
}
