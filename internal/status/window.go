package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/streamread"
)

// window counts keys over the last span of time, by minute: what a stream
// holds over the last hour, kept up to date by reading only what was
// stored since the last look.
type window struct {
	span time.Duration
	// maxKeys bounds the distinct keys of one minute; past it a key
	// counts under otherKey.
	maxKeys int
	minutes map[int64]map[string]int
}

// otherKey is where a minute's keys past window.maxKeys are counted.
const otherKey = "\x00other"

func newWindow(span time.Duration, maxKeys int) *window {
	return &window{span: span, maxKeys: maxKeys, minutes: map[int64]map[string]int{}}
}

func (w *window) add(at time.Time, key string) {
	m := at.Unix() / 60
	counts := w.minutes[m]
	if counts == nil {
		counts = map[string]int{}
		w.minutes[m] = counts
	}
	if _, ok := counts[key]; !ok && len(counts) >= w.maxKeys {
		key = otherKey
	}
	counts[key]++
}

// totals sums the minutes inside the window ending at now, and forgets
// the older ones. The minute that straddles the window's start counts
// whole.
func (w *window) totals(now time.Time) map[string]int {
	from := now.Add(-w.span).Unix() / 60
	out := map[string]int{}
	for m, counts := range w.minutes {
		if m < from {
			delete(w.minutes, m)
			continue
		}
		for k, n := range counts {
			out[k] += n
		}
	}
	return out
}

// tail follows one stream (filtered) from a moment on, a page at a time,
// with direct gets only (no consumer: the operator's rights suffice).
type tail struct {
	stream, filter string
	// next is the first sequence not read yet; 0 until the start is found.
	next uint64
	// behind is set when the last read stopped at its page limit with more
	// to read.
	behind bool
}

// pageLimit bounds the messages one refresh reads from one stream, so a
// flood of dead letters slows the figures down, not the page.
const pageLimit = 2000

// read calls fn with each message stored since the last read (the first
// time: since from), at most pageLimit of them.
func (t *tail) read(ctx context.Context, js jetstream.JetStream, from time.Time, fn func(m *nats.Msg, stored time.Time)) error {
	if t.next == 0 {
		seq, err := firstSince(ctx, js, t.stream, t.filter, from)
		if err != nil {
			return err
		}
		if seq == 0 {
			// Nothing since from: start after the stream's last message.
			info, err := streamLastSeq(ctx, js, t.stream)
			if err != nil {
				return err
			}
			t.next = info + 1
			return nil
		}
		t.next = seq
	}
	n := 0
	err := streamread.ReadFrom(ctx, js, t.stream, t.filter, t.next, 0, pageLimit, func(m *nats.Msg) error {
		seq, err := strconv.ParseUint(streamread.ServerHeader(m, jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return fmt.Errorf("read %s: sequence: %w", t.stream, err)
		}
		stored, err := time.Parse(time.RFC3339Nano, streamread.ServerHeader(m, jetstream.TimeStampHeaer))
		if err != nil {
			return fmt.Errorf("read %s: time stamp: %w", t.stream, err)
		}
		t.next = seq + 1
		n++
		fn(m, stored)
		return nil
	})
	t.behind = n >= pageLimit
	return err
}

func streamLastSeq(ctx context.Context, js jetstream.JetStream, stream string) (uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	return s.CachedInfo().State.LastSeq, nil
}

// byTimeRequest is a direct get of the first message stored at or after a
// time.
type byTimeRequest struct {
	StartTime time.Time `json:"start_time"`
	NextFor   string    `json:"next_by_subj,omitempty"`
}

// firstSince returns the sequence of the first message of stream matching
// filter stored at or after t; 0 when there is none. One direct get.
func firstSince(ctx context.Context, js jetstream.JetStream, stream, filter string, t time.Time) (uint64, error) {
	body, err := json.Marshal(byTimeRequest{StartTime: t.UTC(), NextFor: filter})
	if err != nil {
		return 0, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, readTimeout)
		defer cancel()
	}
	m, err := js.Conn().RequestWithContext(ctx, apiPrefix(js.Options())+"DIRECT.GET."+stream, body)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return 0, fmt.Errorf("stream %s: %w", stream, jetstream.ErrStreamNotFound)
		}
		return 0, fmt.Errorf("stream %s: first message since %s: %w", stream, t.Format(time.RFC3339), err)
	}
	seqText := streamread.ServerHeader(m, jetstream.SequenceHeader)
	if seqText == "" {
		if m.Header.Get("Status") == "404" {
			return 0, nil
		}
		return 0, fmt.Errorf("stream %s: first message since %s: %s %s", stream, t.Format(time.RFC3339), m.Header.Get("Status"), m.Header.Get("Description"))
	}
	return strconv.ParseUint(seqText, 10, 64)
}

// apiPrefix is the JetStream API prefix js sends requests under.
func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	}
	return "$JS.API."
}
