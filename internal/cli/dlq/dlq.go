package dlq

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/cli/lag"
	"github.com/failbus/failbus/internal/requeue"
	"github.com/failbus/failbus/pkg/events"
)

// Command is `failbus dlq`.
var Command = cli.Command{Name: "dlq", Summary: "dead letters: list them (ls), show one decoded (show), put them back on their subject once (requeue)", Run: run}

const usage = `ls|show|requeue [flags] [SEQ...]

  failbus dlq ls [--service S] [--since D | --start-seq N] [--reason TEXT] [--subject FILTER] [--json]
      one line per dead letter: sequence, when, service, original subject,
      reason, and whether it was requeued (and where the copy is)
  failbus dlq show SEQ... [--json]
      a dead letter whole: reason, original subject and headers, the
      original payload decoded, where the input is when only a prefix was
      kept, its requeue record
  failbus dlq requeue SEQ... | --all [filters of ls] [--dry-run] [--json]
      publishes each dead letter's original bytes and headers to its
      original subject, with Failbus-Requeued-From naming the dead letter
      and Failbus-Requeue-For naming the service that dead-lettered it (the
      only consumer that handles the copy). Each dead letter is requeued
      once: a second requeue, by anyone, reports where the copy is; an
      interrupted one is finished without a second copy. Needs a user
      allowed to publish to the original subjects and to write KV bucket
      FAILBUS_DLQ_REQUEUES (the admin role); ls and show only read.

SEQ is the dead letter's sequence in FAILBUS_DLQ (ls prints it).`

