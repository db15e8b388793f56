package servicespec

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// The scheduler's flags refuse what would break it: a linger the
// consumer runner does not wait out hands back every classification.
func TestSchedulerRefusesALingerTheRunnerWouldNotWaitFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		linger string
		want   string // "" for accepted
	}{
		{linger: "20ms"},
		{linger: "0s"},
		{linger: "4s"},
		{linger: "-1ms", want: "must not be negative"},
		{linger: "5s", want: "must be under 5s"},
		{linger: "1h", want: "must be under 5s"},
	} {
		t.Run(tc.linger, func(t *testing.T) {
			t.Parallel()
			spec := Scheduler()
			fs := flag.NewFlagSet("scheduler", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			spec.Flags(fs)
			if err := fs.Parse([]string{"--scope-linger", tc.linger}); err != nil {
				t.Fatal(err)
			}
			err := spec.Check()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
