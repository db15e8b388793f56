package report

import (
	"math"
	"strconv"
	"testing"

	"github.com/failbus/failbus/pkg/events"
)

// lab is a colour "#rrggbb" in CIE L*a*b* (D65), where distances are
// roughly what the eye sees.
func lab(t *testing.T, hex string) [3]float64 {
	t.Helper()
	if len(hex) != 7 || hex[0] != '#' {
		t.Fatalf("colour %q: want #rrggbb", hex)
	}
	var c [3]float64
	for i := range 3 {
		v, err := strconv.ParseUint(hex[1+2*i:3+2*i], 16, 8)
		if err != nil {
			t.Fatalf("colour %q: %v", hex, err)
		}
		x := float64(v) / 255
		if x <= 0.04045 {
			x /= 12.92
		} else {
			x = math.Pow((x+0.055)/1.055, 2.4)
		}
		c[i] = x
	}
	r, g, b := c[0], c[1], c[2]
	X := (0.4124*r + 0.3576*g + 0.1805*b) / 0.95047
	Y := 0.2126*r + 0.7152*g + 0.0722*b
	Z := (0.0193*r + 0.1192*g + 0.9505*b) / 1.08883
	f := func(t float64) float64 {
		if t > 0.008856 {
			return math.Cbrt(t)
		}
		return 7.787*t + 16.0/116
	}
	return [3]float64{116*f(Y) - 16, 500 * (f(X) - f(Y)), 200 * (f(Y) - f(Z))}
}

// deltaE is CIE76's colour difference.
func deltaE(a, b [3]float64) float64 {
	return math.Sqrt((a[0]-b[0])*(a[0]-b[0]) + (a[1]-b[1])*(a[1]-b[1]) + (a[2]-b[2])*(a[2]-b[2]))
}

// TestClassColoursSeparate: the stacked bars tell classes apart — every
// class (and "unclassified") has its own colour, any two at least a
// just-distinguishable-at-a-glance distance apart (ΔE*76 ≥ 15), and no
// failure class is drawn in ok's hue (a failure in green reads as a
// success: bad_request once was).
func TestClassColoursSeparate(t *testing.T) {
	classes := []string{unclassified}
	for _, c := range events.Classes {
		classes = append(classes, c.Name)
	}
	ok := lab(t, colorOf(events.ClassOK))
	okHue := math.Atan2(ok[2], ok[1])
	for i, a := range classes {
		if _, known := classColors[a]; !known {
			t.Errorf("class %s has no colour of its own", a)
			continue
		}
		la := lab(t, colorOf(a))
		for _, b := range classes[i+1:] {
			if d := deltaE(la, lab(t, colorOf(b))); d < 15 {
				t.Errorf("%s %s and %s %s: ΔE %.1f, too close to tell apart", a, colorOf(a), b, colorOf(b), d)
			}
		}
		chroma := math.Hypot(la[1], la[2])
		dh := math.Abs(math.Remainder(math.Atan2(la[2], la[1])-okHue, 2*math.Pi)) * 180 / math.Pi
		if a != events.ClassOK && chroma >= 10 && dh < 30 {
			t.Errorf("failure class %s %s has ok's hue (%.0f° from it)", a, colorOf(a), dh)
		}
	}
}
