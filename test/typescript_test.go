package test

// The TypeScript client (clients/typescript) runs its own tests, with
// node's built-in runner, against a real `failbus dev` built from this
// repository: `npm ci && npm test` there. Without node or npm the test is
// skipped locally and fails in CI (CI set), so a CI image that lost node
// cannot pass by skipping.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestTypeScriptClient(t *testing.T) {
	t.Parallel()
	var tools []string
	for _, tool := range []string{"node", "npm"} {
		if p, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not found on PATH, and CI is set: the TypeScript client's tests must run in CI", tool)
			}
			t.Skipf("%s not found on PATH: skipping the TypeScript client's tests (they fail instead when CI is set)", tool)
		} else {
			tools = append(tools, p)
		}
	}
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "clients", "typescript")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	env := append(os.Environ(), "FAILBUS_BIN="+failbusBinary(t), "NO_COLOR=1", "npm_config_fund=false", "npm_config_audit=false", "npm_config_update_notifier=false")
	run := func(args ...string) string {
		t.Helper()
		start := time.Now()
		cmd := exec.CommandContext(ctx, tools[1], args...)
		cmd.Dir = dir
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		t.Logf("npm %s: %v", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
		if err != nil {
			t.Fatalf("npm %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
		}
		return string(out)
	}
	run("ci", "--no-progress", "--ignore-scripts")
	out := run("test")
	// The runner's summary, so the count shows in `go test -v`.
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "ℹ ") {
			t.Log(l)
		}
	}
	if !strings.Contains(out, "ℹ fail 0") || strings.Contains(out, "ℹ pass 0") {
		t.Fatalf("npm test reported failures or no passing test:\n%s", out)
	}
}
