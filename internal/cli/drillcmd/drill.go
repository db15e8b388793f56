// Package drill is `failbus drill`: one fleet of agents through one chaos
// timeline, once on the official Go SDKs' own retries and once with their
// retries off under agent.Call on the bus, and one table of what each did
// to the provider (internal/drill; docs/DRILL.md).
package drillcmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/chaos"
	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/drill"
)

// Command is `failbus drill`.
var Command = cli.Command{Name: "drill", Summary: "run one fleet through a chaos timeline on the SDKs' own retries and on the bus, and compare", Run: run}

const usage = `[--agents N] [--tasks N] [--steps N] [--scale F] [--json] [--server URL] [flags]

Runs a fleet of agents (--agents, each with --tasks tasks of --steps LLM
calls, a cron that writes memory, subagents that heartbeat) against a
chaos provider that plays an OpenAI-API and an Anthropic-API provider
through one timeline: an outage of the OpenAI provider, some agents' main
keys capped, content each provider refuses, a rate-limit storm and
stalled streams; a few subagents crash during the outage. It runs the
same fleet once per strategy, each against a fresh chaos server:

  go-sdk      openai-go and anthropic-sdk-go as they come (their retries)
  go-failbus  the same SDKs, retries off, every call under agent.Call on
              the bus (in process, or --server), tasks held in the outage

and prints one table, counted from the provider's request log: tasks
done and lost, calls, wasted calls and their tokens, the burst after the
recovery, hung calls, messages to humans, the time to drain, kills,
re-runs. docs/DRILL.md says what each column means and how to read it.

--scale 0.1 runs the two-and-a-half-minute timeline in fifteen seconds
(the bus's clocks are scaled with it; the SDKs' own backoff is not).
--rows FILE adds rows made elsewhere (the TypeScript drill's --json).
--real calls real providers instead (keys from OPENAI_API_KEY and
ANTHROPIC_API_KEY, backups from *_BACKUP; it costs money): nothing is
scripted then, and the figures are counted from the client's side.`

func run(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return drillMain(ctx, args, stdout, stderr, os.Getenv)
}

