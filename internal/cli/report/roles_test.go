package report_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/internal/auth"
	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/cli/clitest"
	"github.com/failbus/failbus/internal/cli/decode"
	"github.com/failbus/failbus/internal/cli/dlq"
	"github.com/failbus/failbus/internal/cli/health"
	"github.com/failbus/failbus/internal/cli/lag"
	"github.com/failbus/failbus/internal/cli/report"
	"github.com/failbus/failbus/internal/cli/shadow"
	"github.com/failbus/failbus/internal/cli/tail"
	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/servicespec"
	"github.com/failbus/failbus/pkg/events"
)

// TestOperatorCommandsUnderTheirRoles: on a bus that refuses connections
// without credentials, the operator role, which may create no consumer,
// runs lag, report (also with --shadow), shadow, health, tail (every way
// it starts, following too) and dlq ls/show; dlq requeue, which
// publishes, is refused to it, naming the permission, and runs as admin.
func TestOperatorCommandsUnderTheirRoles(t *testing.T) {
	t.Parallel()
	set, err := auth.Init(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	bus, err := devbus.Start(devbus.Options{Server: embedded.Options{Dir: t.TempDir()}, Auth: set,
		Specs: []daemon.Spec{servicespec.Classifier()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	if _, err := bus.JS.Publish(t.Context(), events.OutcomeSubject("openai", "bot"), []byte("junk")); err != nil {
		t.Fatal(err)
	}
	hdata, hhdr, err := events.Encode(&events.Health{At: events.At(time.Now()), Provider: "openai", State: events.HealthHealthy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.JS.PublishMsg(t.Context(), &nats.Msg{Subject: events.HealthSubject("openai"), Header: hhdr, Data: hdata}); err != nil {
		t.Fatal(err)
	}
	commands := []cli.Command{lag.Command, report.Command, shadow.Command, tail.Command, dlq.Command, decode.Command, health.Command}
	newPolicy := filepath.Join(t.TempDir(), "new.yaml")
	if err := os.WriteFile(newPolicy, []byte("retry:\n  max_retries: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	as := func(role string, args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		args = append(args, "--server", bus.Srv.ClientURL(), "--nkey", set.Seed(role))
		code := cli.Main(commands, args, nil, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	clitest.WaitFor(t, "the junk dead-lettered", func() bool {
		_, out, _ := as(auth.RoleOperator, "dlq", "ls", "--json")
		return strings.Contains(out, `"service":"classifier"`)
	})
	for _, args := range [][]string{
		{"lag"},
		{"lag", "--json", "classifier"},
		{"report", "--json", "--since", "1h"},
		{"report", "--since", "1h"},
		{"report", "--json", "--since", "1h", "--shadow", newPolicy},
		{"shadow", "--policy", newPolicy},
		{"tail", "--no-follow", "failbus.dlq.>"},
		{"tail", "--no-follow", "--last", "1", "failbus.dlq.>", "failbus.outcome.>"},
		{"tail", "--no-follow", "--last-per-subject", "failbus.outcome.>"},
		{"tail", "--no-follow", "--since", "1h", "failbus.>"},
		{"tail", "--count", "1", "--start-seq", "1", "failbus.dlq.>"},
		{"health", "--json"},
		{"health"},
		{"dlq", "ls"},
		{"dlq", "show", "1"},
		{"health"},
	} {
		if code, out, errOut := as(auth.RoleOperator, args...); code != 0 || out == "" {
			t.Errorf("operator: failbus %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
	}
	code, _, errOut := as(auth.RoleOperator, "dlq", "requeue", "1")
	if code != 1 || !strings.Contains(errOut, "permission") {
		t.Errorf("operator: dlq requeue: exit %d, %q; want it refused for want of permission", code, errOut)
	}
	t.Logf("operator: dlq requeue: %s", errOut)
	code, out, errOut := as(auth.RoleAdmin, "dlq", "requeue", "1")
	if code != 0 || !strings.Contains(out, "requeued → failbus.outcome.openai.bot") {
		t.Errorf("admin: dlq requeue: exit %d\n%s%s", code, out, errOut)
	}
}

// TestOperatorCommandsDeniedFailFast: a role that may not read what an
// operator command reads (the agent's, the notifier's) is told so by the
// server at once;
// each command fails with that denial, naming the subject and the user,
// instead of waiting for a timeout, and prints nothing on stdout first (a
// script believes the first line).
func TestOperatorCommandsDeniedFailFast(t *testing.T) {
	t.Parallel()
	set, err := auth.Init(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	bus, err := devbus.Start(devbus.Options{Server: embedded.Options{Dir: t.TempDir()}, Auth: set,
		Specs: []daemon.Spec{servicespec.Classifier()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	commands := []cli.Command{lag.Command, report.Command, shadow.Command, tail.Command, dlq.Command, health.Command}
	newPolicy := filepath.Join(t.TempDir(), "new.yaml")
	if err := os.WriteFile(newPolicy, []byte("retry:\n  max_retries: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The agent role reads health (a held call waits for it), so health is
	// run as the notifier, which does not.
	for _, c := range []struct {
		role string
		args []string
	}{
		{auth.RoleNotifier, []string{"health"}},
		{auth.RoleNotifier, []string{"health", "--json", "openai"}},
		{auth.RoleAgent, []string{"report", "--json", "--since", "1h"}},
		{auth.RoleAgent, []string{"dlq", "ls"}},
		{auth.RoleAgent, []string{"dlq", "show", "1"}},
		{auth.RoleAgent, []string{"lag"}},
		{auth.RoleAgent, []string{"shadow", "--policy", newPolicy}},
		{auth.RoleAgent, []string{"tail", "--no-follow", "failbus.dlq.>"}},
		{auth.RoleNotifier, []string{"tail", "--last", "1", "--no-follow", "failbus.health.>"}},
	} {
		args := c.args
		t.Run(c.role+" "+strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			start := time.Now()
			code := cli.Main(commands, append(args, "--server", bus.Srv.ClientURL(), "--nkey", set.Seed(c.role)), nil, &stdout, &stderr)
			took := time.Since(start)
			errOut := stderr.String()
			if code != 1 || !strings.Contains(errOut, "permission denied") || !strings.Contains(errOut, "as user "+c.role) {
				t.Errorf("exit %d, stderr %q; want 1 and the denial named", code, errOut)
			}
			for _, waited := range []string{"timeout", "deadline exceeded", "timed out"} {
				if strings.Contains(errOut, waited) {
					t.Errorf("stderr %q: the denial came by waiting (%s)", errOut, waited)
				}
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout %q before the denial", stdout.String())
			}
			t.Logf("%s (took %s)", strings.TrimSpace(errOut), took.Round(time.Millisecond))
		})
	}
}
