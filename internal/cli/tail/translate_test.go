package tail

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/cli/decode"
	"github.com/failbus/failbus/internal/delivery"
	"github.com/failbus/failbus/pkg/events"
)

// TestMain lets the test binary stand in for the failbus binary in
// --translate commands: FAILBUS_TEST_MAIN=1 runs its arguments as failbus
// does.
func TestMain(m *testing.M) {
	if os.Getenv("FAILBUS_TEST_MAIN") == "1" {
		os.Exit(cli.Main([]cli.Command{decode.Command}, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestSplitWords(t *testing.T) {
	for in, want := range map[string][]string{
		`failbus decode --subject {{Subject}}`: {"failbus", "decode", "--subject", "{{Subject}}"},
		`jq -c '.a | .b' "x \"y\"" a\ b ''`:    {"jq", "-c", ".a | .b", `x "y"`, "a b", ""},
		"  sp\t x  ":                           {"sp", "x"},
	} {
		got, err := splitWords(in)
		if err != nil || strings.Join(got, "|") != strings.Join(want, "|") || len(got) != len(want) {
			t.Errorf("splitWords(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{`'open`, `"open`, `trailing\`} {
		if _, err := splitWords(bad); err == nil {
			t.Errorf("splitWords(%q): no error", bad)
		}
	}
}

// TestCLITailTranslate: --translate runs a command per message with the
// payload on stdin and prints its output as data; `failbus decode` as that
// command decodes what a raw reader sees; an audit record of the notifier
// is typed without it.
func TestCLITailTranslate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fill(t, "openai", 2)
	b.pub(t, events.AuditSubject("notifier", delivery.AuditSent),
		&delivery.Audit{Kind: delivery.AuditSent, DedupeKey: "k", Request: "req-1", Sink: "ops", Attempt: 1})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name      string
		translate string
		subject   string
		check     func(t *testing.T, l tailLine)
	}{
		{"a command that prints JSON", "wc -c", "failbus.outcome.openai.>", func(t *testing.T, l tailLine) {
			var n int
			if err := json.Unmarshal(l.Data, &n); err != nil || n < 20 {
				t.Errorf("data %s: want the byte count of the payload", l.Data)
			}
		}},
		{"the subject and stream filled in", "echo {{Stream}} {{Subject}}", "failbus.outcome.openai.>", func(t *testing.T, l tailLine) {
			if want, _ := json.Marshal("FAILBUS_OUTCOMES " + l.Subject); !bytes.Equal(l.Data, want) {
				t.Errorf("data %s, want %s", l.Data, want)
			}
		}},
		{"failbus decode as the translator", "env FAILBUS_TEST_MAIN=1 " + self + " decode --subject {{Subject}}", "failbus.outcome.openai.>", func(t *testing.T, l tailLine) {
			var o events.Outcome
			if err := json.Unmarshal(l.Data, &o); err != nil || o.Provider != "openai" || o.Status != 500 {
				t.Errorf("data %s: want the outcome decoded (%v)", l.Data, err)
			}
		}},
		{"a command that fails", "sh -c 'echo broken >&2; exit 3'", "failbus.outcome.openai.>", func(t *testing.T, l tailLine) {
			if l.Data != nil || !strings.Contains(l.Error, "broken") || len(l.Raw) == 0 {
				t.Errorf("line %+v: want the command's error and the raw payload", l)
			}
		}},
		{"no translator: the audit record typed", "", "failbus.audit.>", func(t *testing.T, l tailLine) {
			if l.Error != "" || l.Schema != delivery.SchemaAudit+"/1" || !strings.Contains(string(l.Data), `"sink":"ops"`) {
				t.Errorf("audit line %+v", l)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := []string{"--server", b.Srv.ClientURL(), "--no-follow", tc.subject}
			if tc.translate != "" {
				args = append(args, "--translate", tc.translate)
			}
			if code := run(args, nil, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			lines, _ := parseTail(t, stdout.String())
			if len(lines) == 0 {
				t.Fatal("no lines")
			}
			for _, l := range lines {
				tc.check(t, l)
			}
		})
	}
	var stderr bytes.Buffer
	if code := run([]string{"--translate", "'open"}, nil, &bytes.Buffer{}, &stderr); code != 2 || !strings.Contains(stderr.String(), "unterminated") {
		t.Errorf("a translate command that does not parse: exit %d, %s", code, stderr.String())
	}
}
