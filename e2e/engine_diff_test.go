package e2e

// The engine's differential test: one scenario, run through `failbus
// simulate` and, with the same timestamps, published line by line to the
// in-process bus `failbus dev` runs (internal/devbus, every service built
// through its binary's spec). The classifications, decisions, health
// records and notifications sent must be identical, record for record: the
// services and simulate run one engine (internal/engine).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/cli/publish"
	"github.com/failbus/failbus/internal/cli/simulatecmd"
	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/policy/notification"
	recoverysvc "github.com/failbus/failbus/internal/service/recoverer"
	"github.com/failbus/failbus/internal/servicespec"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// diffScenario is the scenario: outcomes on several providers (an outage of
// openai on both profiles and its recovery, 429s with retry-after and
// retry-after-ms hints, an auth fault on one profile, a model fault, 503s
// backing off, a context overflow, groq failing most calls with 503 and
// 529 on both profiles — degraded, then down when none succeed), content
// refusals of one session with a
// boundary between its segments up to a freeze, and more non-critical
// notifications than the policy's daily budget of 2. Its times start at
// diffBase; the test moves them to the recent past.
const (
	diffScenario = "testdata/differential.jsonl"
	diffBase     = "2000-01-01T00:00:00Z"
	// diffSpan is how long after its first line the scenario's last line
	// is; the scenario is placed so that it ends diffSpan/4 before now.
	diffSpan = 55 * time.Second
)

// diffPolicy runs the scenario: the default jitter (drawn from each
// outcome's id on the bus and in simulate alike), short scope and refusal
// windows, a budget of 2, no
// outage probes within the scenario's minute (simulate's clock is the
// records', the bus's is real), and a webhook that records what is sent
// (%s is its URL).
const diffPolicy = `
retry:
  initial_delay: 1s
  max_delay: 30s
scope:
  window: 1m
  recovery_min_successes: 2
  recovery_min_time: 5s
  forget_after: 1h
refusal:
  reprobe_delays: [10s, 20s]
  state_ttl: 1h
recovery:
  probe_interval: 1h
notify:
  daily_budget: 2
  sinks:
    - name: hook
      type: webhook
      url: %s
`

func TestEngineSimulateAndDevDecideTheSame(t *testing.T) {
	t.Parallel()
	lines := diffShift(t, diffLines(t), diffStart(t))
	hook := newDiffHook(t)
	polFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(polFile, fmt.Appendf(nil, diffPolicy, hook.srv.URL), 0o600); err != nil {
		t.Fatal(err)
	}

	// failbus simulate.
	sim := simulateRecords(t, polFile, strings.Join(lines, "\n")+"\n")

	// The same lines, published one at a time to a bus running the
	// classifier, the scheduler with the refusal tiers, the notifier and
	// recovery.
	bus := policyBus(t, "failbus-differential", polFile, servicespec.Classifier(), servicespec.Scheduler(), servicespec.Notifier(), servicespec.Recovery())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, line := range lines {
		publishInput(t, bus.Srv.ClientURL(), line+"\n")
		// Every consequence of the line is handled before the next one is
		// published, as simulate handles it before the next line.
		diffSettle(ctx, t, bus.JS)
	}

	dev := busDecided(ctx, t, bus.JS)
	dev["notification"] = hook.sent(t)
	dev["recovery"] = diffRead[*events.Recovery](ctx, t, bus.JS, topology.StreamRecoveries, events.RecoveryPrefix+".>")
	dev["dispatch"] = diffRead[*events.Dispatch](ctx, t, bus.JS, topology.StreamDispatch, events.DispatchPrefix+".>")
	dev["control"] = diffRead[*events.Control](ctx, t, bus.JS, topology.StreamControl, events.ControlPrefix+".>")
	// A checklist step's `at` is when it ran: the records' time in
	// simulate, the clock on the bus. The rest must be identical.
	for _, side := range []map[string][]string{sim, dev} {
		side["recovery"] = diffWithout(t, side["recovery"], "at")
	}
	for _, typ := range []string{"classification", "decision", "health", "notification", "recovery", "dispatch", "control"} {
		s, d := slices.Sorted(slices.Values(sim[typ])), slices.Sorted(slices.Values(dev[typ]))
		if !slices.Equal(s, d) {
			t.Errorf("%s records differ:\n%s", typ, diffLinesReport(s, d))
		}
	}

	// The scenario did exercise what it is for.
	want := map[string][]string{
		"health": {`"state":"outage"`, `"state":"degraded"`, `"state":"recovered"`,
			`failed on the provider's side (overloaded, server_error), on every profile (q1, q2)`, `every profile (q1, q2) fails on the provider's side`},
		"decision":     {`"action":"wait_provider"`, `"delay_ms":3000`, `"delay_ms":1500`, `"action":"switch_profile"`, `"action":"switch_model"`, `"action":"compact"`, `"action":"skip_provider"`, `"retry":2`},
		"notification": {`"dedupe_key":"provider-outage:openai:`, `"dedupe_key":"` + notification.DigestKeyPrefix, `"dedupe_key":"provider-refusal:s3#1:2:anthropic"`},
		"recovery":     {`"step":"confirm"`, `"done":true`},
	}
	for typ, needles := range want {
		for _, n := range needles {
			if !slices.ContainsFunc(sim[typ], func(r string) bool { return strings.Contains(r, n) }) {
				t.Errorf("no %s record has %s: the scenario no longer covers it", typ, n)
			}
		}
	}
	budgeted := 0
	for _, r := range sim["notification"] {
		if strings.Contains(r, `"severity":"normal"`) && !strings.Contains(r, notification.DigestKeyPrefix) {
			budgeted++
		}
	}
	if budgeted != 2 {
		t.Errorf("%d non-critical notifications sent besides the digest, want the budget's 2", budgeted)
	}
	t.Logf("identical: %d classifications, %d decisions, %d health records, %d notifications sent, %d recovery step records",
		len(sim["classification"]), len(sim["decision"]), len(sim["health"]), len(sim["notification"]), len(sim["recovery"]))
}

