package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// envStallMiB is the anonymous memory, in MiB, the stall child maps and
// touches.
const envStallMiB = "MEMCTL_TEST_STALL_MIB"

func TestSmapsRule(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		force bool
		rss   *int64
		read  bool
		why   string
	}{
		{false, n(0), true, "read: VmRSS 0.0 MiB is under 256.0 MiB"},
		{false, n(smapsMaxRSS - 1), true, "read: VmRSS 256.0 MiB is under 256.0 MiB"},
		{false, n(smapsMaxRSS), false, "not read: VmRSS 256.0 MiB is not under 256.0 MiB"},
		{false, n(16 << 30), false, "not read: VmRSS 16384.0 MiB is not under 256.0 MiB"},
		{true, n(16 << 30), true, "read: -smaps"},
		{false, nil, false, "not read: no VmRSS"},
	} {
		read, why := smapsRule(tc.force, tc.rss)
		assert.Equal(t, tc.read, read, tc.why)
		assert.Contains(t, why, tc.why)
		if !read && tc.rss != nil {
			assert.Contains(t, why, "-smaps reads it anyway", "the output says how to read it")
		}
	}
}