func drillMain(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := cli.NewFlagSet("drill", usage, stderr)
	var conn cli.Conn
	conn.Register(fs)
	cfg := drill.Config{}
	fs.IntVar(&cfg.Agents, "agents", drill.DefaultAgents, "agents in the fleet")
	fs.IntVar(&cfg.Tasks, "tasks", drill.DefaultTasks, "tasks per agent")
	fs.IntVar(&cfg.Steps, "steps", drill.DefaultSteps, "LLM calls per task")
	fs.IntVar(&cfg.Crashes, "crashes", drill.DefaultCrashes, "subagents that crash during the outage (-1: none)")
	fs.Float64Var(&cfg.Scale, "scale", 1, "multiply every time of the timeline and the fleet by this")
	fs.Uint64Var(&cfg.Seed, "seed", drill.DefaultSeed, "seed of the fleet's draws and the chaos provider's")
	fs.DurationVar(&cfg.Grace, "grace", drill.DefaultGrace, "how long (timeline time) the fleet may go on after the timeline's end")
	fs.BoolVar(&cfg.Parallel, "parallel", false, "run the strategies side by side instead of one after the other")
	strategies := fs.String("strategies", strings.Join(drill.Strategies, ","), "strategies to run, in order (empty: none, print the --rows)")
	timeline := fs.String("timeline", "", "a chaos timeline file instead of the default (docs/CHAOS.md; it needs a window named outage of provider openai)")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of the table")
	var rowsFiles []string
	fs.Func("rows", "add the rows in this file (a --json report of this drill or the TypeScript one, or JSON Lines of rows) to the table; repeatable", func(v string) error {
		rowsFiles = append(rowsFiles, v)
		return nil
	})
	real := fs.Bool("real", false, "call real providers instead of a chaos server (keys from the environment)")
	openaiURL := fs.String("openai-base-url", "", "with --real: the OpenAI-API base URL (default: the SDK's)")
	anthropicURL := fs.String("anthropic-base-url", "", "with --real: the Anthropic-API base URL (default: the SDK's)")
	openaiModel := fs.String("openai-model", "gpt-4.1-mini", "with --real: the OpenAI model")
	anthropicModel := fs.String("anthropic-model", "claude-haiku-4-5", "with --real: the Anthropic model")
	requests := fs.String("requests", "", "write every request the provider received, annotated (what for, why wasted), as JSON Lines to this file")
	verbose := fs.Bool("verbose", false, "log the bus's and the chaos provider's warnings on stderr")
	if rest, code, done := cli.Parse(fs, args); done {
		return code
	} else if len(rest) > 0 {
		return cli.UsageError(fs, stderr, "unexpected arguments %q", rest)
	}
	cfg.Strategies = strings.Split(*strategies, ",")
	if *strategies == "" {
		cfg.Strategies = []string{}
		if len(rowsFiles) == 0 {
			return cli.UsageError(fs, stderr, "no strategies to run and no --rows to print")
		}
	}
	cfg.Progress = stderr
	if *verbose {
		cfg.Log = cli.ConsoleLogger(stderr).Level(zerolog.WarnLevel)
	}
	if *timeline != "" {
		tl, err := chaos.Load(*timeline)
		if err != nil {
			fmt.Fprintf(stderr, "failbus drill: %v\n", err)
			return 2
		}
		cfg.Timeline = tl
	}
	if conn.Servers != "" {
		cfg.Connect = func(name string) (*nats.Conn, error) {
			c, err := conn.Connect(name)
			if err != nil {
				return nil, err
			}
			return c.Conn, nil
		}
	}
	if *real {
		r, err := realProviders(getenv, *openaiURL, *anthropicURL, *openaiModel, *anthropicModel)
		if err != nil {
			return cli.UsageError(fs, stderr, "%v", err)
		}
		cfg.Real = r
	}
	if err := cfg.Validate(); err != nil {
		return cli.UsageError(fs, stderr, "%v", strings.TrimPrefix(err.Error(), "drill: "))
	}
	var extra []drill.Row
	for _, path := range rowsFiles {
		rows, err := readRows(path)
		if err != nil {
			fmt.Fprintf(stderr, "failbus drill: %v\n", err)
			return 2
		}
		extra = append(extra, rows...)
	}
	if *requests != "" {
		f, err := os.Create(*requests)
		if err != nil {
			fmt.Fprintf(stderr, "failbus drill: %v\n", err)
			return 1
		}
		defer f.Close()
		w := bufio.NewWriter(f)
		defer w.Flush()
		cfg.Requests = w
	}
	rep, err := &drill.Report{}, error(nil)
	if len(cfg.Strategies) > 0 {
		rep, err = drill.Run(ctx, cfg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "failbus drill: %v\n", err)
		if rep == nil || len(rep.Rows) == 0 {
			return 1
		}
	}
	rep.Rows = append(rep.Rows, extra...)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "failbus drill: %v\n", err)
			return 1
		}
	} else {
		if err := drill.WriteTable(stdout, rep.Rows); err != nil {
			fmt.Fprintf(stderr, "failbus drill: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout)
		drill.WriteDetails(stdout, rep)
		if _, text := drill.GoalVerdict(rep.Rows, drill.StrategyFailbus); text != "" {
			fmt.Fprintln(stdout, text)
		}
	}
	if err != nil {
		return 1
	}
	return 0
}

// realProviders reads the real providers' keys from the environment.
func realProviders(getenv func(string) string, openaiURL, anthropicURL, openaiModel, anthropicModel string) (*drill.Real, error) {
	r := &drill.Real{OpenAIBaseURL: openaiURL, AnthropicBaseURL: anthropicURL, OpenAIModel: openaiModel, AnthropicModel: anthropicModel,
		Keys: map[string]map[string]string{}}
	for provider, env := range map[string]string{drill.ProviderOpenAI: "OPENAI_API_KEY", drill.ProviderAnthropic: "ANTHROPIC_API_KEY"} {
		main := getenv(env)
		if main == "" {
			return nil, fmt.Errorf("--real needs %s (and %s_BACKUP for a second profile)", env, env)
		}
		backup := getenv(env + "_BACKUP")
		if backup == "" {
			backup = main
		}
		r.Keys[provider] = map[string]string{drill.ProfileMain: main, drill.ProfileBackup: backup}
	}
	return r, nil
}

// readRows reads rows made elsewhere: a --json report (this drill's or
// the TypeScript drill's: an object with "rows"), or JSON Lines of rows.
func readRows(path string) ([]drill.Row, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rep struct {
		Rows []json.RawMessage `json:"rows"`
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(data, &rep); err == nil && len(rep.Rows) > 0 {
		raws = rep.Rows
	} else {
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			if line := bytes.TrimSpace(sc.Bytes()); len(line) > 0 {
				raws = append(raws, append(json.RawMessage(nil), line...))
			}
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	rows := make([]drill.Row, 0, len(raws))
	for i, raw := range raws {
		r, err := drill.ReadRow(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: row %d: not a drill row: %w", path, i+1, err)
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%s: no rows", path)
	}
	return rows, nil
}