// diffLines reads the scenario.
func diffLines(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(diffScenario)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for l := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

// diffStart is where the scenario's first line goes: so that it ends a
// little before now (every `at` is in the past, as an agent's report is)
// and within the current UTC day, which is the day both the notifier
// (its clock) and simulate (the records' time) count the budget in. Just
// after midnight it waits until the day has room for the scenario.
func diffStart(t *testing.T) time.Time {
	t.Helper()
	now := time.Now().UTC()
	start := now.Add(-diffSpan - diffSpan/4)
	if midnight := now.Truncate(24 * time.Hour); start.Before(midnight) {
		wait := midnight.Sub(start) + time.Second
		t.Logf("waiting %v: the scenario must fit in one UTC day", wait)
		<-time.After(wait)
		return diffStart(t)
	}
	return start.Truncate(time.Millisecond)
}

// diffShift moves every line's `at` by start - diffBase.
func diffShift(t *testing.T, lines []string, start time.Time) []string {
	t.Helper()
	base, _ := time.Parse(time.RFC3339, diffBase)
	out := make([]string, len(lines))
	for i, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("scenario line %d: %v", i+1, err)
		}
		at, err := time.Parse(time.RFC3339Nano, rec["at"].(string))
		if err != nil {
			t.Fatalf("scenario line %d: at: %v", i+1, err)
		}
		rec["at"] = start.Add(at.Sub(base)).Format(time.RFC3339Nano)
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = string(b)
	}
	return out
}

// diffSettle waits until every service's consumer has acknowledged all of
// its stream, in one pass: each stage publishes its outputs before it
// acknowledges its input, so the later stages see them.
func diffSettle(ctx context.Context, t *testing.T, js jetstream.JetStream) {
	t.Helper()
	waitSettled(ctx, t, js, [][2]string{
		{topology.StreamOutcomes, topology.ConsumerClassifier},
		{topology.StreamClassified, topology.ConsumerScheduler},
		{topology.StreamClassified, topology.ConsumerRefusals},
		{topology.StreamOutcomes, topology.ConsumerRefusalBoundaries},
		{topology.StreamNotify, topology.ConsumerNotifier},
		{topology.StreamHealth, topology.ConsumerRecovery},
	}, func() bool { return recoverySettled(ctx, t, js) })
}

// waitSettled polls until every (stream, consumer) of consumers has caught
// up and also (when set) holds.
func waitSettled(ctx context.Context, t *testing.T, js jetstream.JetStream, consumers [][2]string, also func() bool) {
	t.Helper()
	for {
		all := also == nil || also()
		for _, c := range consumers {
			if !all {
				break
			}
			ok, err := embedded.CaughtUp(ctx, js, c[0], c[1])
			if err != nil {
				t.Fatal(err)
			}
			all = ok
		}
		if all {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("timed out waiting for the services to settle")
		case <-time.After(5 * time.Millisecond): // poll interval, bounded by ctx
		}
	}
}

