package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
)

// goDocFile finds docs/GO.md's `<!-- file: NAME -->` code blocks.
var goDocFile = regexp.MustCompile("(?s)<!-- file: (\\S+) -->\n```go\n(.*?)```")

// TestAGoModuleOutsideUsesFailbusAsDocumented: a module of its own, set up
// as docs/GO.md says (go mod edit -require … -replace … pointing at this
// checkout), builds docs/GO.md's first agent, which reports a 429 to a
// running bus and prints the decision. Offline: the module cache holds
// every dependency and there is no checksum database to ask, so it builds
// with -mod=mod instead of `go mod tidy` (which also wants the test
// dependencies of dependencies).
func TestAGoModuleOutsideUsesFailbusAsDocumented(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module of its own")
	}
	t.Parallel()
	doc, err := os.ReadFile("../docs/GO.md")
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	editLine := regexp.MustCompile(`(?m)^go mod edit (-require=\S+) -replace=(github.com/failbus/failbus)=\S+$`).FindStringSubmatch(string(doc))
	files := goDocFile.FindAllStringSubmatch(string(doc), -1)
	if editLine == nil || len(files) == 0 {
		t.Fatal("docs/GO.md has no `go mod edit -require … -replace …` line or no file block")
	}
	dir := t.TempDir()
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f[1]), []byte(f[2]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gocmd := func(env []string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOPROXY=off", "GOSUMDB=off", "GOFLAGS=-mod=mod")
		cmd.Env = append(cmd.Env, env...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
	gocmd(nil, "mod", "init", "example.com/mybot")
	gocmd(nil, "mod", "edit", editLine[1], "-replace="+editLine[2]+"="+root)
	gocmd(nil, "build", "-o", "mybot", ".")

	bus, err := devbus.Start(devbus.Options{Server: embedded.Options{Dir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	run := exec.CommandContext(ctx, filepath.Join(dir, "mybot"))
	run.Env = append(os.Environ(), "NATS_URL="+bus.Srv.ClientURL())
	out, err := run.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "retry: rate_limit: retry 1 of ") {
		t.Fatalf("the documented agent: %v\n%s", err, out)
	}
	t.Logf("the documented agent printed %q", strings.TrimSpace(string(out)))
}
