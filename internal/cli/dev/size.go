package dev

import (
	"fmt"
	"strconv"
	"strings"
)

// sizeFlag is a byte count given as a number with an optional binary unit
// (B, KiB, MiB, GiB, TiB).
type sizeFlag struct{ n int64 }

var sizeUnits = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

func (f *sizeFlag) Set(s string) error {
	v := strings.TrimSpace(s)
	shift := uint(0)
	for _, u := range sizeUnits {
		if strings.HasSuffix(v, u.suffix) {
			v, shift = strings.TrimSpace(strings.TrimSuffix(v, u.suffix)), u.shift
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)>>shift {
		return fmt.Errorf("%q is not a size (a positive number of B, KiB, MiB, GiB or TiB)", s)
	}
	f.n = n << shift
	return nil
}

func (f sizeFlag) String() string {
	for _, u := range sizeUnits {
		if f.n > 0 && f.n%(1<<u.shift) == 0 {
			return strconv.FormatInt(f.n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(f.n, 10) + "B"
}
