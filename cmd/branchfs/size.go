package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeValue is a flag of bytes, written as a number with an optional
// binary unit: 4096, 512K, 1.5G, 10GiB (K, M, G and T are powers of 1024;
// B and iB may follow). 0 means no limit.
type sizeValue int64

func (s *sizeValue) String() string { return strconv.FormatInt(int64(*s), 10) }
func (s *sizeValue) Type() string   { return "size" }

func (s *sizeValue) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s = sizeValue(n)
	return nil
}

// parseSize reads a size as sizeValue describes it.
func parseSize(v string) (int64, error) {
	t := strings.TrimSpace(v)
	t = strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(t), "B"), "I")
	shift := 0
	if t != "" {
		if i := strings.IndexByte("KMGT", t[len(t)-1]); i >= 0 {
			shift = 10 * (i + 1)
			t = t[:len(t)-1]
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is not a size (such as 4096, 512K, 1.5G or 10GiB)", v)
	}
	f = math.Ceil(f * float64(int64(1)<<shift))
	if f >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q is too large", v)
	}
	return int64(f), nil
}