func run(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		fmt.Fprintf(stderr, "Usage: failbus dlq %s\n", usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "ls", "show", "requeue":
	default:
		fmt.Fprintf(stderr, "failbus dlq: unknown subcommand %q (ls, show or requeue)\n\nUsage: failbus dlq %s\n", sub, usage)
		return 2
	}
	fs := cli.NewFlagSet("dlq "+sub, usage, stderr)
	var conn cli.Conn
	conn.Register(fs)
	var (
		sel      Select
		services string
		since    time.Duration
		asJSON   bool
		all      bool
		dryRun   bool
	)
	fs.BoolVar(&asJSON, "json", false, "JSON (one object per dead letter) instead of text")
	if sub != "show" {
		fs.StringVar(&services, "service", "", "only the dead letters of these services (comma-separated)")
		fs.DurationVar(&since, "since", 0, "only dead letters stored in the last DURATION")
		fs.Uint64Var(&sel.StartSeq, "start-seq", 0, "only dead letters from this sequence on")
		fs.StringVar(&sel.Reason, "reason", "", "only dead letters whose reason contains TEXT")
		fs.StringVar(&sel.Subject, "subject", "", "only dead letters whose original subject matches FILTER (wildcards allowed)")
	}
	if sub == "requeue" {
		fs.BoolVar(&all, "all", false, "requeue every dead letter the filters select that was not requeued yet")
		fs.BoolVar(&dryRun, "dry-run", false, "say what would be requeued, publish nothing")
	}
	pos, code, done := cli.Parse(fs, rest)
	if done {
		return code
	}
	seqs, err := parseSeqs(pos)
	if err != nil {
		return cli.UsageError(fs, stderr, "%v", err)
	}
	if services != "" {
		sel.Services = strings.Split(services, ",")
	}
	if since < 0 {
		return cli.UsageError(fs, stderr, "--since must be positive")
	}
	if since > 0 {
		if sel.StartSeq > 0 {
			return cli.UsageError(fs, stderr, "--since and --start-seq exclude each other")
		}
		sel.Since = time.Now().Add(-since)
	}
	switch {
	case sub == "ls" && len(seqs) > 0:
		return cli.UsageError(fs, stderr, "ls takes no sequences (show does)")
	case sub == "show" && len(seqs) == 0:
		return cli.UsageError(fs, stderr, "show needs the sequence of at least one dead letter (from failbus dlq ls)")
	case sub == "requeue" && len(seqs) == 0 && !all:
		return cli.UsageError(fs, stderr, "requeue needs sequences, or --all to requeue every dead letter the filters select")
	case sub == "requeue" && len(seqs) > 0 && all:
		return cli.UsageError(fs, stderr, "give sequences or --all, not both")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	nc, js, err := conn.JetStream(ctx, "dlq "+sub)
	if err != nil {
		fmt.Fprintf(stderr, "failbus dlq: %v\n", err)
		return 1
	}
	defer nc.Close()
	// A denied publish (requeue as a user without the admin role) fails
	// at once, naming the permission, instead of timing out.
	ctx, stopFailFast := nc.FailFast(ctx)
	defer stopFailFast()
	fail := func(err error) int {
		fmt.Fprintf(stderr, "failbus dlq %s: %v\n", sub, nc.Explain(err))
		return 1
	}
	switch sub {
	case "ls":
		letters, err := List(ctx, js, sel)
		if err != nil && len(letters) == 0 {
			return fail(err) // nothing read: not "no dead letters"
		}
		if werr := writeList(stdout, letters, asJSON, time.Now()); werr != nil {
			return fail(werr)
		}
		if err != nil {
			return fail(err) // the letters were read, their requeue marks not
		}
	case "show":
		failed := false
		for i, seq := range seqs {
			l, err := Get(ctx, js, "", seq)
			if err != nil {
				fmt.Fprintf(stderr, "failbus dlq show: %v\n", nc.Explain(err))
				failed = true
				continue
			}
			if i > 0 && !asJSON {
				fmt.Fprintln(stdout)
			}
			if err := writeShow(ctx, js, stdout, &l, asJSON, time.Now()); err != nil {
				return fail(err)
			}
		}
		if failed {
			return 1
		}
	case "requeue":
		if all {
			letters, err := List(ctx, js, sel)
			if err != nil {
				return fail(err)
			}
			for _, l := range letters {
				if l.DL != nil && (l.Mark == nil || l.Mark.State != MarkRequeued) {
					seqs = append(seqs, l.Seq)
				}
			}
			if len(seqs) == 0 {
				fmt.Fprintln(stderr, "failbus dlq requeue: no dead letter to requeue (the filters select none that is not requeued yet)")
				return 0
			}
		}
		q := &Requeuer{JS: js, By: operator(nc.User())}
		return requeueAll(ctx, q, js, seqs, dryRun, asJSON, stdout, stderr, nc.Explain)
	}
	return 0
}

// requeueAll requeues seqs one after another and reports each; it returns
// the exit code (1 when any failed).
func requeueAll(ctx context.Context, q *Requeuer, js jetstream.JetStream, seqs []uint64, dryRun, asJSON bool, stdout, stderr io.Writer, explain func(error) error) int {
	failed := 0
	enc := json.NewEncoder(stdout)
	for _, seq := range seqs {
		if dryRun {
			l, err := Get(ctx, js, q.Stream, seq)
			if err == nil && l.DL == nil {
				err = fmt.Errorf("%s is not a dead letter: %w", l.ID(), l.Err)
			}
			if err == nil {
				_, err = OriginalOf(ctx, js, &l)
			}
			if err != nil {
				fmt.Fprintf(stderr, "failbus dlq requeue: %v\n", explain(err))
				failed++
				continue
			}
			state := "would requeue"
			if l.Mark != nil && l.Mark.State == MarkRequeued {
				state = "already requeued to " + requeue.From(l.Mark.Stream, l.Mark.Seq) + "; would publish nothing"
			}
			fmt.Fprintf(stdout, "%s: %s → %s (for %s)\n", l.ID(), state, l.DL.Subject, l.DL.Service)
			continue
		}
		res, err := q.Requeue(ctx, seq)
		if err != nil {
			fmt.Fprintf(stderr, "failbus dlq requeue: %v\n", explain(err))
			failed++
			continue
		}
		if asJSON {
			if err := enc.Encode(res); err != nil {
				fmt.Fprintf(stderr, "failbus dlq requeue: write output: %v\n", err)
				return 1
			}
			continue
		}
		copyAt := requeue.From(res.Stream, res.Seq)
		switch {
		case res.Already:
			fmt.Fprintf(stdout, "%s: already requeued by %s at %s → %s (%s); nothing published\n",
				res.DeadLetter, res.Mark.By, res.Mark.RequeuedAt.Format(time.RFC3339), res.Subject, copyAt)
		case res.Found:
			fmt.Fprintf(stdout, "%s: finished an interrupted requeue: its copy was already stored → %s (%s); nothing published\n",
				res.DeadLetter, res.Subject, copyAt)
		default:
			fmt.Fprintf(stdout, "%s: requeued → %s (%s)\n", res.DeadLetter, res.Subject, copyAt)
		}
	}
	if failed > 0 {
		fmt.Fprintf(stderr, "failbus dlq requeue: %d of %d failed\n", failed, len(seqs))
		return 1
	}
	return 0
}

// operator names who requeues: the NATS user, the host and the process.
func operator(user string) string {
	host, _ := os.Hostname()
	if user == "" {
		user = os.Getenv("USER")
	}
	return fmt.Sprintf("%s@%s:%d", user, host, os.Getpid())
}

func parseSeqs(args []string) ([]uint64, error) {
	var out []uint64
	for _, a := range args {
		a = strings.TrimPrefix(a, "FAILBUS_DLQ:")
		n, err := strconv.ParseUint(a, 10, 64)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%q is not a dead letter's sequence (a positive number, as failbus dlq ls prints)", a)
		}
		out = append(out, n)
	}
	return out, nil
}

