package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// classifyMaxLine bounds one input line; a longer line is an error record.
const classifyMaxLine = 16 << 20

// runClassify is `failbus classify [--policy FILE]` (CONTRACT.md "Offline
// commands"): each stdin line is an Outcome, each stdout line its
// Classification, `{"type":"classification", …}`, flushed before the next
// line is read so a program can drive it line by line. A line that is not a
// usable Outcome gives `{"type":"error","line":N,"error":"…"}` and
// processing goes on. Exit codes: 2 for unusable arguments or policy, 1 when
// stdin or stdout fails, 0 otherwise.
func runClassify(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("classify", "[--policy FILE] < outcomes.jsonl > classifications.jsonl", stderr)
	policyPath := fs.String("policy", "", "policy YAML file; its classify section is used (default: the built-in rules)")
	pos, code, done := parseArgs(fs, args)
	if done {
		return code
	}
	if len(pos) > 0 {
		return usageError(fs, stderr, "unexpected argument %q", pos[0])
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

	r := bufio.NewReaderSize(stdin, 64<<10)
	w := bufio.NewWriterSize(stdout, 64<<10)
	for lineNo := 1; ; lineNo++ {
		line, tooLong, readErr := classifyReadLine(r)
		if readErr != nil && readErr != io.EOF {
			fmt.Fprintf(stderr, "failbus classify: read stdin: %v\n", readErr)
			return 1
		}
		if readErr == io.EOF && len(line) == 0 && !tooLong {
			break
		}
		var rec []byte
		switch {
		case tooLong:
			rec = classifyError(lineNo, fmt.Errorf("line longer than %d bytes", classifyMaxLine))
		case len(bytes.TrimSpace(line)) > 0:
			rec = classifyLine(classify, line, lineNo)
		}
		if rec != nil {
			if _, err := w.Write(append(rec, '\n')); err != nil {
				fmt.Fprintf(stderr, "failbus classify: write stdout: %v\n", err)
				return 1
			}
			if err := w.Flush(); err != nil {
				fmt.Fprintf(stderr, "failbus classify: write stdout: %v\n", err)
				return 1
			}
		}
		if readErr == io.EOF {
			break
		}
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

// classifyReadLine reads one line without its newline. A line over
// classifyMaxLine is consumed and reported as tooLong. err is io.EOF with
// the last line when the input does not end in a newline.
func classifyReadLine(r *bufio.Reader) (line []byte, tooLong bool, err error) {
	for {
		chunk, isPrefix, e := r.ReadLine()
		if !tooLong {
			if len(line)+len(chunk) > classifyMaxLine {
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if e != nil {
			return line, tooLong, e
		}
		if !isPrefix {
			return line, tooLong, nil
		}
	}
}
