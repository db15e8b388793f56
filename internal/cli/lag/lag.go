// Package lag is `failbus lag`: how far behind each durable consumer is —
// messages not yet delivered (pending), delivered but not acknowledged (ack
// pending), redelivered, and the age of the oldest message it has not
// processed — once, or refreshed with --watch. It only reads: the consumer
// list and info, and one direct get per consumer for the oldest
// unprocessed message's store time (the `operator` role may run it).
package lag

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/durable"
	"github.com/failbus/failbus/pkg/events"
)

// Command is `failbus lag`.
var Command = cli.Command{Name: "lag", Summary: "how far behind each durable consumer (service) is: pending, ack pending, redelivered, oldest unprocessed age", Run: run}

const usage = `[--server URL] [--stream NAME] [--watch [--interval 2s] [--count N]] [--json] [CONSUMER...]

Lists every durable consumer of every stream (or of --stream, or only the
named ones) with:

  pending      messages that match its filter and were not yet delivered
  ack pending  delivered, not yet acknowledged (in a handler, or lost with
               a crashed process until AckWait runs out)
  redelivered  of those, how many were delivered more than once
  oldest       age of the oldest message it has not processed: the first
               message after its ack floor (store time, so a consumer
               that is idle but behind still shows how far)
  waiting      pull requests waiting: 0 means no process is reading it
  last ack     how long ago the ack floor last moved

--json prints one JSON object per consumer per refresh instead of the
table. --watch refreshes every --interval until interrupted (or --count
refreshes); on a terminal the table is redrawn in place.`

// DefaultInterval is the --watch refresh interval unless told otherwise.
const DefaultInterval = 2 * time.Second

// Lag is one durable consumer's position, as --json prints it.
type Lag struct {
	// At is when the figures were read.
	At      events.Time `json:"at"`
	Stream  string      `json:"stream"`
	Durable string      `json:"consumer"`
	// Filters are the consumer's subject filters (none: the whole stream).
	Filters []string `json:"filters,omitempty"`
	// Pending: matching messages not yet delivered.
	Pending uint64 `json:"pending"`
	// AckPending: delivered, not yet acknowledged.
	AckPending int `json:"ack_pending"`
	// Redelivered: ack-pending messages delivered more than once.
	Redelivered int `json:"redelivered"`
	// Waiting: pull requests waiting (0: nobody is reading).
	Waiting int `json:"waiting"`
	// OldestSeq and OldestAt are the stream sequence and store time of the
	// oldest message the consumer has not processed; zero when it has
	// processed everything.
	OldestSeq uint64      `json:"oldest_unprocessed_seq,omitempty"`
	OldestAt  events.Time `json:"oldest_unprocessed_at,omitzero"`
	// OldestAgeMS is At − OldestAt in milliseconds (0 when caught up).
	OldestAgeMS int64 `json:"oldest_unprocessed_age_ms"`
	// AckFloorSeq is the stream sequence every message up to which is
	// acknowledged.
	AckFloorSeq uint64 `json:"ack_floor_seq"`
	// LastAckAt is when the ack floor last moved (zero: never).
	LastAckAt events.Time `json:"last_ack_at,omitzero"`
	// Paused is set while the consumer is paused (until PausedUntil).
	Paused      bool        `json:"paused,omitempty"`
	PausedUntil events.Time `json:"paused_until,omitzero"`
	// Retired is set for a durable an earlier failbus created and this one
	// retired: nothing reads it; `failbus apply` deletes it.
	Retired bool `json:"retired,omitempty"`
}

// CaughtUp reports whether the consumer has processed everything stored.
func (l *Lag) CaughtUp() bool { return l.Pending == 0 && l.AckPending == 0 }

// Options select the consumers Read reports.
type Options struct {
	// Stream limits the report to one stream ("" for all).
	Stream string
	// Consumers limits it to these durable names (none for all).
	Consumers []string
}