// listLine is one dead letter as `dlq ls --json` prints it.
type listLine struct {
	Seq      uint64      `json:"seq"`
	Time     events.Time `json:"time"`
	Service  string      `json:"service,omitempty"`
	Subject  string      `json:"subject,omitempty"`
	Reason   string      `json:"reason,omitempty"`
	Stream   string      `json:"stream,omitempty"`
	OrigSeq  uint64      `json:"orig_seq,omitempty"`
	Bytes    int         `json:"bytes"`
	Whole    *Whole      `json:"whole,omitempty"`
	Error    string      `json:"error,omitempty"`
	Requeue  *Mark       `json:"requeue,omitempty"`
	Requeued bool        `json:"requeued"`
}

func writeList(w io.Writer, letters []Letter, asJSON bool, now time.Time) error {
	if asJSON {
		enc := json.NewEncoder(w)
		for _, l := range letters {
			ln := listLine{Seq: l.Seq, Time: events.At(l.Time), Requeue: l.Mark, Requeued: l.Mark != nil && l.Mark.State == MarkRequeued}
			if l.DL != nil {
				ln.Service, ln.Subject, ln.Reason, ln.Stream, ln.OrigSeq, ln.Bytes = l.DL.Service, l.DL.Subject, l.DL.Reason, l.DL.Stream, l.DL.Seq, len(l.DL.Data)
				if l.Whole.Truncated {
					ln.Whole = &l.Whole
				}
			} else {
				ln.Error = l.Err.Error()
			}
			if err := enc.Encode(ln); err != nil {
				return fmt.Errorf("write output: %w", err)
			}
		}
		return nil
	}
	if len(letters) == 0 {
		_, err := fmt.Fprintln(w, "no dead letters")
		return err
	}
	rows := [][]string{{"SEQ", "STORED", "SERVICE", "SUBJECT", "REASON", "REQUEUED"}}
	for _, l := range letters {
		age := lag.Age(now.Sub(l.Time)) + " ago"
		if l.DL == nil {
			rows = append(rows, []string{strconv.FormatUint(l.Seq, 10), age, "?", l.Subject, oneLine("not a dead letter: "+l.Err.Error(), 70), "-"})
			continue
		}
		rows = append(rows, []string{strconv.FormatUint(l.Seq, 10), age, l.DL.Service, l.DL.Subject, oneLine(l.DL.Reason, 70), markText(l.Mark, now)})
	}
	return cli.WriteTable(w, rows)
}

// markText is the REQUEUED column.
func markText(mk *Mark, now time.Time) string {
	switch {
	case mk == nil:
		return "-"
	case mk.State == MarkRequeued:
		return lag.Age(now.Sub(mk.RequeuedAt)) + " ago → " + requeue.From(mk.Stream, mk.Seq)
	}
	return "interrupted (claimed " + lag.Age(now.Sub(mk.ClaimedAt)) + " ago by " + mk.By + "): requeue again to finish"
}

