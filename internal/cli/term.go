package cli

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// IsTerminal reports whether w is a terminal (a character device), so a
// command prints progress or redraws a screen only for a person watching,
// never into a file or a pipe.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressEvery is how often a Progress line is redrawn at most.
const progressEvery = 200 * time.Millisecond

// Progress reports how far a long read has come on one line of stderr,
// redrawn in place, and only when stderr is a terminal: a pipe or a log
// file gets nothing. A nil *Progress does nothing, so callers need not
// check. Safe for concurrent use.
type Progress struct {
	w     io.Writer
	label string
	total uint64

	mu    sync.Mutex
	done  uint64
	last  time.Time
	drawn bool
}

// NewProgress returns a Progress for label writing to w, or nil when w is
// not a terminal. total is the expected count (0: unknown).
func NewProgress(w io.Writer, label string, total uint64) *Progress {
	if !IsTerminal(w) {
		return nil
	}
	return &Progress{w: w, label: label, total: total}
}

// AddTotal raises the expected count (a read that learns its size as it
// opens streams).
func (p *Progress) AddTotal(n uint64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.total += n
	p.mu.Unlock()
}

// Add counts n more items done and redraws the line when it is due.
func (p *Progress) Add(n uint64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	if now := time.Now(); now.Sub(p.last) >= progressEvery {
		p.last = now
		p.draw()
	}
}

// Label changes what the line says is being done (the stream being read,
// say), so a slow part of a long read is named.
func (p *Progress) Label(label string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.label = label
	p.mu.Unlock()
}

// Done draws the final count and ends the line.
func (p *Progress) Done() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.draw()
	fmt.Fprintln(p.w)
}

func (p *Progress) draw() {
	p.drawn = true
	if p.total > 0 {
		fmt.Fprintf(p.w, "\r%s: %d / %d (%d%%)\x1b[K", p.label, p.done, p.total, min(100, p.done*100/p.total))
		return
	}
	fmt.Fprintf(p.w, "\r%s: %d\x1b[K", p.label, p.done)
}

// WriteTable writes rows (the first is the header) as aligned columns two
// spaces apart, for people: text left-aligned, the columns named in right
// (numbers) right-aligned. Widths count runes.
func WriteTable(w io.Writer, rows [][]string, right ...int) error {
	if len(rows) == 0 {
		return nil
	}
	widths := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		for i, c := range r {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			last := i == len(r)-1
			switch {
			case slices.Contains(right, i):
				b.WriteString(pad + c)
			case last:
				b.WriteString(c)
			default:
				b.WriteString(c + pad)
			}
			if !last {
				b.WriteString("  ")
			}
		}
		b.WriteByte('\n')
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}
