package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/redact"
)

// demoScenario is one step of `failbus demo`: what an agent does, and what
// the bus is expected to decide. Each issue appends its scenarios to
// demoScenarios (retries, refusal tiers, notifications, recovery).
type demoScenario struct {
	title string
	// about says, in a line or two, why the scenario matters.
	about string
	// run drives the agent and prints what the bus decided. It returns an
	// error when the bus decided something else than expected or did not
	// answer in time.
	run func(ctx context.Context, d *demo) error
}

// demoAgent is the name of the scripted agent.
const demoAgent = "demo-agent"

// demoScenarios is the script, in order.
var demoScenarios = []demoScenario{
	{
		title: "A successful call",
		about: "Successes are reported too: they are what tells a failure from an outage, and a recovery from luck.",
		run: func(ctx context.Context, d *demo) error {
			return d.expectClass(ctx, &events.Outcome{
				ID: "demo-ok", Provider: "openai", Model: "gpt-4.1", Profile: "key-a",
				OK: true, Status: 200, Body: `{"choices":[{"message":{"content":"Hello!"}}]}`,
			}, events.ClassOK, "")
		},
	},
	{
		title: "Rate limited, and the server says when to come back",
		about: "A cause that changes with time: wait as long as the provider asked, then retry.",
		run: func(ctx context.Context, d *demo) error {
			return d.expectClass(ctx, &events.Outcome{
				ID: "demo-429", Provider: "openai", Model: "gpt-4.1", Profile: "key-a", Status: 429,
				Headers: map[string]string{"retry-after": "7"},
				Body:    `{"error":{"message":"Rate limit reached for gpt-4.1 on tokens per min","type":"tokens","code":"rate_limit_exceeded"}}`,
			}, events.ClassRateLimit, "")
		},
	},
	{
		title: "The provider is unavailable (503)",
		about: "A server-side fault: retryable with backoff; if every profile fails, it is the provider.",
		run: func(ctx context.Context, d *demo) error {
			return d.expectClass(ctx, &events.Outcome{
				ID: "demo-503", Provider: "anthropic", Model: "claude-sonnet-4", Profile: "key-b", Status: 503,
				Body: `<html><body><h1>503 Service Temporarily Unavailable</h1></body></html>`,
			}, events.ClassServerError, "")
		},
	},
	{
		title: "A gateway's empty 400 that a library called CONTEXT_WINDOW_EXCEEDED: evidence overrules the claim",
		about: "The request is 41k tokens of a 256k window: the overflow claim is fabricated. Harder evidence overrules\n" +
			"it, so the call stays retryable instead of ending the agent's run.",
		run: func(ctx context.Context, d *demo) error {
			return d.expectClass(ctx, &events.Outcome{
				ID: "demo-gw-400", Provider: "my-gateway", Model: "deepseek-v3", Profile: "key-c", Status: 400,
				UpstreamCode: "CONTEXT_WINDOW_EXCEEDED", RequestTokens: 41_000, ContextWindow: 256_000,
			}, events.ClassServerError, events.ClassContextOverflow)
		},
	},
	{
		title: "Cerebras's empty 413 at 130.9k of a 131k window",
		about: "The same empty body, but from the provider known to report overflow this way, and the request really\n" +
			"fills the window: a true overflow. Retrying cannot help; compacting can.",
		run: func(ctx context.Context, d *demo) error {
			return d.expectClass(ctx, &events.Outcome{
				ID: "demo-cerebras-413", Provider: "cerebras", Model: "qwen-3-235b", Profile: "key-d", Status: 413,
				RequestTokens: 130_900, ContextWindow: 131_000,
			}, events.ClassContextOverflow, "")
		},
	},
	{
		title: "The connection was reset before any response",
		about: "No status at all: a network fault, retryable; it says nothing about the model or the request.",
		run: func(ctx context.Context, d *demo) error {
			return d.expectClass(ctx, &events.Outcome{
				ID: "demo-reset", Provider: "openai", Model: "gpt-4.1", Profile: "key-a",
				TransportError: "read tcp 10.0.0.5:51234->104.18.7.192:443: read: connection reset by peer (ECONNRESET)",
			}, events.ClassTransport, "")
		},
	},
	{
		title: "Junk on the outcome subject",
		about: "A broken agent must not stop the bus: what cannot be decoded is dead-lettered with the reason and the\n" +
			"original bytes, and the service goes on.",
		run: func(ctx context.Context, d *demo) error {
			return d.expectDeadLetter(ctx, events.OutcomeSubject("openai", demoAgent), []byte("this is not msgpack"), "msgpack")
		},
	},
	retryScenario,
	refusalScenario,
	recoveryScenario,
}

// demoTimeout bounds the whole demo; demoWait bounds one answer of the bus.
const (
	demoTimeout = 2 * time.Minute
	demoWait    = 20 * time.Second
)

