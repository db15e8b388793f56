package status_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/failbus/failbus/internal/auth"
	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/status"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// fastPolicy compresses the fault scope's hysteresis and recovery's
// probing, so an outage and its recovery take seconds.
const fastPolicy = "scope:\n  recovery_min_successes: 3\n  recovery_min_time: 1s\nrecovery:\n  drain_rate: 50\n  probe_interval: 300ms\n"

// readOnly is what the status page must do without: creating, changing,
// deleting or reading through any consumer (ordered ones included), and
// acknowledging. The page's user is the operator with these denied on
// top, whatever the operator role allows today.
var readOnly = []string{
	"$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>", "$JS.API.CONSUMER.DELETE.>",
	"$JS.API.CONSUMER.MSG.NEXT.>", "$JS.API.CONSUMER.PAUSE.>", "$JS.API.STREAM.PURGE.>",
	"$JS.ACK.>", "$JS.FC.>",
}

// operatorBus is every service on a bus with the users of `auth init`,
// the operator narrowed to readOnly; it returns the bus, the users and a
// connection as the operator.
func operatorBus(t *testing.T, pol *policy.Policy) (*devbus.Bus, *auth.Set, *connect.Conn) {
	t.Helper()
	set, err := auth.Init(filepath.Join(t.TempDir(), "auth"), nil)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := os.ReadFile(set.Seed(auth.RoleOperator))
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	narrowed := false
	bus, err := devbus.Start(devbus.Options{
		Server: embedded.Options{Dir: t.TempDir(), Configure: func(o *server.Options) {
			for _, u := range o.Nkeys {
				if u.Nkey == pub && u.Permissions != nil && u.Permissions.Publish != nil {
					u.Permissions.Publish.Deny = append(u.Permissions.Publish.Deny, readOnly...)
					narrowed = true
				}
			}
		}},
		Policy: pol,
		Auth:   set,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	if !narrowed {
		t.Fatal("the operator's user was not found in the server's configuration")
	}
	op, err := connect.Connect(connect.Options{Servers: bus.Srv.ClientURL(), Nkey: set.Seed(auth.RoleOperator)}, "status")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(op.Close)
	return bus, set, op
}

// pageState is what the test reads off the page's DOM.
type pageState struct {
	Conn      string `json:"conn"`
	Updated   string `json:"updated"`
	Providers []struct {
		Name      string   `json:"name"`
		State     string   `json:"state"`
		Since     string   `json:"since"`
		Reason    string   `json:"reason"`
		Held      string   `json:"held"`
		Checklist string   `json:"checklist"`
		Steps     []string `json:"steps"`
	} `json:"providers"`
	Consumers   []string `json:"consumers"`
	DeadLetters string   `json:"dead_letters"`
	Reasons     []string `json:"reasons"`
	Requested   string   `json:"requested"`
	Problems    []string `json:"problems"`
}

// readPage is evaluated in the page: the figures as a person sees them.
const readPage = `JSON.stringify({
  conn: document.getElementById("conn").getAttribute("data-state"),
  updated: document.getElementById("updated").textContent,
  providers: Array.from(document.querySelectorAll("#providers tr[data-provider]")).map(function (r) {
    var sum = r.querySelector('[data-k="checklist-summary"]');
    return {
      name: r.getAttribute("data-provider"),
      state: r.querySelector('[data-k="state"]').textContent,
      since: r.querySelector('[data-k="since"]').textContent,
      reason: r.querySelector('[data-k="reason"]').textContent,
      held: r.querySelector('[data-k="held"]').textContent,
      checklist: sum ? sum.textContent : "",
      steps: Array.from(r.querySelectorAll(".step")).map(function (s) { return s.textContent + "=" + s.getAttribute("data-done"); })
    };
  }),
  consumers: Array.from(document.querySelectorAll("#consumers tr[data-consumer]")).map(function (r) { return r.getAttribute("data-consumer"); }),
  dead_letters: document.querySelector('[data-k="dead_letters_total"]').textContent,
  reasons: Array.from(document.querySelectorAll("#dead-letters tr[data-reason]")).map(function (r) { return r.getAttribute("data-reason") + " x" + r.querySelector('[data-k="count"]').textContent; }),
  requested: document.querySelector('[data-k="notify_requested"]').textContent,
  problems: Array.from(document.querySelectorAll("#problems li:not(.muted)")).map(function (l) { return l.textContent; })
})`

// shoot saves a screenshot of the page as <name>.png into the folder
// FAILBUS_STATUS_SCREENSHOTS names (nothing without it): to look at what
// the test saw.
func shoot(t *testing.T, b *browser, name string) {
	dir := os.Getenv("FAILBUS_STATUS_SCREENSHOTS")
	if dir == "" {
		return
	}
	if err := b.screenshot(filepath.Join(dir, name+".png")); err != nil {
		t.Logf("screenshot %s: %v", name, err)
	}
}

// waitPage polls the page until ok accepts what it shows.
func waitPage(t *testing.T, b *browser, what string, limit time.Duration, ok func(p pageState) bool) pageState {
	t.Helper()
	deadline := time.Now().Add(limit)
	var last pageState
	var lastErr error
	for {
		s, err := b.eval(readPage)
		if err == nil {
			var p pageState
			if err = json.Unmarshal([]byte(s), &p); err == nil {
				last = p
				if ok(p) {
					return p
				}
			}
		}
		lastErr = err
		if time.Now().After(deadline) {
			got, _ := json.MarshalIndent(last, "", "  ")
			t.Fatalf("the page did not show %s within %s (last error %v); it shows:\n%s", what, limit, lastErr, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (p pageState) provider(name string) (state, held, checklist string, steps []string, ok bool) {
	for _, r := range p.Providers {
		if r.Name == name {
			return r.State, r.Held, r.Checklist, r.Steps, true
		}
	}
	return "", "", "", nil, false
}

// TestStatusPageShowsAnOutageAndItsRecovery drives an outage on a real
// bus (every service, each as its own role) and watches the status page in
// headless Chromium, read as the operator with no consumer rights, never
// reloaded: the provider goes to outage with its held tasks and a dead
// letter by reason, then recovers, its checklist runs to the end and the
// held tasks leave.
func TestStatusPageShowsAnOutageAndItsRecovery(t *testing.T) {
	b := startBrowser(t) // skips without Chromium outside CI
	pol, err := policy.Parse([]byte(fastPolicy))
	if err != nil {
		t.Fatal(err)
	}
	bus, set, op := operatorBus(t, pol)
	js, err := jetstream.New(op.Conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	page := status.NewServer(ctx, status.NewCollector(js, nil), 250*time.Millisecond, "")
	web := httptest.NewServer(page.Handler())
	t.Cleanup(web.Close)
	t.Cleanup(cancel) // ends the page's event stream before web.Close waits for it

	ac, err := connect.Connect(connect.Options{Servers: bus.Srv.ClientURL(), Nkey: set.Seed(auth.RoleAgent)}, "agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ac.Close)
	ag, err := agent.New(ac.Conn, "coord")
	if err != nil {
		t.Fatal(err)
	}
	const provider = "acme"
	report := func(ok bool) {
		o := &events.Outcome{Provider: provider, Profile: "p1", Model: "m"}
		if ok {
			o.OK, o.Status = true, 200
		} else {
			o.TransportError = "fetch failed: connect ECONNREFUSED"
		}
		if err := ag.Report(ctx, o); err != nil {
			t.Fatal(ac.Explain(err))
		}
	}
	report(true)

	b.open(web.URL + status.Path)
	p := waitPage(t, b, "the bus, live", 20*time.Second, func(p pageState) bool {
		return p.Conn == "live" && len(p.Consumers) > 0
	})
	if !slices.Contains(p.Consumers, "FAILBUS_OUTCOMES/classifier") {
		t.Errorf("consumers on the page: %v, want FAILBUS_OUTCOMES/classifier among them", p.Consumers)
	}

	// The outage: network failures until the scope says so, then tasks
	// that wait for the provider, and an outcome nobody can decode.
	healthIs := func(want string) bool {
		m, err := bus.JS.Conn().Request("$JS.API.DIRECT.GET.FAILBUS_HEALTH.failbus.health."+provider, nil, 5*time.Second)
		if err != nil || len(m.Data) == 0 {
			return false
		}
		h, err := events.DecodeAs[*events.Health](events.HealthSubject(provider), m.Header, m.Data)
		return err == nil && h.State == want
	}
	for i := 0; !healthIs(events.HealthOutage); i++ {
		if i > 60 {
			t.Fatal("no outage after 60 network failures")
		}
		report(false)
		time.Sleep(20 * time.Millisecond)
	}
	const tasks = 5
	for i := range tasks {
		if err := ag.SubmitTask(ctx, &events.Task{ID: "held-" + strconv.Itoa(i), Provider: provider}); err != nil {
			t.Fatal(ac.Explain(err))
		}
	}
	ajs, err := jetstream.New(ac.Conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ajs.Publish(ctx, events.OutcomeSubject(provider, "coord"), []byte("not msgpack")); err != nil {
		t.Fatal(ac.Explain(err))
	}

	p = waitPage(t, b, "the outage with its held tasks and the dead letter", 30*time.Second, func(p pageState) bool {
		state, held, _, _, ok := p.provider(provider)
		dl, _ := strconv.Atoi(p.DeadLetters)
		return ok && state == events.HealthOutage && held == strconv.Itoa(tasks) && dl >= 1
	})
	shoot(t, b, "outage")
	for _, r := range p.Providers {
		if r.Name == provider && (r.Reason == "" || !strings.Contains(r.Since, "ago")) {
			t.Errorf("the outage shows no why or since: %+v", r)
		}
	}
	if len(p.Reasons) == 0 || !strings.HasPrefix(p.Reasons[0], "classifier: ") {
		t.Errorf("dead letters by reason: %v, want the classifier's", p.Reasons)
	}
	if n, _ := strconv.Atoi(p.Requested); n < 1 {
		t.Errorf("notifications requested in the last hour: %s, want the outage's", p.Requested)
	}

	// The recovery: the provider answers again; the checklist runs and
	// releases the held tasks.
	recoverDeadline := time.Now().Add(30 * time.Second)
	for !healthIs(events.HealthRecovered) && !healthIs(events.HealthHealthy) {
		if time.Now().After(recoverDeadline) {
			t.Fatal("the provider did not recover")
		}
		report(true)
		time.Sleep(200 * time.Millisecond)
	}
	p = waitPage(t, b, "the recovery, its checklist done and no task held", 30*time.Second, func(p pageState) bool {
		state, held, checklist, _, ok := p.provider(provider)
		return ok && (state == events.HealthRecovered || state == events.HealthHealthy) && held == "0" && strings.HasPrefix(checklist, "done")
	})
	shoot(t, b, "recovered")
	_, _, checklist, steps, _ := p.provider(provider)
	want := make([]string, len(events.Steps))
	for i, s := range events.Steps {
		want[i] = s + "=true"
	}
	if !slices.Equal(steps, want) {
		t.Errorf("checklist steps %v (%s), want every step done: %v", steps, checklist, want)
	}
	if len(p.Problems) != 0 {
		t.Errorf("the page could not read everything as the operator: %v", p.Problems)
	}
	if d := op.Denials(); len(d) != 0 {
		t.Errorf("the page's reads were refused: %v", d)
	}
}
