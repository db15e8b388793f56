package classifycmd

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	pclassify "github.com/failbus/failbus/internal/policy/classify"
)

// runEval is `failbus classify --eval FILE [FILE...]`: the rules of the
// policy's classify section against labelled outcomes. It prints the share
// of rows in an accepted class overall, per expected class and per
// provider, the leave-one-provider-out figure (each provider's rows
// classified without that provider's own code tables: what a provider the
// rules were not tuned on sees), and the first misses. A file it cannot
// read, or a row it cannot use, is an error naming it (exit 2): a figure
// over part of the corpus would be a figure for another corpus. The
// evaluation itself never fails the command; the acceptance bars are the
// caller's.
func runEval(cfg pclassify.Config, files []string, stdout, stderr io.Writer, asJSON bool, misses int) int {
	var rows []pclassify.EvalRow
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			fmt.Fprintf(stderr, "failbus classify: %v\n", err)
			return 2
		}
		rs, err := pclassify.ReadEvalRows(fh, filepath.Base(f))
		fh.Close()
		if err != nil {
			fmt.Fprintf(stderr, "failbus classify: %v\n", err)
			return 2
		}
		rows = append(rows, rs...)
	}
	rep, err := pclassify.Evaluate(cfg, rows)
	if err != nil {
		fmt.Fprintf(stderr, "failbus classify: %v\n", err)
		return 2
	}
	if misses >= 0 && len(rep.Misses) > misses {
		rep.Misses = rep.Misses[:misses]
	}
	w := bufio.NewWriter(stdout)
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		err = enc.Encode(struct {
			Type  string   `json:"type"`
			Files []string `json:"files"`
			pclassify.EvalReport
		}{"eval", files, rep})
	} else {
		writeEvalTable(w, files, &rep)
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

func pctOf(t pclassify.Tally) string {
	return fmt.Sprintf("%6.2f%%  %d/%d", 100*t.Accuracy(), t.Correct, t.Rows)
}

func writeEvalTable(w io.Writer, files []string, rep *pclassify.EvalReport) {
	fmt.Fprintf(w, "%d rows from %s\n\n", rep.Overall.Rows, strings.Join(files, ", "))
	fmt.Fprintf(w, "overall                   %s\n", pctOf(rep.Overall))
	fmt.Fprintf(w, "leave-one-provider-out    %s\n", pctOf(rep.LOPO))
	fmt.Fprintln(w, "  (each provider's rows classified without its own code tables; other rows as above)")

	fmt.Fprintln(w, "\nper expected class")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range pclassify.SortedKeys(rep.ByClass) {
		fmt.Fprintf(tw, "  %s\t%s\n", c, pctOf(rep.ByClass[c]))
	}
	tw.Flush()

	fmt.Fprintln(w, "\nper provider")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, p := range pclassify.SortedKeys(rep.ByProvider) {
		fmt.Fprintf(tw, "  %s\t%s\n", p, pctOf(rep.ByProvider[p]))
	}
	tw.Flush()

	fmt.Fprintln(w, "\nleave-one-provider-out, providers with code tables")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, p := range pclassify.SortedKeys(rep.LOPOByProvider) {
		fmt.Fprintf(tw, "  %s\t%s\twithout %s\n", p, pctOf(rep.LOPOByProvider[p]), strings.Join(rep.Tables[p], ", "))
	}
	tw.Flush()

	if len(rep.Misses) == 0 {
		return
	}
	fmt.Fprintln(w, "\nmisses")
	for _, m := range rep.Misses {
		pass := ""
		if m.LOPO {
			pass = " (leave-one-provider-out)"
		}
		want := m.Expect
		if len(m.Accept) > 0 {
			want += " (or " + strings.Join(m.Accept, ", ") + ")"
		}
		fmt.Fprintf(w, "  %s:%d %s %s%s: %s by %s, want %s\n", m.File, m.Line, m.ID, m.Provider, pass, m.Class, m.Rule, want)
	}
}
