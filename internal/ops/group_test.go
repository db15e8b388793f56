package ops_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/failbus/failbus/internal/ops"
)

// part runs until its context ends, or returns early with err when early
// is closed.
type part struct {
	name    string
	early   chan struct{}
	err     error
	stopped bool
}

func (p *part) Service() string { return p.name }

func (p *part) Run(ctx context.Context) error {
	select {
	case <-ctx.Done():
		p.stopped = true
		return nil
	case <-p.early:
		return p.err
	}
}

func TestRunAll(t *testing.T) {
	cases := []struct {
		name    string
		failErr error // the first part returns this early; nil = returns nil early
		cancel  bool  // instead, the caller's context ends
		want    string
	}{
		{name: "a part failing stops the others and its error is returned", failErr: errors.New("boom"), want: "boom"},
		{name: "a part stopping with nil while the context is live is an error", want: "a stopped"},
		{name: "the caller's context ending stops every part without error", cancel: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := &part{name: "a", early: make(chan struct{}), err: c.failErr}
			b := &part{name: "b", early: make(chan struct{})}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- ops.RunAll(ctx, a, b) }()
			if c.cancel {
				cancel()
			} else {
				close(a.early)
			}
			err := <-done
			if !b.stopped {
				t.Error("the other part was not stopped")
			}
			switch {
			case c.want == "" && err != nil:
				t.Errorf("err = %v, want nil", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("err = %v, want it to say %q", err, c.want)
			}
		})
	}
}
