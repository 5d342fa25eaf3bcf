package bytesize

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "123": 123, "2147483648": 2 << 30, "64KiB": 64 << 10, "64MiB": 64 << 20, "1GiB": 1 << 30,
		"64 KiB": 64 << 10, " 1GiB ": 1 << 30, "8589934591GiB": math.MaxInt64 >> 30 << 30,
	} {
		got, err := Parse(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{
		"", "-1", "1GB", "2GB", "1.5GiB", "x", "GiB", "1KiBMiB", "9999999999GiB",
		"9223372036854775807GiB", "99999999999999999999",
	} {
		_, err := Parse(in)
		assert.ErrorContains(t, err, fmt.Sprintf("%q", in), in)
	}
}
