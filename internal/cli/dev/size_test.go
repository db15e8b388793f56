package dev

import "testing"

func TestSizeFlag(t *testing.T) {
	for in, want := range map[string]int64{"16GiB": 16 << 30, "8 MiB": 8 << 20, "512": 512, "3KiB": 3 << 10, "1TiB": 1 << 40} {
		var f sizeFlag
		if err := f.Set(in); err != nil || f.n != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, f.n, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1GiB", "1.5GiB", "16GB", "lots", "9999999TiB"} {
		var f sizeFlag
		if err := f.Set(in); err == nil {
			t.Errorf("Set(%q) accepted %d", in, f.n)
		}
	}
	if got := (sizeFlag{n: 16 << 30}).String(); got != "16GiB" {
		t.Errorf("String = %q", got)
	}
}
