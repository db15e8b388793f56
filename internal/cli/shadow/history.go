package shadow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Range selects the recorded history by stream position or store time.
// The zero Range is all of it.
type Range struct {
	// StartSeq starts at this sequence of FAILBUS_OUTCOMES (0: the first).
	StartSeq uint64
	// StartTime starts at the first record stored at or after it (zero:
	// from StartSeq, or the first).
	StartTime time.Time
	// Until stops before the first record stored at or after it (zero:
	// every record stored when the read began).
	Until time.Time
	// EndSeq stops after this sequence (0: no limit).
	EndSeq uint64
}

// Record is one recorded input: an outcome or a boundary, where and when it
// was stored.
type Record struct {
	Outcome  *events.Outcome
	Boundary *events.Boundary
	// Seq and Stored say where and when the stream stored it.
	Seq    uint64
	Stored time.Time
}

// At is the time the services went by for the record (events.EventTime):
// its own time when believed, else when the stream stored it.
func (r Record) At() time.Time {
	var at events.Time
	switch {
	case r.Outcome != nil:
		at = r.Outcome.At
	case r.Boundary != nil:
		at = r.Boundary.At
	}
	t, _ := events.EventTime(at, r.Stored)
	return t
}

// ReadStats counts what a history read saw.
type ReadStats struct {
	// Records were passed on; Skipped were stored messages that are not
	// outcomes or boundaries (junk the classifier dead-lettered: it never
	// decided on them either).
	Records, Skipped int
	// FirstSeq and LastSeq bound what was read (0 when nothing).
	FirstSeq, LastSeq uint64
}

// ReadBus reads the outcomes and boundaries FAILBUS_OUTCOMES holds in r, in
// stream order (the order the classifier took them in), with direct gets
// (watch.Config.Direct): no consumer is created, nothing is left behind
// and nothing is acknowledged. progress, when a terminal, shows how far it has come.
func ReadBus(ctx context.Context, js jetstream.JetStream, r Range, progress io.Writer, fn func(Record) error) (ReadStats, error) {
	var st ReadStats
	cfg := watch.Config{Stream: topology.StreamOutcomes, DeliverPolicy: jetstream.DeliverAllPolicy, Direct: true}
	switch {
	case !r.StartTime.IsZero():
		start := r.StartTime
		cfg.DeliverPolicy, cfg.StartTime = jetstream.DeliverByStartTimePolicy, &start
	case r.StartSeq > 0:
		cfg.DeliverPolicy, cfg.StartSeq = jetstream.DeliverByStartSequencePolicy, r.StartSeq
	}
	rd, err := watch.Open(ctx, js, cfg)
	if err != nil {
		return st, err
	}
	defer rd.Close(ctx)
	p := cli.NewProgress(progress, "shadow: reading "+topology.StreamOutcomes, rd.Pending())
	defer p.Done()
	err = rd.Run(ctx, func(m jetstream.Msg) error {
		p.Add(1)
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("read %s: %w", topology.StreamOutcomes, err)
		}
		seq := md.Sequence.Stream
		if r.EndSeq > 0 && seq > r.EndSeq || !r.Until.IsZero() && !md.Timestamp.Before(r.Until) {
			return watch.ErrStop
		}
		if st.FirstSeq == 0 {
			st.FirstSeq = seq
		}
		st.LastSeq = seq
		rec := Record{Seq: seq, Stored: md.Timestamp}
		v, err := events.Decode(m.Subject(), m.Headers(), m.Data())
		switch x := v.(type) {
		case *events.Outcome:
			rec.Outcome = x
		case *events.Boundary:
			rec.Boundary = x
		}
		if err != nil || rec.Outcome == nil && rec.Boundary == nil {
			st.Skipped++
			return nil
		}
		st.Records++
		return fn(rec)
	})
	if errors.Is(err, watch.ErrStop) {
		err = nil
	}
	return st, err
}
