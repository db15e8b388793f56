// Package report is `failbus report`: what happened on the bus over a
// period, for people who would rather look than read — one self-contained
// HTML page (inline SVG charts, no script, nothing fetched from elsewhere)
// — and, with --json, the same figures for machines.
//
// The figures: outcomes and failure classes per provider over time, each
// provider's health timeline (outages), retries scheduled, due and given
// up, overruled classifications (what a heuristic claimed and the evidence
// rejected), refusal tiers (segments refused, skipped, frozen),
// notifications requested, sent, held by the budget and deduplicated, dead
// letters by service and reason, recovery runs, policy changes; with
// Options.Shadow, what another policy would have decided on the period's
// outcomes (the shadow package's replay, fed the outcomes the report
// reads). Collect computes them (tests use it); WriteHTML and
// encoding/json render them.
//
// It only reads: ordered consumers over the streams, deleted when done
// (the `operator` role may run it).
package report

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/cli/shadow"
	"github.com/failbus/failbus/pkg/policy"
)

// Command is `failbus report`.
var Command = cli.Command{Name: "report", Summary: "what happened over a period: a self-contained HTML page with charts, or --json", Run: run}

const usage = `[--server URL] [--since 24h | --start-time T] [--until T] [--out FILE.html] [--json] [--shadow NEW.yaml [--shadow-base FILE]]

Reads the records stored on the bus in the period (default: the last 24
hours) and writes a report of them: one HTML page, self-contained (inline
SVG charts, no script, readable offline), to --out or stdout; or, with
--json, the same figures as one JSON object. Every number on the page
carries data-k, the path of the figure in the JSON.

Records are selected by when the bus stored them and placed on the time
axis by their own time (when the call ended, ...). Progress goes to stderr
when it is a terminal.

With --shadow NEW.yaml the report adds what the policy in NEW.yaml would
have decided differently on the period's outcomes, against --shadow-base
(default: the default policy; give the policy the bus ran): the counts by
change and provider and the first differing decisions, as failbus shadow
computes them over the same range.`

// DefaultSince is the period of a report unless told otherwise.
const DefaultSince = 24 * time.Hour

func run(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("report", usage, stderr)
	var conn cli.Conn
	conn.Register(fs)
	since := fs.Duration("since", 0, "report on the last DURATION (default 24h)")
	startTime := fs.String("start-time", "", "start of the period (RFC 3339)")
	until := fs.String("until", "", "end of the period (RFC 3339; default now)")
	out := fs.String("out", "", "write the page (or JSON) to FILE instead of stdout")
	asJSON := fs.Bool("json", false, "the figures as JSON instead of the page")
	shadowPath := fs.String("shadow", "", "also replay the period under the policy in FILE and report what it decides differently")
	shadowBase := fs.String("shadow-base", "", "with --shadow: the base policy (default: the default policy)")
	if rest, code, done := cli.Parse(fs, args); done {
		return code
	} else if len(rest) > 0 {
		return cli.UsageError(fs, stderr, "unexpected arguments %q", rest)
	}
	now := time.Now()
	to := now
	if *until != "" {
		t, err := time.Parse(time.RFC3339Nano, *until)
		if err != nil {
			return cli.UsageError(fs, stderr, "--until %q: not RFC 3339", *until)
		}
		to = t
	}
	var from time.Time
	switch {
	case *since != 0 && *startTime != "":
		return cli.UsageError(fs, stderr, "--since and --start-time exclude each other")
	case *since < 0:
		return cli.UsageError(fs, stderr, "--since must be positive")
	case *startTime != "":
		t, err := time.Parse(time.RFC3339Nano, *startTime)
		if err != nil {
			return cli.UsageError(fs, stderr, "--start-time %q: not RFC 3339", *startTime)
		}
		from = t
	case *since != 0:
		from = to.Add(-*since)
	default:
		from = to.Add(-DefaultSince)
	}
	if !from.Before(to) {
		return cli.UsageError(fs, stderr, "the period is empty: %s is not before %s", from.Format(time.RFC3339), to.Format(time.RFC3339))
	}

	var sh *ShadowOptions
	switch {
	case *shadowBase != "" && *shadowPath == "":
		return cli.UsageError(fs, stderr, "--shadow-base is the base of --shadow NEW.yaml: give --shadow too")
	case *shadowPath != "":
		sh = &ShadowOptions{PolicyName: filepath.Base(*shadowPath), Options: shadow.Options{}}
		var err error
		if sh.New, err = policy.Load(*shadowPath); err != nil {
			fmt.Fprintf(stderr, "failbus report: --shadow: %v\n", err)
			return 2
		}
		if *shadowBase != "" {
			sh.BaseName = filepath.Base(*shadowBase)
			if sh.Base, err = policy.Load(*shadowBase); err != nil {
				fmt.Fprintf(stderr, "failbus report: --shadow-base: %v\n", err)
				return 2
			}
		} else {
			fmt.Fprintln(stderr, "failbus report: no --shadow-base: --shadow compares with the default policy (give the policy the bus ran)")
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	nc, js, err := conn.JetStream(ctx, "report")
	if err != nil {
		fmt.Fprintf(stderr, "failbus report: %v\n", err)
		return 1
	}
	defer nc.Close()
	// The server answers a denied request by reporting the denial, not by
	// replying: fail at once, naming it, instead of waiting for a timeout.
	ctx, failFast := nc.FailFast(ctx)
	defer failFast()
	r, err := Collect(ctx, js, Options{From: from, To: to, Progress: stderr, Shadow: sh})
	if err != nil {
		fmt.Fprintf(stderr, "failbus report: %v\n", nc.Explain(err))
		return 1
	}
	w := stdout
	var f *os.File
	if *out != "" {
		if f, err = os.Create(*out); err != nil {
			fmt.Fprintf(stderr, "failbus report: %v\n", err)
			return 1
		}
		w = f
	}
	if *asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		err = enc.Encode(r)
	} else {
		err = WriteHTML(w, r)
	}
	if f != nil {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "failbus report: write: %v\n", err)
		return 1
	}
	if *out != "" {
		fmt.Fprintf(stderr, "failbus report: wrote %s (%d outcomes, %s – %s)\n", *out, r.Totals.Outcomes,
			from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339))
	}
	return 0
}
