package shadow

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/engine/sim"
	"github.com/failbus/failbus/pkg/policy"
)

// Command is `failbus shadow`.
var Command = cli.Command{Name: "shadow", Summary: "audit a policy change: replay recorded history under the base and the new policy, list every decision that differs", Run: run}

const usage = `--policy NEW [--base FILE] [--server URL] [--since D | --start-time T | --start-seq N] [--until T] [--end-seq N] [--input FILE|-] [--seed N]

Replays the recorded history through the whole decision engine twice, on
in-memory stores at the recorded times — under --base (default: the
default policy; give the policy the bus ran) and under --policy — and
writes one JSON line per outcome whose decision differs (action, delay,
retry number):

  {"type":"diff","outcome_id":"o-17","at":"...","agent":"bot","provider":"openai",
   "class":"rate_limit","base":{decision},"new":{decision}}

then {"type":"summary","outcomes":N,"differ":M,"changes":{"retry→give_up":k}}.

History: the outcomes and boundaries in FAILBUS_OUTCOMES (default: all of
them; --since, --start-time or --start-seq, and --until or --end-seq,
select a range by when they were stored or by stream sequence; the
summary's first_seq and last_seq say what was read), read with an
ordered consumer that is deleted when done; or, with --input,
simulate-format JSON Lines (a file, or - for stdin; recovery's records
too). It only reads: nothing is published and no sink is called.
Progress goes to stderr when it is a terminal.`

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("shadow", usage, stderr)
	var conn cli.Conn
	conn.Register(fs)
	newPath := fs.String("policy", "", "the new policy (YAML file); required")
	basePath := fs.String("base", "", "the base policy (default: the default policy)")
	since := fs.Duration("since", 0, "replay what was stored in the last DURATION")
	startTime := fs.String("start-time", "", "replay from this store time (RFC 3339)")
	startSeq := fs.Uint64("start-seq", 0, "replay from this sequence of FAILBUS_OUTCOMES")
	until := fs.String("until", "", "stop before this store time (RFC 3339)")
	endSeq := fs.Uint64("end-seq", 0, "stop after this sequence of FAILBUS_OUTCOMES")
	input := fs.String("input", "", "replay simulate-format JSON Lines from FILE (- for stdin) instead of the bus")
	seed := fs.Uint64("seed", 0, "vary the jitter's draw: 0 draws it as the bus does, from each outcome's id (the same seed and history give the same output)")
	if rest, code, done := cli.Parse(fs, args); done {
		return code
	} else if len(rest) > 0 {
		return cli.UsageError(fs, stderr, "unexpected arguments %q", rest)
	}
	if *newPath == "" {
		return cli.UsageError(fs, stderr, "--policy NEW is required: the policy to audit")
	}
	var rng Range
	starts := 0
	for _, set := range []bool{*since != 0, *startTime != "", *startSeq != 0} {
		if set {
			starts++
		}
	}
	switch {
	case starts > 1:
		return cli.UsageError(fs, stderr, "--since, --start-time and --start-seq exclude each other")
	case *since < 0:
		return cli.UsageError(fs, stderr, "--since must be positive")
	case *input != "" && (starts > 0 || *until != "" || *endSeq != 0):
		return cli.UsageError(fs, stderr, "--input replays a file: --since, --start-time, --start-seq, --until and --end-seq select bus history")
	case *endSeq != 0 && *endSeq < *startSeq:
		return cli.UsageError(fs, stderr, "--end-seq %d is before --start-seq %d: the range is empty", *endSeq, *startSeq)
	}
	if *startTime != "" {
		t, err := time.Parse(time.RFC3339Nano, *startTime)
		if err != nil {
			return cli.UsageError(fs, stderr, "--start-time %q: not RFC 3339", *startTime)
		}
		rng.StartTime = t
	}
	if *until != "" {
		t, err := time.Parse(time.RFC3339Nano, *until)
		if err != nil {
			return cli.UsageError(fs, stderr, "--until %q: not RFC 3339", *until)
		}
		rng.Until = t
	}
	if *since > 0 {
		rng.StartTime = time.Now().Add(-*since)
	}
	if !rng.Until.IsZero() && !rng.StartTime.IsZero() && !rng.StartTime.Before(rng.Until) {
		return cli.UsageError(fs, stderr, "the range is empty: %s is not before --until %s", rng.StartTime.Format(time.RFC3339Nano), rng.Until.Format(time.RFC3339Nano))
	}
	rng.StartSeq, rng.EndSeq = *startSeq, *endSeq

	o := Options{Seed: *seed}
	var err error
	if o.New, err = policy.Load(*newPath); err != nil {
		fmt.Fprintf(stderr, "failbus shadow: --policy: %v\n", err)
		return 2
	}
	if *basePath != "" {
		if o.Base, err = policy.Load(*basePath); err != nil {
			fmt.Fprintf(stderr, "failbus shadow: --base: %v\n", err)
			return 2
		}
	} else {
		fmt.Fprintln(stderr, "failbus shadow: no --base: comparing with the default policy (give --base the policy the bus ran, or the base run decides otherwise than the bus did)")
	}
	s, err := New(o)
	if err != nil {
		fmt.Fprintf(stderr, "failbus shadow: %v\n", err)
		return 2
	}
	defer s.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	w := bufio.NewWriterSize(stdout, 64<<10)
	defer w.Flush()
	enc := json.NewEncoder(w)
	emit := func(v any) error {
		if err := enc.Encode(v); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
		return nil
	}
	started := time.Now()
	var st ReadStats
	if *input != "" {
		err = replayLines(ctx, s, *input, stdin, stderr, emit)
	} else {
		nc, js, cerr := conn.JetStream(ctx, "shadow")
		if cerr != nil {
			fmt.Fprintf(stderr, "failbus shadow: %v\n", cerr)
			return 1
		}
		defer nc.Close()
		// A denied read fails at once, naming the denial.
		ctx, failFast := nc.FailFast(ctx)
		defer failFast()
		st, err = ReadBus(ctx, js, rng, stderr, func(rec Record) error {
			if d := s.Step(InputOf(rec)); d != nil {
				d.Seq = rec.Seq
				return emit(d)
			}
			return nil
		})
		err = nc.Explain(err)
	}
	if err != nil {
		_ = w.Flush()
		fmt.Fprintf(stderr, "failbus shadow: %v\n", err)
		return 1
	}
	sum := s.Summary()
	sum.Skipped, sum.FirstSeq, sum.LastSeq = st.Skipped, st.FirstSeq, st.LastSeq
	sum.TookMS = time.Since(started).Milliseconds()
	if err := emit(sum); err != nil {
		fmt.Fprintf(stderr, "failbus shadow: %v\n", err)
		return 1
	}
	if err := w.Flush(); err != nil {
		fmt.Fprintf(stderr, "failbus shadow: write output: %v\n", err)
		return 1
	}
	return 0
}

