package main

import "testing"

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "4096": 4096, "512K": 512 << 10, "512k": 512 << 10, "1.5G": 3 << 29, "10GiB": 10 << 30,
		"2MB": 2 << 20, "1T": 1 << 40, " 7 ": 7, "0.5K": 512,
	} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "K", "lots", "-1", "1X", "NaN", "Inf", "1e30", "10KK"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d; want an error", in, got)
		}
	}
}
