package retry

import (
	"strconv"
	"testing"
)

// TestJitterUIsADrawOfTheOutcome: the same outcome id and seed give the
// same number; ids and seeds spread their numbers evenly over [0, 1).
func TestJitterUIsADrawOfTheOutcome(t *testing.T) {
	t.Parallel()
	if JitterU("c1", 0) != JitterU("c1", 0) {
		t.Fatal("the same outcome drew two numbers")
	}
	if JitterU("c1", 0) == JitterU("c1", 1) {
		t.Error("seed 1 draws seed 0's number")
	}
	const n, bins = 100_000, 10
	var count [bins]int
	var sum float64
	for i := range n {
		u := JitterU("call-"+strconv.Itoa(i), 0)
		if u < 0 || u >= 1 {
			t.Fatalf("JitterU = %v, outside [0, 1)", u)
		}
		count[int(u*bins)]++
		sum += u
	}
	if mean := sum / n; mean < 0.49 || mean > 0.51 {
		t.Errorf("mean %.4f, want about 0.5 (the jitter's mean must stay 1)", mean)
	}
	for i, c := range count {
		if c < n/bins*95/100 || c > n/bins*105/100 {
			t.Errorf("bin %d holds %d of %d draws, want %d ± 5%%", i, c, n, n/bins)
		}
	}
}
