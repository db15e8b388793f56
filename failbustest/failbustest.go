// Package failbustest runs a whole failbus bus inside a Go test, so an
// agent's own tests exercise the real thing: an embedded nats-server
// storing in the test's temporary folder on a random port, the topology
// applied, and every service (classifier, scheduler with the refusal tiers,
// notifier, recovery) running against it, each on a connection of its own,
// exactly as `failbus dev` runs them. The agent under test talks to it with
// the public packages (pkg/agent, pkg/events) as it would to a deployed
// bus; the decisions it gets back are the services' own, not a stand-in's.
//
//	func TestMyAgentRetries(t *testing.T) {
//		bus := failbustest.Start(t) // stopped and removed when the test ends
//		ag, _ := agent.New(bus.Conn(), "my-agent")
//		o := &events.Outcome{Provider: "openai", Status: 429, Headers: map[string]string{"retry-after": "2"}}
//		_ = ag.Report(ctx, o)
//		d := bus.WaitDecision(t, o.ID) // events.Decision{Action: "retry", DelayMS: 2000, …}
//	}
//
// Times are short by default (ShortTimes): backoff starts at 10ms, a
// provider recovers after successes spanning 200ms, recovery probes every
// 100ms. So ProviderDown and ProviderUp, which drive a provider through an
// outage by reporting the failures and successes the fault scope counts,
// take milliseconds, while every rule stays the product's.
//
// A test bus is ready in a few hundred milliseconds (every service
// healthy); stopping it takes about two seconds more, as each service
// finishes its pending pull from the server. Start one per test that needs
// one.
//
// Unlike the packages under pkg/, this package imports the module's
// internal services: it is the one public way to run them in process, as
// River's rivertest uses River's internals. Code that only talks to a bus
// needs nothing of it but the URL.
package failbustest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"

	"github.com/failbus/failbus/internal/auth"
	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// ShortTimes is the policy a test bus starts from, on top of the product's
// defaults: every wait an agent's test would sit through is shortened,
// nothing else changes. A policy given with WithPolicy or WithPolicyFile
// overrides it key by key; WithProductTimes drops it.
//
// The first retry waits 10ms instead of 1s (max_delay stays 1m, so a
// provider's Retry-After of seconds is still honoured as said); a provider
// recovers after its successes span 200ms instead of 2 minutes; during an
// outage the recovery service asks for a probe every 100ms instead of 30s
// and releases held tasks at once; a refused segment is re-probed after
// 100ms, 200ms and 400ms instead of 15m, 1h and 6h.
const ShortTimes = `
retry:
  initial_delay: 10ms
scope:
  recovery_min_time: 200ms
recovery:
  probe_interval: 100ms
  drain_rate: 1000
refusal:
  reprobe_delays: [100ms, 200ms, 400ms]
`

// DefaultWait bounds each helper's wait (WaitDecision, ProviderDown,
// ProviderUp) unless WithWait says otherwise: long enough for a loaded CI
// machine, short enough that a decision that never comes fails the test
// instead of hanging it.
const DefaultWait = 30 * time.Second

// helperAgent is the agent name under which ProviderDown and ProviderUp
// report the calls that take a provider down and bring it back.
const helperAgent = "failbustest"

// Option configures a test bus.
type Option func(*config)

type config struct {
	policy       []byte
	policySource string
	productTimes bool
	wait         time.Duration
	log          io.Writer
	authAgents   []string
	authOn       bool
	dir          string
	err          error // an option's own failure, reported by New
}

// WithPolicy runs the services with this policy file text (the YAML of
// docs/POLICY.md). Keys it sets override ShortTimes; keys it leaves out
// keep ShortTimes' values, then the product's defaults. A policy the
// product would refuse fails Start with the same message.
func WithPolicy(yamlText string) Option {
	return func(c *config) { c.policy, c.policySource = []byte(yamlText), "WithPolicy" }
}

// WithPolicyFile is WithPolicy with the text of the file at path (the file
// an agent deploys with, say), read once at start.
func WithPolicyFile(path string) Option {
	return func(c *config) {
		data, err := os.ReadFile(path)
		if err != nil {
			c.err = fmt.Errorf("policy file: %w", err)
			return
		}
		c.policy, c.policySource = data, path
	}
}

