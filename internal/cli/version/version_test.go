package version

import (
	"bytes"
	"encoding/json"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionFromBuildInfo(t *testing.T) {
	t.Parallel()
	bi := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/failbus/failbus", Version: "v1.2.3"},
		Deps: []*debug.Module{{Path: "github.com/nats-io/nats.go", Version: "v1.55.0"}},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-12-01T13:58:05Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	var out bytes.Buffer
	fromBuildInfo(bi).write(&out)
	for _, want := range []string{
		"failbus v1.2.3\n",
		"commit:      0123456789abcdef0123456789abcdef01234567 with uncommitted changes, 2026-12-01T13:58:05Z\n",
		"go:          " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n",
		"nats-server: v2.",
		"nats.go:     v1.55.0\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if in := fromBuildInfo(nil); in.Version != "(unknown)" || in.Commit != "" || !strings.HasPrefix(in.NATSServer, "v2.") {
		t.Errorf("without build info: %+v", in)
	}
}

func TestVersionCommand(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if code := run([]string{"--json"}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var in Info
	if err := json.Unmarshal(out.Bytes(), &in); err != nil || in.Go != runtime.Version() || in.NATSServer == "" || in.Version == "" {
		t.Errorf("--json printed %s (%v)", out.String(), err)
	}
	out.Reset()
	if code := run(nil, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "commit:") {
		t.Errorf("exit %d, output %q", code, out.String())
	}
	if code := run([]string{"extra"}, nil, &out, &errb); code != 2 {
		t.Errorf("an argument: exit %d, want 2", code)
	}
}