// Read returns the lag of every durable consumer o selects, sorted by
// stream and name, measured at now. Ephemeral consumers (tail's, shadow's)
// are left out: they have no service behind them to be late.
func Read(ctx context.Context, js jetstream.JetStream, o Options, now time.Time) ([]Lag, error) {
	var streams []string
	if o.Stream != "" {
		streams = []string{o.Stream}
	} else {
		names := js.StreamNames(ctx)
		for n := range names.Name() {
			streams = append(streams, n)
		}
		if err := names.Err(); err != nil {
			return nil, fmt.Errorf("list streams: %w", err)
		}
		slices.Sort(streams)
	}
	var out []Lag
	found := map[string]bool{}
	for _, name := range streams {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		list := s.ListConsumers(ctx)
		var infos []*jetstream.ConsumerInfo
		for ci := range list.Info() {
			if ci.Config.Durable == "" || len(o.Consumers) > 0 && !slices.Contains(o.Consumers, ci.Name) {
				continue
			}
			infos = append(infos, ci)
		}
		if err := list.Err(); err != nil {
			return nil, fmt.Errorf("list the consumers of %s: %w", name, err)
		}
		slices.SortFunc(infos, func(a, b *jetstream.ConsumerInfo) int { return strings.Compare(a.Name, b.Name) })
		for _, ci := range infos {
			l, err := lagOf(ctx, s, ci, now)
			if err != nil {
				return nil, err
			}
			found[ci.Name] = true
			out = append(out, l)
		}
	}
	var missing []string
	for _, c := range o.Consumers {
		if !found[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		where := "any stream"
		if o.Stream != "" {
			where = o.Stream
		}
		return out, fmt.Errorf("no durable consumer %s on %s", strings.Join(missing, ", "), where)
	}
	return out, nil
}

// lagOf measures one consumer.
func lagOf(ctx context.Context, s jetstream.Stream, ci *jetstream.ConsumerInfo, now time.Time) (Lag, error) {
	filters := ci.Config.FilterSubjects
	if ci.Config.FilterSubject != "" {
		filters = append([]string{ci.Config.FilterSubject}, filters...)
	}
	l := Lag{
		At:          events.At(now),
		Stream:      ci.Stream,
		Durable:     ci.Name,
		Filters:     filters,
		Pending:     ci.NumPending,
		AckPending:  ci.NumAckPending,
		Redelivered: ci.NumRedelivered,
		Waiting:     ci.NumWaiting,
		AckFloorSeq: ci.AckFloor.Stream,
		Paused:      ci.Paused,
		Retired:     durable.IsRetired(ci.Stream, ci.Name),
	}
	if ci.AckFloor.Last != nil {
		l.LastAckAt = events.At(*ci.AckFloor.Last)
	}
	if ci.Paused {
		l.PausedUntil = events.At(now.Add(ci.PauseRemaining))
	}
	if l.CaughtUp() {
		return l, nil
	}
	seq, at, err := oldestAfter(ctx, s, ci.AckFloor.Stream, filters)
	if err != nil {
		return l, fmt.Errorf("consumer %s on %s: oldest unprocessed message: %w", ci.Name, ci.Stream, err)
	}
	if seq != 0 {
		l.OldestSeq, l.OldestAt = seq, events.At(at)
		l.OldestAgeMS = max(0, now.Sub(at).Milliseconds())
	}
	return l, nil
}

// oldestAfter finds the first stored message after floor that matches one
// of filters: every message up to the ack floor is acknowledged, so this
// is the oldest one the consumer has not processed. It returns seq 0 when
// there is none (removed by the stream's limits since the info was read).
func oldestAfter(ctx context.Context, s jetstream.Stream, floor uint64, filters []string) (uint64, time.Time, error) {
	if len(filters) == 0 {
		filters = []string{">"}
	}
	var (
		best   uint64
		bestAt time.Time
	)
	for _, f := range filters {
		m, err := s.GetMsg(ctx, floor+1, jetstream.WithGetMsgSubject(f))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, time.Time{}, err
		}
		if best == 0 || m.Sequence < best {
			best, bestAt = m.Sequence, m.Time
		}
	}
	return best, bestAt, nil
}

// options are the parsed flags.
type options struct {
	Options
	watch    bool
	interval time.Duration
	count    int
	json     bool
}