// WithProductTimes runs the product's own times instead of ShortTimes: a
// retry waits 1s and more, a provider recovers after 2 minutes of
// successes. For a test of an agent's own clock handling, not for CI.
func WithProductTimes() Option { return func(c *config) { c.productTimes = true } }

// WithWait sets how long each helper waits before it fails (DefaultWait).
func WithWait(d time.Duration) Option { return func(c *config) { c.wait = d } }

// WithLog writes the services' logs (zerolog JSON lines) to w. By default
// Start writes their warnings and errors to the test's log, which go test
// shows for a failed test or with -v, and New writes nothing.
func WithLog(w io.Writer) Option { return func(c *config) { c.log = w } }

// WithAuth runs the server as `failbus dev --auth` does: a connection
// without credentials is refused, each service connects as its own role,
// and each name in agents gets a user that may only act as that agent
// (AgentConn connects as it). An agent's test then shows that the agent
// does nothing its deployed credentials forbid. Conn stays the admin's.
func WithAuth(agents ...string) Option {
	return func(c *config) { c.authOn, c.authAgents = true, append(c.authAgents, agents...) }
}

// Bus is a running failbus: server, topology and services. Its methods
// are safe for concurrent use.
type Bus struct {
	dev    *devbus.Bus
	nc     *nats.Conn
	js     jetstream.JetStream
	pol    *policy.Policy
	wait   time.Duration
	users  *auth.Set
	helper *agent.Agent
	dir    string
	temp   bool

	closeOnce sync.Once
	closeErr  error
}

// Start starts a bus for the test and stops it, removing its store, when
// the test and its subtests end (t.Cleanup). It fails the test when the
// bus cannot start.
func Start(t testing.TB, opts ...Option) *Bus {
	t.Helper()
	lw := &testLog{t: t}
	opts = append([]Option{func(c *config) {
		c.dir = t.TempDir()
		c.log = warnOnly{lw}
	}}, opts...)
	b, err := New(opts...)
	if err != nil {
		t.Fatalf("failbustest: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("failbustest: %v", err)
		}
		lw.close()
	})
	return b
}

// New starts a bus outside a test: for an Example, or a program of one's
// own. It stores in a new temporary folder; Close stops everything and
// removes it.
func New(opts ...Option) (*Bus, error) {
	c := config{wait: DefaultWait}
	for _, o := range opts {
		o(&c)
	}
	pol, err := buildPolicy(c)
	if err != nil {
		return nil, err
	}
	b := &Bus{pol: pol, wait: c.wait, dir: c.dir}
	if b.dir == "" {
		if b.dir, err = os.MkdirTemp("", "failbustest-"); err != nil {
			return nil, fmt.Errorf("store folder: %w", err)
		}
		b.temp = true
	}
	defer func() {
		if err != nil {
			_ = b.Close()
		}
	}()
	log := zerolog.Nop()
	if c.log != nil {
		log = zerolog.New(c.log).With().Timestamp().Logger()
	}
	o := devbus.Options{
		Server: embedded.Options{Dir: filepath.Join(b.dir, "store"), ServerName: "failbustest"},
		Policy: pol,
		Log:    log,
	}
	if c.authOn {
		if b.users, err = auth.Init(filepath.Join(b.dir, "auth"), c.authAgents); err != nil {
			return nil, err
		}
		o.Auth = b.users
	}
	if b.dev, err = devbus.Start(o); err != nil {
		return nil, err
	}
	copts, err := b.credentials(auth.RoleAdmin)
	if err != nil {
		return nil, err
	}
	if b.nc, err = nats.Connect(b.URL(), append(copts, nats.Name("failbustest"))...); err != nil {
		return nil, fmt.Errorf("connect to the test bus: %w", err)
	}
	if b.js, err = jetstream.New(b.nc); err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if b.helper, err = agent.New(b.nc, helperAgent); err != nil {
		return nil, err
	}
	return b, nil
}

