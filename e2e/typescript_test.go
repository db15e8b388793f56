package e2e

// The TypeScript client (clients/typescript) runs its own tests, with
// node's built-in runner, against a real `failbus dev` built from this
// repository: `npm ci && npm test` there. Then it is installed into new
// projects as its README says — the tarball of `npm pack`, and a fresh
// checkout's folder — offline, and an agent runs with each. Without node or npm the test is
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

	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
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
	installed(t, ctx, tools[1], env, dir)
}

// tsAgent is an agent a new project writes with the installed client:
// it reports a 429 and prints the decision.
const tsAgent = `import { Agent, connect } from "@failbus/client";
const nc = await connect({ servers: process.env.NATS_URL });
const agent = new Agent(nc, "ts-newcomer-" + process.argv[2]);
const decisions = await agent.decisions();
await agent.report({ id: "call-1-" + process.argv[2], provider: "openai", model: "gpt-4o", status: 429, headers: { "retry-after": "2" } });
for await (const d of decisions) { console.log(d.action + ": " + d.reason); break; }
await nc.close();
`

// installed installs the client into new projects the two ways its
// README gives, offline, and runs an agent with each against a bus:
//
//   - the tarball of `npm pack` (dist/ built, its dependencies bundled:
//     no registry needed) into an empty project;
//   - `npm install <checkout>/clients/typescript` from a fresh checkout
//     (no node_modules, no dist/): its prepare script installs its own
//     build tools from the lock (npm's cache) and compiles dist/src, where
//     a bare `tsc` failed with "tsc: not found".
func installed(t *testing.T, ctx context.Context, npm string, env []string, dir string) {
	t.Helper()
	npmIn := func(in string, args ...string) {
		t.Helper()
		start := time.Now()
		cmd := exec.CommandContext(ctx, npm, args...)
		cmd.Dir, cmd.Env = in, env
		out, err := cmd.CombinedOutput()
		t.Logf("npm %s: %v", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
		if err != nil {
			t.Fatalf("npm %s in %s: %v\n%s", strings.Join(args, " "), in, err, out)
		}
	}
	bus, err := devbus.Start(devbus.Options{Server: embedded.Options{Dir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	runAgent := func(project, id string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(project, "agent.mjs"), []byte(tsAgent), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, "node", "agent.mjs", id)
		cmd.Dir, cmd.Env = project, append(env, "NATS_URL="+bus.Srv.ClientURL())
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "retry: rate_limit: retry 1 of ") {
			t.Fatalf("the agent of %s: %v\n%s", project, err, out)
		}
		t.Logf("%s: %s", filepath.Base(project), strings.TrimSpace(string(out)))
	}
	newProject := func(name string) string {
		t.Helper()
		p := filepath.Join(t.TempDir(), name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "package.json"), []byte(`{"name":"`+name+`","private":true,"type":"module"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// The tarball: dist/ is the one npm test just built.
	packs := t.TempDir()
	npmIn(dir, "pack", "--ignore-scripts", "--pack-destination", packs)
	tarballs, _ := filepath.Glob(filepath.Join(packs, "failbus-client-*.tgz"))
	if len(tarballs) != 1 {
		t.Fatalf("npm pack wrote %v", tarballs)
	}
	fromTarball := newProject("from-tarball")
	npmIn(fromTarball, "install", "--offline", tarballs[0])
	runAgent(fromTarball, "tarball")

	// A fresh checkout of the client: what git holds, nothing built.
	checkout := filepath.Join(t.TempDir(), "clients", "typescript")
	for _, f := range []string{"package.json", "package-lock.json", "tsconfig.json", "tsconfig.build.json", "README.md", "src", "scripts"} {
		if err := os.CopyFS(filepath.Join(checkout, f), os.DirFS(filepath.Join(dir, f))); err != nil {
			if err := copyFile(filepath.Join(dir, f), filepath.Join(checkout, f)); err != nil {
				t.Fatal(err)
			}
		}
	}
	fromCheckout := newProject("from-checkout")
	npmIn(fromCheckout, "install", "--offline", checkout)
	runAgent(fromCheckout, "checkout")
}

// copyFile copies one file, making its directory.
func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o644)
}
