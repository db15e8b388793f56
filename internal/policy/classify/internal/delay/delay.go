// Package delay reads the delays providers write into retry hints:
// Retry-After values, numbers of seconds or milliseconds, and prose such as
// "try again in 9m38.016s" or "retry after 6 seconds", all as milliseconds.
package delay

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// MaxMS caps a parsed delay (about 10 years) so absurd values cannot
// overflow the scheduler's arithmetic.
const MaxMS = int64(10 * 365 * 24 * time.Hour / time.Millisecond)

// RetryAfter reads a Retry-After value: delta-seconds (integer or
// decimal) or an HTTP-date, the latter relative to at (0 when at is absent
// or the date has passed).
func RetryAfter(s string, at events.Time) (int64, bool) {
	if s == "" {
		return 0, false
	}
	if ms, ok := Number(s, 1000); ok {
		return ms, true
	}
	t, err := http.ParseTime(s)
	if err != nil || at.IsZero() {
		return 0, false
	}
	d := t.Sub(at.Time)
	if d < 0 {
		return 0, true
	}
	return Clamp(d.Milliseconds()), true
}

// Number parses a non-negative decimal number and scales it to
// milliseconds (scale 1 for ms, 1000 for seconds).
func Number(s string, scale float64) (int64, bool) {
	if s == "" || s[0] == '-' || s[0] == '+' {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, false
	}
	f *= scale
	if f > float64(MaxMS) {
		return MaxMS, true
	}
	return int64(math.Ceil(f)), true
}

// Clamp bounds ms to [0, MaxMS].
func Clamp(ms int64) int64 {
	if ms < 0 {
		return 0
	}
	if ms > MaxMS {
		return MaxMS
	}
	return ms
}

// Text parses the delay at the start of b: a Go-style duration
// ("634ms", "4.2s", "9m38.016s", "8h44m7s"), or a number followed by a unit
// word ("6 seconds", "2 minutes", "500 milliseconds"). Trailing text is
// ignored. It does not allocate.
func Text[T ~string | ~[]byte](b T) (int64, bool) {
	var total float64
	n := 0
	i := 0
	for {
		// number
		j := i
		for j < len(b) && (b[j] >= '0' && b[j] <= '9' || b[j] == '.') {
			j++
		}
		if j == i {
			break
		}
		num, ok := parseDecimal(b[i:j])
		if !ok {
			break
		}
		k := j
		for k < len(b) && b[k] == ' ' {
			k++
		}
		unit, ul := durationUnit(b[k:])
		if ul == 0 {
			break
		}
		total += num * unit
		n++
		i = k + ul
		if k > j { // "6 seconds" style: no compound parts follow
			break
		}
	}
	if n == 0 {
		return 0, false
	}
	if total > float64(MaxMS) {
		return MaxMS, true
	}
	return int64(math.Ceil(total)), true
}

// parseDecimal parses digits with at most one dot, without allocating.
func parseDecimal[T ~string | ~[]byte](b T) (float64, bool) {
	var whole, frac float64
	scale := 1.0
	dot := false
	digits := 0
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case c == '.':
			if dot {
				return 0, false
			}
			dot = true
		case dot:
			scale /= 10
			frac += float64(c-'0') * scale
			digits++
		default:
			whole = whole*10 + float64(c-'0')
			digits++
		}
	}
	return whole + frac, digits > 0
}

// durationUnit reads a unit at the start of b and returns its length in
// milliseconds and the number of bytes it took; 0 bytes when none. Longer
// words come first so "ms" is not read as "m".
func durationUnit[T ~string | ~[]byte](b T) (float64, int) {
	for _, u := range durationUnits {
		if !hasPrefixT(b, u.word) {
			continue
		}
		// A unit word must end there: "m" in "minutes" is handled by the
		// longer entry, "s" in "some" is rejected.
		if len(b) > len(u.word) && isLetter(b[len(u.word)]) {
			continue
		}
		return u.ms, len(u.word)
	}
	return 0, 0
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

var durationUnits = []struct {
	word string
	ms   float64
}{
	{"milliseconds", 1}, {"millisecond", 1}, {"msec", 1}, {"ms", 1},
	{"microseconds", 0.001}, {"us", 0.001}, {"µs", 0.001},
	{"nanoseconds", 0.000001}, {"ns", 0.000001},
	{"seconds", 1000}, {"second", 1000}, {"secs", 1000}, {"sec", 1000}, {"s", 1000},
	{"minutes", 60000}, {"minute", 60000}, {"mins", 60000}, {"min", 60000}, {"m", 60000},
	{"hours", 3600000}, {"hour", 3600000}, {"hrs", 3600000}, {"h", 3600000},
	{"days", 86400000}, {"day", 86400000}, {"d", 86400000},
}

// hasPrefixT is strings.HasPrefix for string or []byte, without converting.
func hasPrefixT[T ~string | ~[]byte](b T, p string) bool {
	if len(b) < len(p) {
		return false
	}
	for i := 0; i < len(p); i++ {
		if b[i] != p[i] {
			return false
		}
	}
	return true
}
