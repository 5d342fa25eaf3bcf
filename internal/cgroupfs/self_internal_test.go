package cgroupfs

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestLimitValue: limitValue reads what parseLimit reads, or declines
// (and the caller reads through parseLimit).
func TestLimitValue(t *testing.T) {
	for _, s := range []string{
		"0\n", "1\n", "4096", " 42 \n", "max\n", "max", "9223372036854771712\n", "4611686018427387904\n",
		"4611686018427387903\n", "18446744073709551615\n", "18446744073709551616\n", "-1\n", "+1\n",
		"1e9\n", "0x10\n", "\n", "", "max max\n", "1 2\n", "\u00a012\n", "１２\n",
	} {
		for _, allowMax := range []bool{false, true} {
			v, ok := limitValue([]byte(s), allowMax)
			want, err := parseLimit(s, allowMax)
			if ok {
				assert.NoError(t, err, "%q: limitValue read %d", s, v)
				assert.Equal(t, want, v, "%q", s)
			}
		}
	}
	v, ok := limitValue([]byte("123\n"), false)
	assert.True(t, ok)
	assert.Equal(t, int64(123), v)
}

// TestStatLine finds hierarchical_memory_limit as hierarchicalLimit does.
func TestStatLine(t *testing.T) {
	v, ok := statLine([]byte("cache 1\nhierarchical_memory_limit_x 5\nhierarchical_memory_limit 7\nhierarchical_memory_limit 8\n"), "hierarchical_memory_limit")
	assert.True(t, ok)
	assert.Equal(t, "7", string(v))
	_, ok = statLine([]byte("cache 1\n"), "hierarchical_memory_limit")
	assert.False(t, ok)
}
