package simulatecmd

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/engine/sim"
	"github.com/failbus/failbus/pkg/policy"
)

// Command is `failbus simulate`.
var Command = cli.Command{Name: "simulate", Summary: "run the whole decision core over JSON Lines from stdin on a virtual clock (no bus)", Run: run}

// run is `failbus simulate [--policy FILE] [--seed N]`: the whole
// decision core (sim.Sim) over JSON Lines on stdin, on a virtual clock
// (CONTRACT.md "failbus simulate"). Output for each input line is flushed
// before the next line is read, so a program can drive it line by line. It
// exits 2 for unusable arguments or policy, 1 when stdin or stdout fails,
// and 0 otherwise: a bad input line is an error record, not an exit.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("simulate", "[--policy FILE] [--seed N] < input.jsonl > output.jsonl", stderr)
	policyPath := fs.String("policy", "", "policy YAML file (default: the built-in default policy)")
	seed := fs.Uint64("seed", 0, "vary the backoff jitter's draw: 0 draws it as the bus does, from each outcome's id; the same seed and input give the same output")
	pos, code, done := cli.Parse(fs, args)
	if done {
		return code
	}
	if len(pos) > 0 {
		return cli.UsageError(fs, stderr, "unexpected argument %q", pos[0])
	}
	p := policy.Default()
	if *policyPath != "" {
		var err error
		if p, err = policy.Load(*policyPath); err != nil {
			fmt.Fprintf(stderr, "failbus simulate: %v\n", err)
			return 2
		}
	}
	engine, err := sim.New(sim.Config{Policy: p, Seed: *seed})
	if err != nil {
		fmt.Fprintf(stderr, "failbus simulate: %v\n", err)
		return 2
	}

	w := bufio.NewWriterSize(stdout, 64<<10)
	write := func(o sim.Output) error {
		b, err := json.Marshal(o)
		if err != nil {
			b, _ = json.Marshal(sim.ErrorOutput(0, fmt.Errorf("encode %s record: %w", o.Type, err)))
		}
		b = append(b, '\n')
		_, err = w.Write(b)
		return err
	}
	err = cli.EachLine(stdin, func(lineNo int, line []byte, tooLong bool) error {
		outs := []sim.Output{sim.ErrorOutput(lineNo, fmt.Errorf("line longer than %d bytes", cli.MaxLine))}
		if !tooLong {
			outs = engine.StepLine(line, lineNo)
		}
		for _, o := range outs {
			if err := write(o); err != nil {
				return fmt.Errorf("write stdout: %w", err)
			}
		}
		if err := w.Flush(); err != nil {
			return fmt.Errorf("write stdout: %w", err)
		}
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "failbus simulate: %v\n", err)
		return 1
	}
	return 0
}
