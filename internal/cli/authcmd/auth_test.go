package authcmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAuthInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "auth")
	run1 := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := Command.Run(args, nil, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, out, errOut := run1("init", "--out", dir, "--agents", "bot-1, bot-2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, role := range []string{"classifier", "scheduler", "notifier", "recovery", "agent", "operator", "admin", "agent-bot-1", "agent-bot-2"} {
		info, err := os.Stat(filepath.Join(dir, role+".nk"))
		if err != nil || info.Mode().Perm() != 0o600 {
			t.Errorf("%s.nk: %v %v", role, err, info)
		}
		if !strings.Contains(out, "  "+role+" ") {
			t.Errorf("output does not list %s:\n%s", role, out)
		}
	}
	conf, err := os.ReadFile(filepath.Join(dir, "auth.conf"))
	if err != nil || !strings.Contains(string(conf), "authorization {") {
		t.Fatalf("auth.conf: %v\n%s", err, conf)
	}
	seed, _ := os.ReadFile(filepath.Join(dir, "agent.nk"))

	code, _, errOut = run1("init", "--out", dir)
	if code != 0 {
		t.Fatalf("second run: exit %d: %s", code, errOut)
	}
	again, _ := os.ReadFile(filepath.Join(dir, "agent.nk"))
	if !bytes.Equal(seed, again) {
		t.Errorf("a second run replaced the agent's seed")
	}
	conf2, _ := os.ReadFile(filepath.Join(dir, "auth.conf"))
	if !bytes.Equal(conf, conf2) {
		t.Errorf("a second run without --agents dropped users of the first:\n%s", conf2)
	}

	for _, args := range [][]string{{"init"}, {"--out", dir}, {"rotate", "--out", dir}} {
		if code, _, _ := run1(args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}
