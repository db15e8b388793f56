package cli

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
)

// MaxLine bounds one input line of the offline commands (classify,
// simulate), so a runaway line cannot take all memory; a longer line is an
// error record, not an exit.
const MaxLine = 16 << 20

// EachLine calls fn for every non-blank line of r, without its newline,
// numbered from 1 (blank lines keep their number). A line longer than
// MaxLine is consumed and passed as nil with tooLong set. It stops at the
// first error fn returns, or at a read error ("read stdin: …"); the end of
// input is not an error, and a last line without a newline still counts.
func EachLine(r io.Reader, fn func(lineNo int, line []byte, tooLong bool) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for lineNo := 1; ; lineNo++ {
		line, tooLong, err := readLine(br)
		if err != nil && err != io.EOF {
			return fmt.Errorf("read stdin: %w", err)
		}
		if tooLong || len(bytes.TrimSpace(line)) > 0 {
			if ferr := fn(lineNo, line, tooLong); ferr != nil {
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		}
	}
}

// readLine reads one line without its newline; a line over MaxLine is
// consumed and reported as tooLong. err is io.EOF with the last line when
// the input does not end in a newline.
func readLine(r *bufio.Reader) (line []byte, tooLong bool, err error) {
	for {
		chunk, isPrefix, e := r.ReadLine()
		if !tooLong {
			if len(line)+len(chunk) > MaxLine {
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

// Count is n and word, in the plural unless n is 1: "1 line", "2 lines",
// "0 duplicates". word must take a plain -s.
func Count(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}
