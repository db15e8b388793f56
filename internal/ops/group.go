package ops

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Runnable is anything that runs until its context ends, then drains and
// returns nil: a *Runner, or a service made of several.
type Runnable interface {
	Run(ctx context.Context) error
}

// RunAll runs parts together until ctx ends. A service is usually several
// consumers (the scheduler's classifications and control records, the
// refusal tiers' refusals and boundaries); if one of them stops on its own
// — with an error, or with nil while ctx is still live — the others are
// stopped too, so a half-running service never looks healthy. It returns
// when every part has returned, with their errors joined.
func RunAll(ctx context.Context, parts ...Runnable) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(parts))
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Go(func() {
			err := p.Run(rctx)
			if err == nil && rctx.Err() == nil {
				err = fmt.Errorf("%s stopped", partName(p))
			}
			if err != nil {
				errs <- err
			}
			cancel() // one part down: stop the rest
		})
	}
	wg.Wait()
	close(errs)
	var all []error
	for e := range errs {
		all = append(all, e)
	}
	return errors.Join(all...)
}

func partName(p Runnable) string {
	if s, ok := p.(interface{ Service() string }); ok {
		return s.Service()
	}
	return fmt.Sprintf("%T", p)
}
