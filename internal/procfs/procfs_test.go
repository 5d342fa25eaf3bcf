package procfs

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/safefs"
)

func TestParseStatusFixture(t *testing.T) {
	f, err := ReadFile("testdata/status")
	require.NoError(t, err)
	rss, err := f.Bytes("VmRSS")
	require.NoError(t, err)
	assert.Positive(t, rss)
	assert.Zero(t, rss%1024, "kB values are converted to bytes")
	thp, err := f.Int("THP_enabled")
	require.NoError(t, err)
	assert.Equal(t, int64(1), thp)
}

func TestParseSmapsRollupSkipsHeader(t *testing.T) {
	f, err := ReadFile("testdata/smaps_rollup")
	require.NoError(t, err)
	ahp, err := f.Bytes("AnonHugePages")
	require.NoError(t, err)
	assert.GreaterOrEqual(t, ahp, int64(0))
}

func TestMalformedNamesFile(t *testing.T) {
	_, err := ReadFile("testdata/status_malformed")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "testdata/status_malformed")
	assert.Contains(t, err.Error(), "line 2")
}

func TestBadValues(t *testing.T) {
	f, err := ReadFile("testdata/status_badvalues")
	require.NoError(t, err)
	for _, key := range []string{"VmRSS", "VmHWM"} {
		_, err := f.Bytes(key)
		require.Error(t, err, key)
		assert.Contains(t, err.Error(), "testdata/status_badvalues")
	}
	_, err = f.Int("Threads")
	require.Error(t, err)
	_, err = f.Bytes("VmSwap")
	assert.True(t, errors.Is(err, ErrMissing))
}

func TestEmptyAndMissing(t *testing.T) {
	_, err := Parse(strings.NewReader(""), "empty")
	require.ErrorContains(t, err, "empty: no fields")
	_, err = ReadFile("testdata/does-not-exist")
	require.ErrorContains(t, err, "testdata/does-not-exist")
}

func TestRSSOfThisProcess(t *testing.T) {
	if _, err := ReadFile("/proc/self/status"); err != nil {
		t.Skipf("no procfs here: %v", err)
	}
	rss, err := RSS(0)
	require.NoError(t, err)
	assert.Greater(t, rss, int64(1<<20), "a Go test binary has more than 1 MiB resident")
}

func TestPath(t *testing.T) {
	assert.Equal(t, "/proc/self/status", StatusPath(0))
	assert.Equal(t, "/proc/42/smaps_rollup", Path(42, "smaps_rollup"))
}

// TestSignedValuesAreMalformed: the kernel writes sizes and counts as bare
// digits; a sign ("+5 kB", "-0 kB", "+1") is not its output and is
// refused with an error naming the file and the key.
func TestSignedValuesAreMalformed(t *testing.T) {
	f, err := Parse(strings.NewReader("VmRSS: +5 kB\nVmHWM: -0 kB\nVmSwap: -5 kB\nVmPTE:  16 kB\nThreads: +1\nTHP_enabled: -1\nSeccomp: 0\nNSpid: 1 2\n"), "status_signed")
	require.NoError(t, err)
	for _, key := range []string{"VmRSS", "VmHWM", "VmSwap"} {
		_, err := f.Bytes(key)
		require.Error(t, err, key)
		assert.Contains(t, err.Error(), "procfs: status_signed: "+key+": malformed size")
		assert.NotErrorIs(t, err, ErrMissing)
	}
	for _, key := range []string{"Threads", "THP_enabled", "NSpid"} {
		_, err := f.Int(key)
		require.Error(t, err, key)
		assert.Contains(t, err.Error(), "procfs: status_signed: "+key+": malformed integer")
	}
	n, err := f.Bytes("VmPTE")
	require.NoError(t, err)
	assert.Equal(t, int64(16<<10), n)
	n, err = f.Int("Seccomp")
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestParseDigits(t *testing.T) {
	for s, want := range map[string]int64{"0": 0, "7": 7, "007": 7, "9223372036854775807": math.MaxInt64} {
		n, ok := parseDigits(s)
		assert.True(t, ok, "%q", s)
		assert.Equal(t, want, n, "%q", s)
	}
	for _, s := range []string{"", "+1", "-1", "-0", " 1", "1 ", "1_000", "0x10", "9223372036854775808", "١"} {
		_, ok := parseDigits(s)
		assert.False(t, ok, "%q", s)
	}
}

func TestReadFileIn(t *testing.T) {
	d, err := safefs.OpenDir("/proc/self", safefs.NoSymlinks)
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skip(err)
	}
	require.NoError(t, err)
	defer d.Close()
	f, err := ReadFileIn(d, "status")
	require.NoError(t, err)
	assert.Equal(t, "/proc/self/status", f.File)
	rss, err := f.Bytes("VmRSS")
	require.NoError(t, err)
	assert.Positive(t, rss)
	_, err = ReadFileIn(d, "root/etc/hostname")
	assert.ErrorIs(t, err, safefs.ErrSymlink, "a magic link is refused")
}

// TestMalformedExcerptIsBounded: a malformed line is quoted, escaped and cut.
func TestMalformedExcerptIsBounded(t *testing.T) {
	line := "\x1b[2J" + strings.Repeat("x", 10000)
	_, err := Parse(strings.NewReader(line), "f")
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "\x1b")
	assert.Less(t, len(err.Error()), 400)
	fs, err := Parse(strings.NewReader("K: \x1b]0;t\a"+strings.Repeat("y", 5000)+" kB\n"), "f")
	require.NoError(t, err)
	_, err = fs.Bytes("K")
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "\x1b")
	assert.Less(t, len(err.Error()), 400)
}

// TestVmSwapHostileLines: a VmSwap value that overflows int64 in bytes,
// or is not "N kB", is an error naming the file and quoting the value,
// never a wrong size; the largest that fits is taken.
func TestVmSwapHostileLines(t *testing.T) {
	for _, v := range []string{
		"9007199254740992 kB", // 2^53 KiB: 2^63 bytes
		"99999999999999999999 kB",
		"-1 kB", "+1 kB", "1 KB", "1 MB", "1kB", "1 kB 2", "0x10 kB", "1.5 kB", "kB", "",
		"1\x1b[2J kB",
	} {
		t.Run(v, func(t *testing.T) {
			f, err := Parse(strings.NewReader("Name:\tx\nVmSwap:\t"+v+"\n"), "status")
			require.NoError(t, err)
			n, err := f.Bytes("VmSwap")
			require.Error(t, err, "got %d", n)
			assert.Contains(t, err.Error(), "status")
			assert.NotContains(t, err.Error(), "\x1b", "quoted")
		})
	}
	f, err := Parse(strings.NewReader("VmSwap:\t9007199254740991 kB\n"), "status")
	require.NoError(t, err)
	n, err := f.Bytes("VmSwap")
	require.NoError(t, err)
	assert.Equal(t, int64(9007199254740991)*1024, n)
}