// buildPolicy is ShortTimes with the caller's policy on top, checked
// alone first so its errors name its own lines.
func buildPolicy(c config) (*policy.Policy, error) {
	if c.err != nil {
		return nil, c.err
	}
	if len(c.policy) > 0 {
		if _, err := policy.Parse(c.policy); err != nil {
			return nil, fmt.Errorf("%s: %w", c.policySource, err)
		}
	}
	if c.productTimes {
		return policy.Parse(c.policy)
	}
	var base, own map[string]any
	if err := yaml.Unmarshal([]byte(ShortTimes), &base); err != nil {
		return nil, fmt.Errorf("ShortTimes: %w", err)
	}
	if err := yaml.Unmarshal(c.policy, &own); err != nil {
		return nil, fmt.Errorf("%s: %w", c.policySource, err)
	}
	merged, err := yaml.Marshal(mergeMaps(base, own))
	if err != nil {
		return nil, err
	}
	p, err := policy.Parse(merged)
	if err != nil {
		return nil, fmt.Errorf("%s on top of ShortTimes: %w", c.policySource, err)
	}
	return p, nil
}

// mergeMaps lays over onto base: a key in both whose values are both
// mappings is merged, any other value of over replaces base's.
func mergeMaps(base, over map[string]any) map[string]any {
	out := make(map[string]any, len(base)+len(over))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		bm, ok1 := out[k].(map[string]any)
		om, ok2 := v.(map[string]any)
		if ok1 && ok2 {
			out[k] = mergeMaps(bm, om)
			continue
		}
		out[k] = v
	}
	return out
}

// URL is the nats:// URL of the bus's server, what an agent under test is
// given instead of a deployed bus's.
func (b *Bus) URL() string { return b.dev.Srv.ClientURL() }

// Conn is a connection to the bus, shared by whoever needs one (the admin's
// under WithAuth); the bus closes it.
func (b *Bus) Conn() *nats.Conn { return b.nc }

// JetStream is a JetStream context on Conn: to read any stream of the
// topology (jetstream/) in a test's own assertions.
func (b *Bus) JetStream() jetstream.JetStream { return b.js }

// AgentConn connects as the agent called name, with the credentials
// WithAuth made for it, so what the agent does is checked against that
// agent's permissions. Without WithAuth it is a plain connection. The
// caller closes it.
func (b *Bus) AgentConn(name string) (*nats.Conn, error) {
	opts, err := b.credentials(auth.Agent(name).Name)
	if err != nil {
		return nil, fmt.Errorf("failbustest: agent %s: %w", name, err)
	}
	return nats.Connect(b.URL(), append(opts, nats.Name(name))...)
}

// credentials are the connect options of role's user under WithAuth: its
// nkey, and its inbox (_INBOX.<public key>, the only one it may read);
// none without WithAuth.
func (b *Bus) credentials(role string) ([]nats.Option, error) {
	if b.users == nil {
		return nil, nil
	}
	for _, u := range b.users.Users {
		if u.Role.Name != role {
			continue
		}
		nk, err := nats.NkeyOptionFromSeed(u.SeedFile)
		if err != nil {
			return nil, fmt.Errorf("credentials of %s: %w", role, err)
		}
		return []nats.Option{nk, nats.CustomInboxPrefix(connect.InboxPrefixFor(u.Public))}, nil
	}
	return nil, fmt.Errorf("no user %s: name the agent in WithAuth", role)
}

// Close stops every service (each finishes what it is handling), the
// server, and removes the store New made. It is safe to call twice; Start
// calls it when the test ends. It returns why a service stopped on its
// own before, if one did.
func (b *Bus) Close() error {
	b.closeOnce.Do(func() {
		if b.nc != nil {
			b.nc.Close()
		}
		if b.dev != nil {
			b.closeErr = b.dev.Stop()
		}
		if b.temp {
			_ = os.RemoveAll(b.dir)
		}
	})
	return b.closeErr
}

