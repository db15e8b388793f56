package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/failbus/failbus/pkg/policy"
)

// simulateMaxLine bounds one input line, so a runaway line cannot take all
// memory; longer lines are error records.
const simulateMaxLine = 16 << 20

// runSimulate is `failbus simulate [--policy FILE] [--seed N]`: the whole
// decision core (policy.Sim) over JSON Lines on stdin, on a virtual clock
// (CONTRACT.md "failbus simulate"). Output for each input line is flushed
// before the next line is read, so a program can drive it line by line. It
// exits 2 for unusable arguments or policy, 1 when stdin or stdout fails,
// and 0 otherwise: a bad input line is an error record, not an exit.
func runSimulate(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("simulate", "[--policy FILE] [--seed N] < input.jsonl > output.jsonl", stderr)
	policyPath := fs.String("policy", "", "policy YAML file (default: the built-in default policy)")
	seed := fs.Uint64("seed", 1, "seed of the backoff jitter's random numbers; the same seed and input give the same output")
	pos, code, done := parseArgs(fs, args)
	if done {
		return code
	}
	if len(pos) > 0 {
		return usageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	p := policy.Default()
	if *policyPath != "" {
		var err error
		if p, err = policy.Load(*policyPath); err != nil {
			fmt.Fprintf(stderr, "failbus simulate: %v\n", err)
			return 2
		}
	}
	sim, err := policy.NewSim(policy.SimConfig{Policy: p, Seed: *seed})
	if err != nil {
		fmt.Fprintf(stderr, "failbus simulate: %v\n", err)
		return 2
	}

	r := bufio.NewReaderSize(stdin, 64<<10)
	w := bufio.NewWriterSize(stdout, 64<<10)
	write := func(o policy.Output) error {
		b, err := json.Marshal(o)
		if err != nil {
			b, _ = json.Marshal(policy.ErrorOutput(0, fmt.Errorf("encode %s record: %w", o.Type, err)))
		}
		b = append(b, '\n')
		_, err = w.Write(b)
		return err
	}
	for lineNo := 1; ; lineNo++ {
		line, tooLong, readErr := simulateReadLine(r)
		if readErr != nil && readErr != io.EOF {
			fmt.Fprintf(stderr, "failbus simulate: read stdin: %v\n", readErr)
			return 1
		}
		if readErr == io.EOF && len(line) == 0 && !tooLong {
			break
		}
		var outs []policy.Output
		switch {
		case tooLong:
			outs = []policy.Output{policy.ErrorOutput(lineNo, fmt.Errorf("line longer than %d bytes", simulateMaxLine))}
		case len(bytes.TrimSpace(line)) > 0:
			outs = sim.StepLine(line, lineNo)
		}
		for _, o := range outs {
			if err := write(o); err != nil {
				fmt.Fprintf(stderr, "failbus simulate: write stdout: %v\n", err)
				return 1
			}
		}
		if err := w.Flush(); err != nil {
			fmt.Fprintf(stderr, "failbus simulate: write stdout: %v\n", err)
			return 1
		}
		if readErr == io.EOF {
			break
		}
	}
	return 0
}

// simulateReadLine reads one line without its newline. A line over
// simulateMaxLine is consumed and reported as tooLong. err is io.EOF with the
// last line when the input does not end in a newline.
func simulateReadLine(r *bufio.Reader) (line []byte, tooLong bool, err error) {
	for {
		chunk, isPrefix, e := r.ReadLine()
		if !tooLong {
			if len(line)+len(chunk) > simulateMaxLine {
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
