package envflag

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSwitchWords(t *testing.T) {
	for _, v := range []string{"on", "ON", "On", " on ", "yes", "YES", "1", "t", "T", "true", "TRUE", "True", "tRuE", "\ttrue\n"} {
		on, ok := Switch(v)
		assert.True(t, ok && on, "%q is on", v)
	}
	for _, v := range []string{"off", "OFF", "Off", " off ", "no", "No", "0", "f", "F", "false", "FALSE", "False", "fAlSe"} {
		on, ok := Switch(v)
		assert.True(t, ok && !on, "%q is off", v)
		assert.True(t, IsOff(v), v)
	}
	for _, v := range []string{"", " ", "flase", "of", "onn", "2", "-1", "y", "n", "enable", "disable", "o n"} {
		_, ok := Switch(v)
		assert.False(t, ok, "%q is not a switch word", v)
		assert.False(t, IsOff(v), v)
	}
}

func TestBool(t *testing.T) {
	on, err := Bool("MEMCTL", "0")
	require.NoError(t, err)
	assert.False(t, on)
	_, err = Bool("MEMCTL", "flase")
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrInvalid)
	var e *Error
	require.True(t, errors.As(err, &e))
	assert.Equal(t, "MEMCTL", e.Name)
	assert.Contains(t, err.Error(), `MEMCTL="flase": want "on" or "off"`)
}

func TestLookup(t *testing.T) {
	t.Setenv("ENVFLAG_TEST", "  2s\n")
	v, ok := Lookup("ENVFLAG_TEST")
	assert.True(t, ok)
	assert.Equal(t, "2s", v)
	t.Setenv("ENVFLAG_TEST", " \t")
	_, ok = Lookup("ENVFLAG_TEST")
	assert.False(t, ok, "blank means unset")
	_, ok = Lookup("ENVFLAG_TEST_NOT_SET_ANYWHERE")
	assert.False(t, ok)
}

func TestDuration(t *testing.T) {
	const def, min = 2 * time.Second, time.Millisecond
	good := map[string]time.Duration{
		"off": 0, "OFF": 0, "false": 0, "no": 0, "0": 0, "0s": 0, "0ms": 0,
		"on": def, "True": def, "1": def, "yes": def,
		"2s": 2 * time.Second, " 500ms ": 500 * time.Millisecond, "1ms": time.Millisecond, "1h": time.Hour,
	}
	for v, want := range good {
		d, err := Duration("MEMCTL_TRIM_DELAY", v, def, min)
		require.NoError(t, err, v)
		assert.Equal(t, want, d, v)
	}
	for _, v := range []string{"soon", "-1s", "-0.5ms", "500us", "1µs", "999us", "2", "10", "2 s", "s", "-0"} {
		d, err := Duration("MEMCTL_TRIM_DELAY", v, def, min)
		if v == "-0" { // ParseDuration reads -0 as 0: off, like "0"
			require.NoError(t, err)
			assert.Zero(t, d)
			continue
		}
		require.Error(t, err, v)
		assert.ErrorIs(t, err, ErrInvalid)
		assert.Zero(t, d, v)
		assert.Contains(t, err.Error(), `MEMCTL_TRIM_DELAY=`, v)
		assert.Contains(t, err.Error(), `at least 1ms`, v)
	}
}

func TestCount(t *testing.T) {
	good := map[string]int{"0": 0, "1": 1, "2": 2, " 8 ": 8, "off": 0, "No": 0, "FALSE": 0, "on": 2, "true": 2, "yes": 2}
	for v, want := range good {
		n, err := Count("MEMCTL_ARENA_MAX", v, 2)
		require.NoError(t, err, v)
		assert.Equal(t, want, n, v)
	}
	for _, v := range []string{"-1", "two", "2.5", "1e3", "0x10", "99999999999999999999999"} {
		n, err := Count("MEMCTL_ARENA_MAX", v, 2)
		require.Error(t, err, v)
		assert.ErrorIs(t, err, ErrInvalid)
		assert.Zero(t, n)
		assert.Contains(t, err.Error(), `MEMCTL_ARENA_MAX=`)
	}
}