// policyBus starts a bus running specs under the policy file polFile (as
// `failbus dev --policy`), stopped when the test ends: the bus side of a
// differential test against simulateRecords.
func policyBus(t *testing.T, name, polFile string, specs ...daemon.Spec) *devbus.Bus {
	t.Helper()
	pol, err := policy.Load(polFile)
	if err != nil {
		t.Fatal(err)
	}
	bus, err := devbus.Start(devbus.Options{
		Server: embedded.Options{ServerName: name},
		Policy: pol, PolicyFile: polFile,
		Specs: specs,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	return bus
}

// simulateRecords runs input through `failbus simulate` with the policy
// file and returns its records by type, canonical.
func simulateRecords(t *testing.T, polFile, input string) map[string][]string {
	t.Helper()
	var simOut, simErr bytes.Buffer
	if code := simulatecmd.Command.Run([]string{"--policy", polFile}, strings.NewReader(input), &simOut, &simErr); code != 0 {
		t.Fatalf("failbus simulate exited %d: %s", code, simErr.String())
	}
	sim := map[string][]string{}
	sc := bufio.NewScanner(&simOut)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("simulate wrote %q: %v", sc.Text(), err)
		}
		typ, _ := rec["type"].(string)
		delete(rec, "type")
		if typ == "error" {
			t.Fatalf("simulate: error record %v", rec)
		}
		sim[typ] = append(sim[typ], canonical(t, rec))
	}
	return sim
}

// publishInput publishes Outcome JSON Lines with `failbus publish`.
func publishInput(t *testing.T, url, input string) {
	t.Helper()
	var out, errb bytes.Buffer
	if code := publish.Command.Run([]string{"--server", url}, strings.NewReader(input), &out, &errb); code != 0 {
		t.Fatalf("failbus publish of %q exited %d: %s %s", input, code, out.String(), errb.String())
	}
}

// busDecided reads what the classifier and the scheduler stored:
// classification, decision and health records, canonical, as
// simulateRecords names them.
func busDecided(ctx context.Context, t *testing.T, js jetstream.JetStream) map[string][]string {
	t.Helper()
	return map[string][]string{
		"classification": diffRead[*events.Classification](ctx, t, js, topology.StreamClassified, events.ClassifiedPrefix+".>"),
		"decision":       diffRead[*events.Decision](ctx, t, js, topology.StreamDecisions, events.DecisionPrefix+".>"),
		"health":         diffRead[*events.Health](ctx, t, js, topology.StreamHealth, events.HealthPrefix+".>"),
	}
}

// recoverySettled reports whether no recovery checklist is under way: as
// simulate runs a provider's checklist within the step that recovered it.
func recoverySettled(ctx context.Context, t *testing.T, js jetstream.JetStream) bool {
	t.Helper()
	st, err := recoverysvc.OpenStore(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	names, err := st.ListProviders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		r, _, err := st.LoadProvider(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if r != nil && len(r.Episodes) > 0 && !r.Episodes[0].RecoveredAt.IsZero() {
			return false
		}
	}
	return true
}

// diffWithout drops key from each canonical record.
func diffWithout(t *testing.T, recs []string, key string) []string {
	t.Helper()
	ms := recordMaps(t, recs)
	out := make([]string, len(ms))
	for i, m := range ms {
		delete(m, key)
		out[i] = canonical(t, m)
	}
	return out
}

// recordMaps decodes canonical records (JSON objects) back into maps.
func recordMaps(t *testing.T, recs []string) []map[string]any {
	t.Helper()
	out := make([]map[string]any, len(recs))
	for i, r := range recs {
		if err := json.Unmarshal([]byte(r), &out[i]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// diffRead returns every record of stream on filter, canonical.
func diffRead[T events.Message](ctx context.Context, t *testing.T, js jetstream.JetStream, stream, filter string) []string {
	t.Helper()
	oc, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for {
		batch, err := oc.FetchNoWait(256)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			v, err := events.DecodeAs[T](m.Subject(), m.Headers(), m.Data())
			if err != nil {
				t.Fatalf("%s: %v", m.Subject(), err)
			}
			out = append(out, canonical(t, v))
			got++
		}
		if got == 0 {
			return out
		}
	}
}

// canonical is v as JSON with sorted keys.
func canonical(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	b, err = json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// diffLinesReport lists the records only one side has.
func diffLinesReport(sim, dev []string) string {
	var b strings.Builder
	for _, s := range sim {
		if !slices.Contains(dev, s) {
			fmt.Fprintf(&b, "  only simulate: %s\n", s)
		}
	}
	for _, d := range dev {
		if !slices.Contains(sim, d) {
			fmt.Fprintf(&b, "  only dev:      %s\n", d)
		}
	}
	if b.Len() == 0 {
		fmt.Fprintf(&b, "  the same records, counted differently (%d vs %d)\n", len(sim), len(dev))
	}
	return b.String()
}

// diffHook is the webhook sink: it records each notification it accepts.
type diffHook struct {
	srv  *httptest.Server
	mu   sync.Mutex
	got  []string
	errs []error
}

func newDiffHook(t *testing.T) *diffHook {
	h := &diffHook{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var n events.Notification
		if err == nil {
			err = json.Unmarshal(body, &n)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if err != nil {
			h.errs = append(h.errs, err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h.got = append(h.got, canonical(t, n))
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *diffHook) sent(t *testing.T) []string {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, err := range h.errs {
		t.Errorf("webhook: %v", err)
	}
	return slices.Clone(h.got)
}