// Command is `failbus demo`.
var Command = cli.Command{Name: "demo", Summary: "walk through the main scenarios on a temporary embedded bus", Run: run}

const demoUsage = `[--verbose]

Starts an embedded bus in a temporary folder, runs every implemented service
in this process, and walks a scripted agent through the main scenarios,
printing what the bus decided for each. Exits 0 when every scenario went as
expected, 1 otherwise. Nothing is left behind.`

// run is `failbus demo`.
func run(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("demo", demoUsage, stderr)
	verbose := fs.Bool("verbose", false, "print the services' logs on stderr")
	if rest, code, done := cli.Parse(fs, args); done {
		return code
	} else if len(rest) > 0 {
		return cli.UsageError(fs, stderr, "unexpected arguments %q", rest)
	}
	log := zerolog.Nop()
	if *verbose {
		log = cli.ConsoleLogger(stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), demoTimeout)
	defer cancel()
	if err := runScenarios(ctx, demoScenarios, log, stdout); err != nil {
		fmt.Fprintf(stderr, "failbus demo: %v\n", err)
		return 1
	}
	return 0
}

// runScenarios starts a throwaway bus and runs scenarios on it.
func runScenarios(ctx context.Context, scenarios []demoScenario, log zerolog.Logger, w io.Writer) (err error) {
	b, err := devbus.Start(devbus.Options{Server: embedded.Options{ServerName: "failbus-demo"}, Log: log})
	if err != nil {
		return err
	}
	defer func() {
		if serr := b.Stop(); serr != nil && err == nil {
			err = serr
		}
	}()
	d, err := newDemo(ctx, b, w)
	if err != nil {
		return err
	}
	defer d.close()
	fmt.Fprintf(w, "failbus demo: an embedded bus at %s (temporary store), services: %s\n",
		b.Srv.ClientURL(), strings.Join(b.Names, ", "))
	fmt.Fprintf(w, "agent %q reports the raw outcome of each LLM call; the bus decides.\n", demoAgent)
	var failed []string
	for i, s := range scenarios {
		fmt.Fprintf(w, "\n%d. %s\n", i+1, s.title)
		for _, l := range strings.Split(s.about, "\n") {
			fmt.Fprintf(w, "   %s\n", l)
		}
		if err := s.run(ctx, d); err != nil {
			fmt.Fprintf(w, "   ✗ %v\n", err)
			failed = append(failed, fmt.Sprintf("%d (%s)", i+1, s.title))
		}
		select {
		case <-b.Failed():
			return errors.New("a service stopped during the demo")
		default:
		}
	}
	fmt.Fprintln(w)
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d scenarios did not go as expected: %s", len(failed), len(scenarios), strings.Join(failed, ", "))
	}
	fmt.Fprintf(w, "All %d scenarios went as expected. Try it live: failbus dev, then failbus publish and failbus tail.\n", len(scenarios))
	return nil
}

// demo is what a scenario works with: the agent, the bus, and watches on
// the streams the bus answers on.
type demo struct {
	w          io.Writer
	nc         *nats.Conn
	js         jetstream.JetStream
	agent      *agent.Agent
	classified *watch.Log[events.Message]
	dead       *watch.Log[events.Message]
}

