// Package chaos is `failbus chaos`: a local provider that speaks the
// OpenAI chat completions and Anthropic messages APIs and fails on a
// timeline (internal/chaos), for trying an agent — or a fleet on the bus —
// against outages, rate-limit storms, capped keys and refusals without a
// real provider. It is a provider, not part of the bus: it needs no
// server and publishes nothing.
package chaoscmd

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"

	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/chaos"
	"github.com/failbus/failbus/internal/cli"
)

// Command is `failbus chaos`.
var Command = cli.Command{Name: "chaos", Summary: "serve a local OpenAI/Anthropic API that fails on a timeline (outages, 429s, capped keys, refusals) and logs every call", Run: run}

// DefaultAddr is where `failbus chaos` listens unless told otherwise.
const DefaultAddr = "127.0.0.1:8787"

const usage = `[--timeline FILE] [--addr 127.0.0.1:8787] [--scale F] [--seed N] [--log FILE] [--for D] [--verbose]

Serves POST /v1/chat/completions (OpenAI, plain and stream: true) and
POST /v1/messages (Anthropic, plain and streamed) on --addr, each also
under /NAME/ to play a provider called NAME, and answers as the timeline
says: healthy answers, and fault windows that refuse the port, reset
connections, answer 503, 529 overloaded_error, 429 with or without
retry-after, a key's quota error after N calls, the gateway's empty 400,
refusals of marked content, context overflow, slow answers, stalled and
broken streams. Without --timeline every call is answered.

Point an SDK at it: OpenAI base URL http://ADDR/v1/, Anthropic base URL
http://ADDR; any API key (keys are logged, never checked). Every request
is recorded: GET http://ADDR/_chaos/requests lists them, --log FILE
writes one JSON line per request when its answer ends. On SIGINT/SIGTERM
(or after --for) it prints the calls each window answered and exits 0.

The timeline (YAML) is described in docs/CHAOS.md; the sample is
testdata/chaos/drill.yaml. Times are since the start; --scale 0.01 runs a
five-minute timeline in three seconds (retry-after is scaled too).`

func run(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serve(ctx, args, stdout, stderr)
}

// serve runs the provider until ctx ends (or --for passes).
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("chaos", usage, stderr)
	timeline := fs.String("timeline", "", "timeline YAML file (default: no faults)")
	addr := fs.String("addr", DefaultAddr, "address to listen on; port 0 picks a free one")
	scale := fs.Float64("scale", 0, "multiply every time of the timeline by this (0: the timeline's scale, else 1)")
	seed := fs.Uint64("seed", 0, "seed of the probability draws (0: the timeline's seed)")
	logFile := fs.String("log", "", "write each request as a JSON line to this file")
	runFor := fs.Duration("for", 0, "stop after this long (0: until interrupted)")
	verbose := fs.Bool("verbose", false, "log every request on stderr")
	if rest, code, done := cli.Parse(fs, args); done {
		return code
	} else if len(rest) > 0 {
		return cli.UsageError(fs, stderr, "unexpected arguments %q", rest)
	}
	if *scale < 0 || *runFor < 0 {
		return cli.UsageError(fs, stderr, "--scale and --for must not be negative")
	}
	tl, err := chaos.ParseTimeline(nil)
	if *timeline != "" {
		tl, err = chaos.Load(*timeline)
	}
	if err != nil {
		fmt.Fprintf(stderr, "failbus chaos: %v\n", err)
		return 2
	}
	logger := cli.ConsoleLogger(stderr).Level(zerolog.InfoLevel)
	if *verbose {
		logger = logger.Level(zerolog.DebugLevel)
	}
	opts := chaos.Options{Addr: *addr, Scale: *scale, Seed: *seed, Logger: logger}
	if *logFile != "" {
		f, err := os.Create(*logFile)
		if err != nil {
			fmt.Fprintf(stderr, "failbus chaos: %v\n", err)
			return 1
		}
		defer f.Close()
		opts.RequestLog = f
	}
	srv, err := chaos.New(tl, opts)
	if err != nil {
		return cli.UsageError(fs, stderr, "%v", err)
	}
	if *runFor > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *runFor)
		defer cancel()
	}
	if err := srv.Start(ctx); err != nil {
		fmt.Fprintf(stderr, "failbus chaos: %v\n", err)
		return 1
	}
	describe(stdout, srv, tl, *timeline, opts)
	<-ctx.Done()
	if err := srv.Close(); err != nil {
		fmt.Fprintf(stderr, "failbus chaos: %v\n", err)
		return 1
	}
	summarize(stdout, srv.Requests(), tl)
	return 0
}

// describe prints where the provider is and what its timeline holds.
func describe(w io.Writer, srv *chaos.Server, tl *chaos.Timeline, file string, opts chaos.Options) {
	if file == "" {
		file = "none: every call is answered"
	}
	scale := opts.Scale
	if scale == 0 {
		scale = max(tl.Scale, 0)
	}
	if scale == 0 {
		scale = 1
	}
	fmt.Fprintf(w, "chaos provider on %s (timeline %s, scale %v)\n", srv.URL(), file, scale)
	fmt.Fprintf(w, "  OpenAI SDKs:    base URL %s  (as provider NAME: %s)\n", srv.OpenAIBaseURL(""), srv.OpenAIBaseURL("NAME"))
	fmt.Fprintf(w, "  Anthropic SDKs: base URL %s  (as provider NAME: %s)\n", srv.AnthropicBaseURL(""), srv.AnthropicBaseURL("NAME"))
	fmt.Fprintf(w, "  requests:       %s%s\n", srv.URL(), chaos.RequestsPath)
	if len(tl.Faults) == 0 {
		return
	}
	fmt.Fprintln(w, "windows (timeline time):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range tl.Faults {
		to := "end"
		if f.To != chaos.Forever {
			to = f.To.String()
		}
		fmt.Fprintf(tw, "  %s\t%s\t%v – %s\n", f.Name, f.Kind, f.From, to)
	}
	_ = tw.Flush()
}

// summarize prints how many calls each window answered.
func summarize(w io.Writer, log chaos.Log, tl *chaos.Timeline) {
	per := log.PerWindow()
	fmt.Fprintf(w, "%d requests; answered by:\n", len(log))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  (healthy)\t%d\n", per[""])
	for _, f := range tl.Faults {
		note := ""
		if f.Kind == chaos.KindRefuse {
			note = "\t(only calls on connections opened before it: the refused ones never arrive)"
		}
		fmt.Fprintf(tw, "  %s\t%d%s\n", f.Name, per[f.Name], note)
	}
	_ = tw.Flush()
}
