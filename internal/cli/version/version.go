// Package version is `failbus version`: what was built, from which commit,
// with which Go and which nats-server, so a bug report names the exact
// build.
package version

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/failbus/failbus/internal/cli"
)

// Command is `failbus version`.
var Command = cli.Command{Name: "version", Summary: "print the failbus version, its commit, and the Go and nats-server versions", Run: run}

// Info is what `failbus version --json` prints.
type Info struct {
	// Version is the module version (a tag, a pseudo-version, or "(devel)"
	// for a build the Go tool could not stamp).
	Version string `json:"version"`
	// Commit is the VCS revision the binary was built from ("" when the
	// build was not stamped, e.g. go test or -buildvcs=false).
	Commit string `json:"commit,omitempty"`
	// CommitTime is that revision's time.
	CommitTime string `json:"commit_time,omitempty"`
	// Modified is true when the working tree had uncommitted changes.
	Modified bool `json:"modified,omitempty"`
	// Go is the Go toolchain and the target platform.
	Go       string `json:"go"`
	Platform string `json:"platform"`
	// NATSServer is the embedded nats-server (failbus dev, demo, bench).
	NATSServer string `json:"nats_server"`
	// NATSClient is the nats.go client library.
	NATSClient string `json:"nats_go,omitempty"`
}

// Read collects Info from the running binary.
func Read() Info {
	bi, _ := debug.ReadBuildInfo()
	return fromBuildInfo(bi)
}

// fromBuildInfo collects Info from build information (nil when the binary
// has none).
func fromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Version: "(unknown)", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH, NATSServer: "v" + server.VERSION}
	if bi == nil {
		return in
	}
	in.Version = bi.Main.Version
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Commit = s.Value
		case "vcs.time":
			in.CommitTime = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/nats-io/nats.go" {
			in.NATSClient = d.Version
		}
	}
	return in
}

func run(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("version", "[--json]", stderr)
	asJSON := fs.Bool("json", false, "print one JSON object")
	if rest, code, done := cli.Parse(fs, args); done {
		return code
	} else if len(rest) > 0 {
		return cli.UsageError(fs, stderr, "unexpected arguments %q", rest)
	}
	in := Read()
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(in); err != nil {
			fmt.Fprintf(stderr, "failbus version: %v\n", err)
			return 1
		}
		return 0
	}
	in.write(stdout)
	return 0
}

// write prints in for people.
func (in Info) write(w io.Writer) {
	commit := "unknown (built without a VCS stamp: go test, -buildvcs=false, or outside a git checkout)"
	if in.Commit != "" {
		commit = in.Commit
		if in.Modified {
			commit += " with uncommitted changes"
		}
		if in.CommitTime != "" {
			commit += ", " + in.CommitTime
		}
	}
	fmt.Fprintf(w, "failbus %s\ncommit:      %s\ngo:          %s %s\nnats-server: %s (embedded)\n", in.Version, commit, in.Go, in.Platform, in.NATSServer)
	if in.NATSClient != "" {
		fmt.Fprintf(w, "nats.go:     %s\n", in.NATSClient)
	}
}