func newDemo(ctx context.Context, b *devbus.Bus, w io.Writer) (*demo, error) {
	nc, err := b.Srv.Connect(nats.Name("failbus demo agent"))
	if err != nil {
		return nil, err
	}
	ag, err := agent.New(nc, demoAgent)
	if err != nil {
		nc.Close()
		return nil, err
	}
	d := &demo{w: w, nc: nc, js: b.JS, agent: ag}
	if d.classified, err = startLog(ctx, b.JS, topology.StreamClassified, events.ClassifiedPrefix+".>"); err != nil {
		d.close()
		return nil, err
	}
	if d.dead, err = startLog(ctx, b.JS, topology.StreamDLQ, events.DLQPrefix+".>"); err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

func (d *demo) close() {
	for _, l := range []*watch.Log[events.Message]{d.classified, d.dead} {
		if l != nil {
			_ = l.Stop()
		}
	}
	d.nc.Close()
}

// printf writes one indented line of a scenario.
func (d *demo) printf(format string, args ...any) {
	fmt.Fprintf(d.w, "   "+format+"\n", args...)
}

// expectClass reports o through the agent, waits for its classification,
// prints it, and checks the class (and the overruled claim, when given).
func (d *demo) expectClass(ctx context.Context, o *events.Outcome, class, overruled string) error {
	if err := d.agent.Report(ctx, o); err != nil {
		return err
	}
	d.printf("agent  %s", describeOutcome(o))
	m, _, err := await(ctx, d.classified, 0, func(m events.Message) bool {
		c, ok := m.(*events.Classification)
		return ok && c.OutcomeID == o.ID
	})
	if err != nil {
		return fmt.Errorf("no classification of %s: %w", o.ID, err)
	}
	c := m.(*events.Classification)
	d.printClassification(c)
	if c.Class != class || c.Overruled != overruled {
		want := class
		if overruled != "" {
			want += ", overruling " + overruled
		}
		return fmt.Errorf("expected %s", want)
	}
	return nil
}

// expectDeadLetter publishes raw bytes as a broken agent would and waits
// for the dead letter that carries them.
func (d *demo) expectDeadLetter(ctx context.Context, subject string, data []byte, reasonHas string) error {
	if _, err := d.js.Publish(ctx, subject, data); err != nil {
		return fmt.Errorf("publish junk: %w", err)
	}
	d.printf("agent  %d bytes that are not msgpack (%q) on %s", len(data), data, subject)
	m, _, err := await(ctx, d.dead, 0, func(m events.Message) bool {
		dl, ok := m.(*events.DeadLetter)
		return ok && bytes.Equal(dl.Data, data)
	})
	if err != nil {
		return fmt.Errorf("no dead letter: %w", err)
	}
	dl := m.(*events.DeadLetter)
	d.printf("bus    dead letter on %s, original subject and bytes kept", events.DLQSubject(dl.Service))
	d.printf("       reason: %s", dl.Reason)
	if !strings.Contains(dl.Reason, reasonHas) {
		return fmt.Errorf("expected a reason mentioning %q", reasonHas)
	}
	return nil
}

func (d *demo) printClassification(c *events.Classification) {
	retry := "not retryable"
	if c.Retryable {
		retry = "retryable"
	}
	line := fmt.Sprintf("bus    %s · %s · rule %s", c.Class, retry, c.Rule)
	if c.Scope != "" {
		line += " · scope " + c.Scope
	}
	d.printf("%s", line)
	if c.Overruled != "" {
		d.printf("       overruled: the claim %q was rejected by the evidence", c.Overruled)
	}
	if h := c.Hints; h != nil && h.AfterMS > 0 {
		d.printf("       provider asks to retry after %s (%s)", time.Duration(h.AfterMS)*time.Millisecond, h.Source)
	}
	if len(c.Evidence) > 0 {
		d.printf("       evidence: %s", strings.Join(c.Evidence, "; "))
	}
}

// describeOutcome renders the evidence of an outcome on one line.
func describeOutcome(o *events.Outcome) string {
	parts := []string{o.Provider + "/" + o.Model}
	switch {
	case o.Status != 0:
		parts = append(parts, fmt.Sprintf("status %d", o.Status))
	case o.TransportError != "":
		parts = append(parts, "no response")
	}
	if o.TransportError != "" {
		parts = append(parts, fmt.Sprintf("error %q", redact.String(o.TransportError)))
	}
	keys := make([]string, 0, len(o.Headers))
	for k := range o.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		parts = append(parts, k+": "+redact.String(o.Headers[k]))
	}
	if o.UpstreamCode != "" {
		parts = append(parts, "upstream_code "+o.UpstreamCode)
	}
	if o.RequestTokens > 0 && o.ContextWindow > 0 {
		parts = append(parts, fmt.Sprintf("%s of %s tokens", kTokens(o.RequestTokens), kTokens(o.ContextWindow)))
	}
	switch {
	case o.Status != 0 && o.Body == "":
		parts = append(parts, "empty body")
	case o.Body != "":
		b := redact.String(o.Body)
		if len(b) > 60 {
			b = b[:57] + "..."
		}
		parts = append(parts, "body "+b)
	}
	return strings.Join(parts, "  ")
}

// kTokens writes 130900 as 130.9k.
func kTokens(n int) string {
	if n < 1000 {
		return fmt.Sprint(n)
	}
	s := fmt.Sprintf("%.1f", float64(n)/1000)
	return strings.TrimSuffix(s, ".0") + "k"
}

// startLog follows one stream's messages on filter, decoded, so a scenario
// can wait for the one it expects (await) instead of sleeping.
func startLog(ctx context.Context, js jetstream.JetStream, stream, filter string) (*watch.Log[events.Message], error) {
	return watch.StartLog(ctx, js, watch.Config{Stream: stream, Filters: []string{filter}},
		func(m jetstream.Msg) (events.Message, error) {
			return events.Decode(m.Subject(), m.Headers(), m.Data())
		})
}

// await returns the first message of l, from index from on, that satisfies
// match, and its index, waiting at most demoWait for it.
func await(ctx context.Context, l *watch.Log[events.Message], from int, match func(events.Message) bool) (events.Message, int, error) {
	ctx, cancel := context.WithTimeout(ctx, demoWait)
	defer cancel()
	m, i, err := l.Wait(ctx, from, match)
	if err != nil {
		return nil, 0, fmt.Errorf("nothing within %v: %w", demoWait, err)
	}
	return m, i, nil
}
