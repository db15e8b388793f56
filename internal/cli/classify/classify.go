package classify

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// Command is `failbus classify`.
var Command = cli.Command{Name: "classify", Summary: "classify Outcome JSON Lines from stdin offline (no bus)", Run: run}

// run is `failbus classify [--policy FILE]` (CONTRACT.md "Offline
// commands"): each stdin line is an Outcome, each stdout line its
// Classification, `{"type":"classification", …}`, flushed before the next
// line is read so a program can drive it line by line. A line that is not a
// usable Outcome gives `{"type":"error","line":N,"error":"…"}` and
// processing goes on. Exit codes: 2 for unusable arguments or policy, 1 when
// stdin or stdout fails, 0 otherwise.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("classify", "[--policy FILE] < outcomes.jsonl > classifications.jsonl", stderr)
	policyPath := fs.String("policy", "", "policy YAML file; its classify section is used (default: the built-in rules)")
	pos, code, done := cli.Parse(fs, args)
	if done {
		return code
	}
	if len(pos) > 0 {
		return cli.UsageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	pol := policy.Default()
	if *policyPath != "" {
		p, err := policy.Load(*policyPath)
		if err != nil {
			fmt.Fprintf(stderr, "failbus classify: %v\n", err)
			return 2
		}
		pol = p
	}
	classify, err := pol.ClassifyFunc()
	if err != nil {
		fmt.Fprintf(stderr, "failbus classify: %s: %v\n", *policyPath, err)
		return 2
	}

	w := bufio.NewWriterSize(stdout, 64<<10)
	err = cli.EachLine(stdin, func(lineNo int, line []byte, tooLong bool) error {
		rec := classifyError(lineNo, fmt.Errorf("line longer than %d bytes", cli.MaxLine))
		if !tooLong {
			rec = classifyLine(classify, line, lineNo)
		}
		if _, err := w.Write(append(rec, '\n')); err != nil {
			return fmt.Errorf("write stdout: %w", err)
		}
		if err := w.Flush(); err != nil {
			return fmt.Errorf("write stdout: %w", err)
		}
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "failbus classify: %v\n", err)
		return 1
	}
	return 0
}

// classifyLine decodes one Outcome and renders its classification record,
// or the error record that says why the line is unusable.
func classifyLine(classify func(*events.Outcome) events.Classification, line []byte, lineNo int) []byte {
	var o events.Outcome
	if err := events.UnmarshalJSON(line, &o); err != nil {
		return classifyError(lineNo, err)
	}
	if err := o.Validate(); err != nil {
		return classifyError(lineNo, fmt.Errorf("outcome: %w", err))
	}
	c := classify(&o)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // evidence quotes provider text: keep "<" and ">" readable
	if err := enc.Encode(&c); err != nil {
		return classifyError(lineNo, fmt.Errorf("encode classification: %w", err))
	}
	body := bytes.TrimRight(buf.Bytes(), "\n")
	out := make([]byte, 0, len(body)+32)
	out = append(out, `{"type":"classification"`...)
	if len(body) > 2 {
		out = append(out, ',')
	}
	return append(out, body[1:]...)
}

func classifyError(lineNo int, err error) []byte {
	b, _ := json.Marshal(struct {
		Type  string `json:"type"`
		Line  int    `json:"line"`
		Error string `json:"error"`
	}{"error", lineNo, err.Error()})
	return b
}