// WaitDecision waits for the scheduler's decision on the outcome with id
// outcomeID, whichever agent reported it, and returns it; the test fails
// if none comes within the bus's wait (WithWait). A decision already made
// is returned at once. A successful outcome gets no decision: wait for
// those of failures.
func (b *Bus) WaitDecision(t testing.TB, outcomeID string) events.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), b.wait)
	defer cancel()
	d, err := b.Decision(ctx, outcomeID)
	if err != nil {
		t.Fatalf("failbustest: %v", err)
	}
	return d
}

// Decision is WaitDecision for code without a testing.TB: it waits until
// ctx ends.
func (b *Bus) Decision(ctx context.Context, outcomeID string) (events.Decision, error) {
	var found events.Decision
	err := b.scan(ctx, topology.StreamDecisions, events.DecisionPrefix+".>", func(m jetstream.Msg) (bool, error) {
		d, err := events.DecodeAs[*events.Decision](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			return false, nil // not ours to judge: the services dead-letter junk
		}
		if d.OutcomeID != outcomeID {
			return false, nil
		}
		found = *d
		return true, nil
	})
	if err != nil {
		return events.Decision{}, fmt.Errorf("no decision on outcome %s: %w", outcomeID, err)
	}
	return found, nil
}

// scan reads stream's messages on filter from the first, waiting for new
// ones, until fn says done or ctx ends.
func (b *Bus) scan(ctx context.Context, stream, filter string, fn func(jetstream.Msg) (bool, error)) error {
	cons, err := b.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("read %s: %w", stream, err)
		}
		done, err := fn(m)
		if err != nil || done {
			return err
		}
	}
}

// ProviderDown makes provider go down the way a real outage does: it
// reports the network failures (connection refused) the fault scope needs
// on every profile of provider seen so far, and waits for the scheduler to
// declare the outage (an `outage` health record). From then on agents
// hold their calls to provider (wait_provider), its tasks wait and the
// recovery service asks holding agents for probes. The test fails if the
// outage is not declared within the bus's wait.
func (b *Bus) ProviderDown(t testing.TB, provider string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), b.wait)
	defer cancel()
	if err := b.TakeDown(ctx, provider); err != nil {
		t.Fatalf("failbustest: %v", err)
	}
}

// TakeDown is ProviderDown for code without a testing.TB.
func (b *Bus) TakeDown(ctx context.Context, provider string) error {
	if h, ok, err := b.health(ctx, provider); err != nil {
		return err
	} else if ok && h.State == events.HealthOutage {
		return nil
	}
	profiles, err := b.profiles(ctx, provider)
	if err != nil {
		return err
	}
	for range b.pol.Scope.OutageMinFailures {
		for _, p := range profiles {
			o := &events.Outcome{Provider: provider, Profile: p,
				TransportError: "dial tcp 127.0.0.1:443: connect: connection refused (failbustest: ProviderDown)"}
			if err := b.helper.Report(ctx, o); err != nil {
				return fmt.Errorf("take %s down: %w", provider, err)
			}
		}
	}
	if err := b.awaitHealth(ctx, provider, events.HealthOutage); err != nil {
		return fmt.Errorf("take %s down: %w", provider, err)
	}
	return nil
}

// ProviderUp brings provider back from an outage the way a real recovery
// happens: it reports successful calls, spaced over the policy's
// scope.recovery_min_time, until the scheduler declares it recovered (a
// `recovered` health record); the recovery service then runs its
// checklist and releases held tasks. A provider not in an outage is left
// alone. The test fails if the recovery is not declared within the bus's
// wait.
func (b *Bus) ProviderUp(t testing.TB, provider string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), b.wait)
	defer cancel()
	if err := b.BringUp(ctx, provider); err != nil {
		t.Fatalf("failbustest: %v", err)
	}
}

