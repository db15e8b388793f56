package refusal

import (
	"testing"
	"time"
)

func TestRefusalDur(t *testing.T) {
	for d, want := range map[time.Duration]string{
		15 * time.Minute: "15m", time.Hour: "1h", 6 * time.Hour: "6h", 90 * time.Minute: "1h30m",
		1500 * time.Millisecond: "1.5s", 250 * time.Millisecond: "250ms", 2*time.Hour + 5*time.Second: "2h0m5s",
		168 * time.Hour: "168h",
	} {
		if got := refusalDur(d); got != want {
			t.Errorf("refusalDur(%v) = %q, want %q", d, got, want)
		}
	}
}
