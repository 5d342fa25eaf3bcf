package procfs

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSelfHeld(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Linux only")
	}
	var s SelfHeld
	got, err := s.Held()
	require.NoError(t, err)
	want, err := Held(0)
	require.NoError(t, err)
	assert.InEpsilon(t, want, got, 0.5, "Held(0) %d, SelfHeld %d", want, got)
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := s.Held(); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs)
}

func TestKibField(t *testing.T) {
	b := []byte("Name:\tx\nRssAnonX:\t1 kB\nRssAnon:\t    1234 kB\nRssShmem:\t0 kB\nBad:\t12 MB\nNeg:\t-1 kB\n")
	for key, want := range map[string]int64{"RssAnon:": 1234 << 10, "RssShmem:": 0} {
		v, ok := kibField(b, key)
		assert.True(t, ok, key)
		assert.Equal(t, want, v, key)
	}
	for _, key := range []string{"Bad:", "Neg:", "Missing:"} {
		_, ok := kibField(b, key)
		assert.False(t, ok, key)
	}
}