// errorRecord is an input line that could not be used, in the offline
// commands' shape.
type errorRecord struct {
	Type  string `json:"type"`
	Line  int    `json:"line"`
	Error string `json:"error"`
}

// replayLines replays simulate-format JSON Lines from path ("-": stdin).
// A line that does not parse is an error record; replay goes on. progress,
// when a terminal, shows how many lines were replayed.
func replayLines(ctx context.Context, s *Shadow, path string, stdin io.Reader, progress io.Writer, emit func(any) error) error {
	r, label := stdin, "shadow: replaying stdin"
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("--input: %w", err)
		}
		defer f.Close()
		r, label = f, "shadow: replaying "+path+" (lines)"
	}
	p := cli.NewProgress(progress, label, 0)
	defer p.Done()
	return cli.EachLine(r, func(lineNo int, line []byte, tooLong bool) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		p.Add(1)
		if tooLong {
			s.sum.Errors++
			return emit(errorRecord{Type: "error", Line: lineNo, Error: fmt.Sprintf("line longer than %d bytes", cli.MaxLine)})
		}
		in, err := sim.ParseInput(line, lineNo)
		if err != nil {
			s.sum.Errors++
			return emit(errorRecord{Type: "error", Line: lineNo, Error: err.Error()})
		}
		if in.Type == sim.InputSync {
			return nil
		}
		if d := s.Step(in); d != nil {
			return emit(d)
		}
		return nil
	})
}