func TestRatio(t *testing.T) {
	good := map[string]float64{"0.9": 0.9, " 0.5 ": 0.5, "1": 1, "1.0": 1, "0": 0, "0.0": 0, "-0": 0, "0e5": 0, "off": 0, "FALSE": 0, "no": 0, "on": 0.9, "true": 0.9, "YES": 0.9}
	for v, want := range good {
		r, err := Ratio("AUTOMEMLIMIT", v, 0.9)
		require.NoError(t, err, v)
		assert.Equal(t, want, r, v)
	}
	for _, v := range []string{"-0.1", "1.01", "2", "NaN", "nan", "Inf", "+Inf", "-inf", "90%", "half", "0x1p-1", "1e400", "1e-400", "-1e-400", "0.1e-330"} { // the last three round to 0, but are not "off"
		r, err := Ratio("AUTOMEMLIMIT", v, 0.9)
		require.Error(t, err, v)
		assert.ErrorIs(t, err, ErrInvalid)
		assert.Zero(t, r, v)
		assert.Contains(t, err.Error(), `AUTOMEMLIMIT=`)
		assert.Contains(t, err.Error(), `(0, 1]`)
	}
}

// Issue 19: typos of memctl's variables were ignored without a word. Each
// unknown MEMCTL_* variable is reported once with the closest known name.
func TestUnknown(t *testing.T) {
	env := []string{
		"PATH=/bin", "MEMCTL=on", "MEMCTL_THP=keep",
		"MEMCTL_BUDGET=observe",                       // the reported typos
		"MEMCTL_TRIMDELAY=5s",                         //
		"MEMCTL_TRIM_DEALY=5s",                        // a swap
		"MEMCTL_thp=keep",                             // case
		"MEMCTL_AUTO_BURST=off",                       // an extra underscore
		"MEMCTL_PRESURE=off",                          // a letter missing
		"MEMCTL_GOMEMLIMITFLOOR=1GiB",                 //
		"MEMCTLTHP=keep",                              //
		"MEMCTL_ARENAMAX=4",                           //
		"MEMCTL_REFRESH_=1s",                          //
		"MEMCTL_BUDGET=enforce",                       // the same name again: once
		"MEMCTL_TEST_CHILD=x", "MEMCTL_BENCH_TAG=i19", // reserved
		"memctl_budgets=off", // lower case: still ours, still unknown
		"MEMCTLX", "XMEMCTL_THP=keep",
	}
	want := []Unrecognized{
		{"MEMCTL_BUDGET", "MEMCTL_BUDGETS"},
		{"MEMCTL_TRIMDELAY", "MEMCTL_TRIM_DELAY"},
		{"MEMCTL_TRIM_DEALY", "MEMCTL_TRIM_DELAY"},
		{"MEMCTL_thp", "MEMCTL_THP"},
		{"MEMCTL_AUTO_BURST", "MEMCTL_AUTOBURST"},
		{"MEMCTL_PRESURE", "MEMCTL_PRESSURE"},
		{"MEMCTL_GOMEMLIMITFLOOR", "MEMCTL_GOMEMLIMIT_FLOOR"},
		{"MEMCTLTHP", "MEMCTL_THP"},
		{"MEMCTL_ARENAMAX", "MEMCTL_ARENA_MAX"},
		{"MEMCTL_REFRESH_", "MEMCTL_REFRESH"},
		{"memctl_budgets", "MEMCTL_BUDGETS"},
		{"MEMCTLX", "MEMCTL"},
	}
	assert.Equal(t, want, Unknown(env))
	var known []string
	for _, k := range Known {
		known = append(known, k+"=x")
	}
	assert.Empty(t, Unknown(known), "every known name is known")
	assert.Empty(t, Unknown(nil))
}