// oneLine flattens s to one line of at most n characters.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// showLine is one dead letter as `dlq show --json` prints it.
type showLine struct {
	Seq        uint64          `json:"seq"`
	Time       events.Time     `json:"time"`
	Subject    string          `json:"subject"`
	MsgID      string          `json:"msg_id,omitempty"`
	DeadLetter json.RawMessage `json:"dead_letter,omitempty"`
	Error      string          `json:"error,omitempty"`
	// Original is the whole original input when the dead letter kept only
	// a prefix and the input is still stored.
	Original      json.RawMessage `json:"original,omitempty"`
	OriginalAs    string          `json:"original_as,omitempty"`
	OriginalFrom  string          `json:"original_from,omitempty"`
	OriginalError string          `json:"original_error,omitempty"`
	Requeue       *Mark           `json:"requeue,omitempty"`
}

func writeShow(ctx context.Context, js jetstream.JetStream, w io.Writer, l *Letter, asJSON bool, now time.Time) error {
	var orig *Original
	var origErr error
	if l.DL != nil && l.Whole.Truncated {
		orig, origErr = OriginalOf(ctx, js, l)
	}
	if asJSON {
		sl := showLine{Seq: l.Seq, Time: events.At(l.Time), Subject: l.Subject, MsgID: l.MsgID, Requeue: l.Mark}
		if l.DL != nil {
			b, err := cli.DeadLetterJSON(l.DL)
			if err != nil {
				return err
			}
			sl.DeadLetter = b
		} else {
			sl.Error = l.Err.Error()
		}
		if orig != nil {
			sl.Original, sl.OriginalAs = cli.PayloadJSON(orig.Data)
			sl.OriginalFrom = orig.From
		}
		if origErr != nil {
			sl.OriginalError = origErr.Error()
		}
		return json.NewEncoder(w).Encode(sl)
	}

	var b strings.Builder
	field := func(name, format string, args ...any) {
		fmt.Fprintf(&b, "%-12s %s\n", name, fmt.Sprintf(format, args...))
	}
	field("dead letter", "%s  stored %s (%s ago)", l.ID(), l.Time.UTC().Format(time.RFC3339), lag.Age(now.Sub(l.Time)))
	if l.DL == nil {
		field("error", "not a dead letter: %v", l.Err)
		_, err := io.WriteString(w, b.String())
		return err
	}
	dl := l.DL
	field("service", "%s", dl.Service)
	field("reason", "%s", dl.Reason)
	where := ""
	if dl.Stream != "" {
		where = "  (was " + requeue.From(dl.Stream, dl.Seq) + ")"
	}
	field("subject", "%s%s", dl.Subject, where)
	keys := make([]string, 0, len(dl.Headers))
	for k := range dl.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		name := ""
		if i == 0 {
			name = "headers"
		}
		field(name, "%s: %s", k, strings.Join(dl.Headers[k], ", "))
	}
	data := dl.Data
	switch {
	case l.Whole.Truncated && orig != nil:
		field("payload", "the dead letter kept %d of %d bytes; the whole input, read back from %s (sha256 matches):", len(dl.Data), l.Whole.Len, orig.From)
		data = orig.Data
	case l.Whole.Truncated:
		field("payload", "the dead letter kept the first %d of %d bytes (sha256 %s); %v. The kept prefix:", len(dl.Data), l.Whole.Len, l.Whole.SHA256, origErr)
	default:
		field("payload", "%d bytes:", len(data))
	}
	out, as := cli.PayloadJSON(data)
	if as == cli.PayloadMsgpack {
		var ind bytes.Buffer
		if json.Indent(&ind, out, "  ", "  ") == nil {
			out = ind.Bytes()
		}
	}
	fmt.Fprintf(&b, "  %s  (%s)\n", out, as)
	switch mk := l.Mark; {
	case mk == nil:
		field("requeued", "no")
	case mk.State == MarkRequeued:
		field("requeued", "by %s at %s → %s (%s)", mk.By, mk.RequeuedAt.Format(time.RFC3339), mk.Subject, requeue.From(mk.Stream, mk.Seq))
	default:
		field("requeued", "interrupted: claimed by %s at %s; requeue again to finish", mk.By, mk.ClaimedAt.Format(time.RFC3339))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