func run(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("lag", usage, stderr)
	var conn cli.Conn
	conn.Register(fs)
	var o options
	fs.StringVar(&o.Stream, "stream", "", "only the consumers of this stream")
	fs.BoolVar(&o.watch, "watch", false, "refresh every --interval until interrupted")
	fs.DurationVar(&o.interval, "interval", DefaultInterval, "refresh interval of --watch")
	fs.IntVar(&o.count, "count", 0, "with --watch: stop after N refreshes (0: until interrupted)")
	fs.BoolVar(&o.json, "json", false, "one JSON object per consumer instead of the table")
	consumers, code, done := cli.Parse(fs, args)
	if done {
		return code
	}
	o.Consumers = consumers
	switch {
	case o.interval <= 0:
		return cli.UsageError(fs, stderr, "--interval must be positive")
	case o.count < 0:
		return cli.UsageError(fs, stderr, "--count must be positive")
	case o.count > 0 && !o.watch:
		return cli.UsageError(fs, stderr, "--count needs --watch")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	nc, js, err := conn.JetStream(ctx, "lag")
	if err != nil {
		fmt.Fprintf(stderr, "failbus lag: %v\n", err)
		return 1
	}
	defer nc.Close()
	// The server answers a denied request by reporting the denial, not by
	// replying: fail at once, naming it, instead of waiting for a timeout.
	ctx, failFast := nc.FailFast(ctx)
	defer failFast()
	if err := loop(ctx, js, o, stdout); err != nil {
		fmt.Fprintf(stderr, "failbus lag: %v\n", nc.Explain(err))
		return 1
	}
	return 0
}

// loop prints the figures once, or every interval with --watch.
func loop(ctx context.Context, js jetstream.JetStream, o options, w io.Writer) error {
	redraw := o.watch && !o.json && cli.IsTerminal(w)
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	for n := 1; ; n++ {
		now := time.Now()
		lags, err := Read(ctx, js, o.Options, now)
		if denial := connect.Denied(ctx); denial != nil {
			return denial
		}
		if err != nil && ctx.Err() != nil {
			return nil
		}
		if err != nil && len(lags) == 0 {
			return err
		}
		switch {
		case o.json:
			enc := json.NewEncoder(w)
			for i := range lags {
				if werr := enc.Encode(&lags[i]); werr != nil {
					return fmt.Errorf("write output: %w", werr)
				}
			}
		default:
			if redraw {
				fmt.Fprint(w, "\x1b[H\x1b[2J") // home, clear screen
			}
			if o.watch {
				fmt.Fprintf(w, "%s  (every %s; Ctrl-C stops)\n", now.Format(time.DateTime), o.interval)
			}
			if werr := Table(w, lags); werr != nil {
				return werr
			}
		}
		if err != nil {
			return err // a named consumer is missing: print what exists, then say so
		}
		if !o.watch || o.count > 0 && n >= o.count {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Table writes lags as an aligned table a person reads: names left,
// figures right.
func Table(w io.Writer, lags []Lag) error {
	rows := [][]string{{"STREAM", "CONSUMER", "PENDING", "ACK PENDING", "REDELIVERED", "OLDEST", "WAITING", "LAST ACK"}}
	for _, l := range lags {
		oldest := "-"
		if l.OldestSeq != 0 {
			oldest = Age(time.Duration(l.OldestAgeMS) * time.Millisecond)
		}
		last := "never"
		if !l.LastAckAt.IsZero() {
			last = Age(l.At.Sub(l.LastAckAt.Time)) + " ago"
		}
		name := l.Durable
		if l.Paused {
			name += " (paused)"
		}
		if l.Retired {
			name += " (retired: failbus apply deletes it)"
		}
		rows = append(rows, []string{l.Stream, name, strconv.FormatUint(l.Pending, 10), strconv.Itoa(l.AckPending),
			strconv.Itoa(l.Redelivered), oldest, strconv.Itoa(l.Waiting), last})
	}
	if err := cli.WriteTable(w, rows, 2, 3, 4, 5, 6); err != nil {
		return err
	}
	if len(lags) == 0 {
		if _, err := fmt.Fprintln(w, "no durable consumers (is the topology applied? `failbus dev` does it)"); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
	}
	return nil
}

// Age is a duration as a person reads it: "850ms", "42s", "3m05s",
// "2h07m", "3d04h".
func Age(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
		fallthrough
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}
