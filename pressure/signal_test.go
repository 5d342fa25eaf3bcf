package pressure

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSystemdSource(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	_, ok, _, err := systemdEnv(env())
	require.NoError(t, err)
	assert.False(t, ok)

	_, ok, off, err := systemdEnv(env("MEMORY_PRESSURE_WATCH", "/dev/null"))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.True(t, off)

	// systemd writes "some 200000 2000000" base64-encoded.
	s, ok, off, err := systemdEnv(env("MEMORY_PRESSURE_WATCH", "/sys/fs/cgroup/a.service/memory.pressure",
		"MEMORY_PRESSURE_WRITE", "c29tZSAyMDAwMDAgMjAwMDAwMAA="))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.False(t, off)
	assert.Equal(t, "/sys/fs/cgroup/a.service/memory.pressure", s.path)
	assert.Equal(t, "some 200000 2000000\x00", string(s.write))

	for name, e := range map[string]func(string) string{
		"relative path": env("MEMORY_PRESSURE_WATCH", "memory.pressure"),
		"bad base64":    env("MEMORY_PRESSURE_WATCH", "/x", "MEMORY_PRESSURE_WRITE", "not base64!"),
	} {
		t.Run(name, func(t *testing.T) {
			_, _, _, err := systemdEnv(e)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "$MEMORY_PRESSURE_")
		})
	}
}

func TestPSITrigger(t *testing.T) {
	assert.Equal(t, "some 200000 2000000\x00", string(psiTrigger(200*time.Millisecond, 2*time.Second)))
}

// The check of a PSI event against the stall since arming (psiArm), with
// fake totals: the kernel signalled triggers just armed with 0-0.8 ms of
// stall since arming against a 150 ms threshold (TestPSINoEventUnexplained).
func TestPSIArmExplains(t *testing.T) {
	a := arm{trigger: trigger{stall: 150_000, window: 2_000_000}, armed: 20_571_069}
	for _, tc := range []struct {
		name  string
		total int64
		want  bool
	}{
		{"no stall since arming (measured: 0 us)", 20_571_069, false},
		{"the lead's event: 28.6 ms since arming", 20_571_069 + 28_604, false},
		{"just under the threshold", 20_571_069 + 149_999, false},
		{"the threshold", 20_571_069 + 150_000, true},
		{"more", 20_571_069 + 454_117, true},
		{"a total that went down is not judged", 1000, true},
	} {
		assert.Equal(t, tc.want, a.explains(tc.total), tc.name)
	}
}

func TestParseTrigger(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want trigger
		ok   bool
	}{
		{"some 200000 2000000\x00", trigger{false, 200_000, 2_000_000}, true},
		{"full 150000 2000000", trigger{true, 150_000, 2_000_000}, true},
		{"some 150000 2000000\n", trigger{false, 150_000, 2_000_000}, true},
		{"some 0 2000000", trigger{false, 0, 2_000_000}, true}, // no threshold: armPSI checks no event
		{"both 1 2", trigger{}, false},
		{"some x 2000000", trigger{}, false},
		{"some 200000", trigger{}, false},
		{"some  200000 2000000", trigger{}, false},
		{"", trigger{}, false},
	} {
		got, err := parseTrigger([]byte(tc.in))
		assert.Equal(t, tc.ok, err == nil, "%q: %v", tc.in, err)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
	// The default trigger is understood: its events are checked.
	got, err := parseTrigger(psiTrigger(200*time.Millisecond, 2*time.Second))
	require.NoError(t, err)
	assert.Equal(t, trigger{false, 200_000, 2_000_000}, got)
}

func TestParsePSITotals(t *testing.T) {
	some, full := parsePSITotals([]byte("some avg10=0.00 avg60=0.80 avg300=1.85 total=19762002\nfull avg10=0.00 avg60=0.03 avg300=0.10 total=3486911\n"))
	assert.Equal(t, int64(19762002), some)
	assert.Equal(t, int64(3486911), full)
	some, full = parsePSITotals([]byte("some avg10=0.00 avg60=0.00 avg300=0.00 total=12\n")) // cpu before Linux 5.13
	assert.Equal(t, int64(12), some)
	assert.Equal(t, int64(-1), full)
	some, full = parsePSITotals([]byte("some avg10=0.00 total=-5\nfull total=x\nnone total=7\n"))
	assert.Equal(t, int64(-1), some)
	assert.Equal(t, int64(-1), full)
	some, full = parsePSITotals(nil)
	assert.Equal(t, int64(-1), some)
	assert.Equal(t, int64(-1), full)
}
