package classifycmd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/engine"
	pclassify "github.com/failbus/failbus/internal/policy/classify"
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
//
// With --eval FILE... it reads labelled outcomes instead (testdata's corpus
// format: an Outcome plus expect_class, and optionally accept) and prints
// how many land in an accepted class: overall, per class, per provider, and
// leave-one-provider-out (each provider's rows classified without its own
// code tables). See runEval.
//
// With --explain it prints, instead, a table of the outcomes
// the rules explain only weakly — unknown, or decided by the status code, an
// upstream_code hint or an unrecognised transport error alone — grouped by
// what the provider said (classify.Signature), largest group first: the
// next rule worth adding is at the top.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("classify", "[--policy FILE] [--explain [--json]] < outcomes.jsonl > classifications.jsonl\n"+
		"       failbus classify [--policy FILE] --eval FILE [FILE...] [--json] [--misses N]", stderr)
	policyPath := fs.String("policy", "", "policy YAML file; its classify section is used (default: the built-in rules)")
	explain := fs.Bool("explain", false, "print the weakly explained outcomes grouped by body signature instead of one classification per line")
	evalPath := fs.String("eval", "", "evaluate against a labelled corpus (JSON Lines with expect_class); further files may follow")
	misses := fs.Int("misses", 20, "with --eval: how many misclassified rows to list (-1: all)")
	asJSON := fs.Bool("json", false, "with --explain or --eval: one JSON object instead of the table")
	pos, code, done := cli.Parse(fs, args)
	if done {
		return code
	}
	if *evalPath == "" && len(pos) > 0 {
		return cli.UsageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	if *asJSON && !*explain && *evalPath == "" {
		return cli.UsageError(fs, stderr, "--json goes with --explain or --eval")
	}
	if *explain && *evalPath != "" {
		return cli.UsageError(fs, stderr, "--explain and --eval are two reports: choose one")
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
	eng, err := engine.New(engine.Config{Policy: pol})
	if err != nil {
		fmt.Fprintf(stderr, "failbus classify: %s: %v\n", *policyPath, err)
		return 2
	}

	if *explain {
		return runExplain(eng.Classify, stdin, stdout, stderr, *asJSON)
	}
	if *evalPath != "" {
		return runEval(pol.Classify, append([]string{*evalPath}, pos...), stdout, stderr, *asJSON, *misses)
	}

	w := bufio.NewWriterSize(stdout, 64<<10)
	err = cli.EachLine(stdin, func(lineNo int, line []byte, tooLong bool) error {
		rec := classifyError(lineNo, fmt.Errorf("line longer than %d bytes", cli.MaxLine))
		if !tooLong {
			rec = classifyLine(eng.Classify, line, lineNo)
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

// runExplain reads every outcome, then writes the explain table (or JSON).
func runExplain(classify func(*events.Outcome) events.Classification, stdin io.Reader, stdout, stderr io.Writer, asJSON bool) int {
	var (
		e       pclassify.Explainer
		skipped int
	)
	err := cli.EachLine(stdin, func(_ int, line []byte, tooLong bool) error {
		var o events.Outcome
		if tooLong || events.UnmarshalJSON(line, &o) != nil || o.Validate() != nil {
			skipped++
			return nil
		}
		e.Add(&o, classify(&o))
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "failbus classify: %v\n", err)
		return 1
	}
	groups := e.Groups()
	w := bufio.NewWriter(stdout)
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		err = enc.Encode(struct {
			Type    string            `json:"type"`
			Total   int               `json:"total"`
			Weak    int               `json:"weak"`
			Skipped int               `json:"skipped"`
			Groups  []pclassify.Group `json:"groups"`
		}{"explain", e.Total, e.Weak, skipped, groups})
	} else {
		writeExplainTable(w, &e, groups, skipped)
	}
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		fmt.Fprintf(stderr, "failbus classify: write stdout: %v\n", err)
		return 1
	}
	return 0
}

func writeExplainTable(w io.Writer, e *pclassify.Explainer, groups []pclassify.Group, skipped int) {
	fmt.Fprintf(w, "%d outcomes: %d decided by a specific rule, %d weakly explained (unknown, or by the status, an upstream_code hint or an unrecognised transport error alone) in %s",
		e.Total, e.Total-e.Weak, e.Weak, plural(len(groups), "signature"))
	if skipped > 0 {
		fmt.Fprintf(w, "; %s skipped (not a valid Outcome)", plural(skipped, "line"))
	}
	fmt.Fprintln(w, ".")
	if len(groups) == 0 {
		return
	}
	fmt.Fprintln(w, "A rule in the policy's classify.rules for the top group moves the most outcomes to what their provider said.")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "COUNT\tCLASS\tRULE\tPROVIDERS\tEXAMPLE\tSIGNATURE")
	for _, g := range groups {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", g.Count, topKeys(g.Classes), topKeys(g.Rules),
			strings.Join(g.Providers, ","), g.Example, g.Signature)
	}
	tw.Flush()
}

// topKeys names the most frequent key of m, with "+N" for the others.
func topKeys(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	if len(keys) == 0 {
		return "-"
	}
	if len(keys) == 1 {
		return keys[0]
	}
	return keys[0] + " +" + strconv.Itoa(len(keys)-1)
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}