// BringUp is ProviderUp for code without a testing.TB.
func (b *Bus) BringUp(ctx context.Context, provider string) error {
	h, ok, err := b.health(ctx, provider)
	if err != nil {
		return err
	}
	if !ok || h.State == events.HealthRecovered || h.State == events.HealthHealthy {
		return nil
	}
	// Successes spaced so that RecoveryMinSuccesses of them span
	// RecoveryMinTime; more come while the scheduler has not answered.
	n := max(b.pol.Scope.RecoveryMinSuccesses-1, 1)
	every := max(b.pol.Scope.RecoveryMinTime/time.Duration(n), 5*time.Millisecond)
	for {
		o := &events.Outcome{Provider: provider, OK: true, Status: 200}
		if err := b.helper.Report(ctx, o); err != nil {
			return fmt.Errorf("bring %s up: %w", provider, err)
		}
		wctx, cancel := context.WithTimeout(ctx, every)
		err := b.awaitHealth(wctx, provider, events.HealthRecovered)
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("bring %s up: %w", provider, ctx.Err())
		case !errors.Is(err, context.DeadlineExceeded):
			return fmt.Errorf("bring %s up: %w", provider, err)
		}
	}
}

// health is provider's latest health record; ok is false when it has none.
func (b *Bus) health(ctx context.Context, provider string) (events.Health, bool, error) {
	s, err := b.js.Stream(ctx, topology.StreamHealth)
	if err != nil {
		return events.Health{}, false, fmt.Errorf("health of %s: %w", provider, err)
	}
	m, err := s.GetLastMsgForSubject(ctx, events.HealthSubject(provider))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return events.Health{}, false, nil
	}
	if err != nil {
		return events.Health{}, false, fmt.Errorf("health of %s: %w", provider, err)
	}
	h, err := events.DecodeAs[*events.Health](m.Subject, m.Header, m.Data)
	if err != nil {
		return events.Health{}, false, fmt.Errorf("health of %s: %w", provider, err)
	}
	return *h, true, nil
}

// awaitHealth polls provider's latest health record until its state is
// want or ctx ends. Polling (every 5ms) is cheaper here than a consumer:
// the record is one GET, and the wait is short.
func (b *Bus) awaitHealth(ctx context.Context, provider, want string) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	last := "none"
	for {
		h, ok, err := b.health(ctx, provider)
		if err != nil && ctx.Err() == nil {
			return err
		}
		if ok {
			if h.State == want {
				return nil
			}
			last = h.State + " (" + h.Reason + ")"
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no %s health record for %s, the latest is %s: %w", want, provider, last, ctx.Err())
		case <-tick.C:
		}
	}
}

// profiles are the auth profiles of provider in the outcomes stored so
// far: an outage needs every one of them failing. "" (no profile) when
// none was named.
func (b *Bus) profiles(ctx context.Context, provider string) ([]string, error) {
	s, err := b.js.Stream(ctx, topology.StreamOutcomes)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	if last := info.State.LastSeq; info.State.Msgs > 0 {
		err = b.scan(ctx, topology.StreamOutcomes, events.OutcomePrefix+".>", func(m jetstream.Msg) (bool, error) {
			if o, err := events.DecodeAs[*events.Outcome](m.Subject(), m.Headers(), m.Data()); err == nil && o.Provider == provider {
				seen[o.Profile] = true
			}
			meta, err := m.Metadata()
			if err != nil {
				return false, err
			}
			return meta.Sequence.Stream >= last, nil
		})
		if err != nil {
			return nil, err
		}
	}
	if len(seen) == 0 {
		seen[""] = true
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out, nil
}

// testLog passes log lines to t.Log until the bus is closed (t.Log after
// the test ended panics).
type testLog struct {
	mu     sync.Mutex
	t      testing.TB
	closed bool
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.t.Logf("failbus: %s", bytesTrimNL(p))
	}
	return len(p), nil
}

func (l *testLog) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}

func bytesTrimNL(p []byte) string {
	for len(p) > 0 && (p[len(p)-1] == '\n' || p[len(p)-1] == '\r') {
		p = p[:len(p)-1]
	}
	return string(p)
}

// warnOnly passes on warnings and worse only.
type warnOnly struct{ w io.Writer }

func (w warnOnly) Write(p []byte) (int, error) { return w.w.Write(p) }

func (w warnOnly) WriteLevel(l zerolog.Level, p []byte) (int, error) {
	if l < zerolog.WarnLevel {
		return len(p), nil
	}
	return w.w.Write(p)
}
