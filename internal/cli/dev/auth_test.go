package dev

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/internal/cli/apply"
	"github.com/failbus/failbus/internal/cli/clitest"
	"github.com/failbus/failbus/internal/cli/publish"
	"github.com/failbus/failbus/internal/cli/tail"
	"github.com/failbus/failbus/internal/connect"
)

// failbus dev --auth: a connection without credentials is refused; an
// agent publishes with agent.nk and cannot publish health, decisions or
// controls; the operator tails but publishes nothing and cannot change
// the topology; every error names the subject and the user.
func TestCLIDevAuth(t *testing.T) {
	for _, v := range []string{connect.EnvServer, connect.EnvCreds, connect.EnvNkey, connect.EnvUser, connect.EnvPassword, connect.EnvInboxPrefix} {
		t.Setenv(v, "")
	}
	data := filepath.Join(t.TempDir(), "store")
	url, _, stop := startDevInProcess(t, "--port", "0", "--data", data, "--ops-addr", "127.0.0.1:0", "--auth")
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	seed := func(role string) string { return filepath.Join(data, "auth", role+".nk") }

	if nc, err := nats.Connect(url); err == nil {
		nc.Close()
		t.Fatal("a connection without credentials was accepted")
	}
	cmd := func(run func([]string, *strings.Reader, *bytes.Buffer, *bytes.Buffer) int, stdin string, args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := run(args, strings.NewReader(stdin), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	pub := func(args []string, in *strings.Reader, out, errOut *bytes.Buffer) int {
		return publish.Command.Run(args, in, out, errOut)
	}
	tl := func(args []string, in *strings.Reader, out, errOut *bytes.Buffer) int {
		return tail.Command.Run(args, in, out, errOut)
	}
	ap := func(args []string, in *strings.Reader, out, errOut *bytes.Buffer) int {
		return apply.Command.Run(args, in, out, errOut)
	}

	code, _, errOut := cmd(pub, `{"id":"o-1","agent":"bot","provider":"openai","status":429}`+"\n", "--server", url)
	if code != 1 || !strings.Contains(errOut, "requires credentials") {
		t.Errorf("publish without credentials: exit %d\n%s", code, errOut)
	}
	code, _, errOut = cmd(pub, `{"id":"o-1","agent":"bot","provider":"openai","status":429}`+"\n", "--server", url, "--nkey", seed("agent"))
	if code != 0 {
		t.Fatalf("publish as agent: exit %d\n%s", code, errOut)
	}

	// The agent may not publish what the services decide.
	ac, err := connect.Connect(connect.Options{Servers: url, Nkey: seed("agent")}, "test-agent")
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	for _, subject := range []string{"failbus.health.openai", "failbus.decision.bot", "failbus.control.bot"} {
		if err := ac.Publish(subject, []byte("forged")); err != nil {
			t.Fatal(err)
		}
		if err := ac.Flush(); err != nil {
			t.Fatal(err)
		}
		want := "permission denied publishing " + subject + " as user agent"
		clitest.WaitFor(t, want, func() bool {
			for _, d := range ac.Denials() {
				if d.String() == want {
					return true
				}
			}
			return false
		})
	}

	// The operator reads: the classification of o-1 arrives.
	code, out, errOut := cmd(tl, "", "--server", url, "--nkey", seed("operator"), "--since", "1h", "--count", "1", "failbus.classified.>")
	if code != 0 || !strings.Contains(out, `"outcome_id":"o-1"`) {
		t.Errorf("tail as operator: exit %d\n%s\n%s", code, out, errOut)
	}
	// ... and publishes nothing.
	code, out, errOut = cmd(pub, `{"id":"o-2","agent":"bot","provider":"openai","status":429}`+"\n", "--server", url, "--nkey", seed("operator"))
	if code != 1 || !strings.Contains(out, "permission denied publishing failbus.outcome.openai.bot as user operator") {
		t.Errorf("publish as operator: exit %d\n%s\n%s", code, out, errOut)
	}
	code, _, errOut = cmd(ap, "", "--server", url, "--nkey", seed("operator"))
	if code != 1 || !strings.Contains(errOut, "as user operator") || !strings.Contains(errOut, "connect with the admin user") {
		t.Errorf("apply as operator: exit %d\n%s", code, errOut)
	}
	code, out, errOut = cmd(ap, "", "--server", url, "--nkey", seed("admin"))
	if code != 0 || !strings.Contains(out, "at 1 replica(s)") {
		t.Errorf("apply as admin: exit %d\n%s\n%s", code, out, errOut)
	}
	code, _, errOut = cmd(ap, "", "--server", url, "--nkey", seed("admin"), "--replicas", "3")
	if code != 1 || !strings.Contains(errOut, "is a single server") {
		t.Errorf("apply R3 on dev: exit %d\n%s", code, errOut)
	}
	stopped = true
	if code := stop(); code != 0 {
		t.Errorf("dev exited %d", code)
	}

	// A restart keeps the users: the agent's seed still works.
	url, _, stop2 := startDevInProcess(t, "--port", "0", "--data", data, "--ops-addr", "127.0.0.1:0", "--auth")
	defer stop2()
	code, _, errOut = cmd(pub, `{"id":"o-3","agent":"bot","provider":"openai","status":429}`+"\n", "--server", url, "--nkey", seed("agent"))
	if code != 0 {
		t.Errorf("publish as agent after a restart: exit %d\n%s", code, errOut)
	}
}
