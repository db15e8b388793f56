package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/refusal"
)

// scanRefusals is memRefusals as it was before its indexes: every read
// scans every entry, RetireBefore drops every expired entry. The reference
// the indexed store is held to.
type scanRefusals struct {
	ttl time.Duration
	m   map[refusalKey]*refusalEntry
}

func (m *scanRefusals) expired(e *refusalEntry, now time.Time) bool {
	return m.ttl > 0 && !now.Before(e.written.Add(m.ttl))
}

func (m *scanRefusals) Update(segment, provider string, now time.Time, fn func(*refusal.Record, bool) (bool, error)) {
	k := refusalKey{segment, provider}
	e := m.m[k]
	found := e != nil && !m.expired(e, now)
	rec := refusal.Record{}
	if found {
		rec = e.rec
	}
	write, _ := fn(&rec, found)
	switch {
	case write:
		m.m[k] = &refusalEntry{rec: rec, written: now}
	case found && refusal.TouchDue(e.written, now, refusal.Config{StateTTL: m.ttl}):
		e.written = now
	}
}

func (m *scanRefusals) SegmentStates(segment string, now time.Time) []refusal.State {
	var out []refusal.State
	for k, e := range m.m {
		if k.segment == segment && !m.expired(e, now) {
			out = append(out, e.rec.State)
		}
	}
	slices.SortFunc(out, func(a, b refusal.State) int { return cmpString(a.Provider, b.Provider) })
	return out
}

func (m *scanRefusals) RetireBefore(session string, segment int, now time.Time) []string {
	var retired []string
	for k, e := range m.m {
		s, n, ok := splitSegment(k.segment)
		if ok && s == session && n < segment {
			retired = append(retired, k.segment+"/"+k.provider)
			delete(m.m, k)
			continue
		}
		if !now.IsZero() && m.expired(e, now) {
			delete(m.m, k)
		}
	}
	slices.Sort(retired)
	return retired
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// TestMemRefusalsIndexesChangeNothing: random updates, reads and
// retirements — times that mostly advance and sometimes go back, entries
// that expire, segment keys without a number — give the indexed store the
// same answers and the same entries as a scan of every entry.
func TestMemRefusalsIndexesChangeNothing(t *testing.T) {
	ctx := context.Background()
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 13))
		ttl := time.Duration(r.IntN(3)) * time.Hour // 0: no TTL
		got := &NewMemory(ttl).refusals
		want := &scanRefusals{ttl: ttl, m: map[refusalKey]*refusalEntry{}}
		now := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
		segment := func() string {
			if r.IntN(20) == 0 {
				return fmt.Sprintf("odd%d", r.IntN(3)) // no #<n>
			}
			return fmt.Sprintf("s%d#%d", r.IntN(6), r.IntN(5))
		}
		for step := range 3000 {
			now = now.Add(time.Duration(r.IntN(600)-60) * time.Second)
			at := now
			if r.IntN(50) == 0 {
				at = time.Time{}
			}
			switch r.IntN(4) {
			case 0, 1:
				seg, p := segment(), fmt.Sprintf("p%d", r.IntN(3))
				write, n := r.IntN(2) == 0, step
				fn := func(rec *refusal.Record, found bool) (bool, error) {
					rec.State.Segment, rec.State.Provider = seg, p
					if write {
						rec.State.Refusals = n
					}
					return write, nil
				}
				if err := got.Update(ctx, seg, p, now, fn); err != nil {
					t.Fatal(err)
				}
				want.Update(seg, p, now, fn)
			case 2:
				seg := segment()
				g, _ := got.SegmentStates(ctx, seg, now)
				if w := want.SegmentStates(seg, now); !reflect.DeepEqual(g, w) {
					t.Fatalf("seed %d step %d: SegmentStates(%s) = %+v, want %+v", seed, step, seg, g, w)
				}
			case 3:
				s, n := fmt.Sprintf("s%d", r.IntN(6)), r.IntN(6)
				g, _ := got.RetireBefore(ctx, s, n, at)
				if w := want.RetireBefore(s, n, at); !reflect.DeepEqual(g, w) {
					t.Fatalf("seed %d step %d: RetireBefore(%s, %d) = %v, want %v", seed, step, s, n, g, w)
				}
			}
			// The same entries, expired ones too (an expired entry is
			// dropped by the same RetireBefore).
			if len(got.m) != len(want.m) {
				t.Fatalf("seed %d step %d: %d entries, want %d", seed, step, len(got.m), len(want.m))
			}
			for k, w := range want.m {
				if g := got.m[k]; g == nil || !reflect.DeepEqual(*g, *w) {
					t.Fatalf("seed %d step %d: entry %v = %+v, want %+v", seed, step, k, g, w)
				}
			}
			for k := range got.m {
				if _, ok := got.bySegment[k.segment][k.provider]; !ok {
					t.Fatalf("seed %d step %d: entry %v not indexed", seed, step, k)
				}
			}
		}
	}
}
