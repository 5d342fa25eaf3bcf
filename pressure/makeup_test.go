package pressure

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgroupfs"
)

// Input (issue 17, case 3): a $MEMORY_PRESSURE_WRITE without its NUL gets
// one; a value that cannot be a PSI trigger is refused with an error
// naming the variable.
func TestSystemdTriggerNUL(t *testing.T) {
	for in, want := range map[string]string{
		"some 200000 2000000":     "some 200000 2000000\x00",
		"some 200000 2000000\x00": "some 200000 2000000\x00",
		"some 200000 2000000\n":   "some 200000 2000000\x00",
		"full 100000 1000000":     "full 100000 1000000\x00",
		"some 500000 500000":      "some 500000 500000\x00",
		"some 1 10000000":         "some 1 10000000\x00",
	} {
		got, err := systemdTrigger([]byte(in))
		require.NoError(t, err, "%q", in)
		assert.Equal(t, want, string(got), "%q", in)
	}
	for _, in := range []string{"", "\x00", "some", "some 200000", "some 200000 2000000 3", "avg 200000 2000000",
		"some 0 2000000", "some 300000 200000", "some 200000 20000000", "some 200 400", "some -1 2000000",
		"some +1 2000000", "some 2e5 2000000", "some  200000 2000000", "SOME 200000 2000000", "some 200000 2000000\x00\x00"} {
		_, err := systemdTrigger([]byte(in))
		require.Error(t, err, "%q", in)
		assert.Contains(t, err.Error(), "$MEMORY_PRESSURE_WRITE", "the error names the variable")
	}
}

// What the pressure is made of: anonymous memory against reclaimable page
// cache, from v1 and v2 memory.stat names and /proc/meminfo.
func TestMakeupAnonymous(t *testing.T) {
	v1 := "cache 10\nrss 20\nshmem 0\nactive_file 5\ninactive_file 5\ntotal_cache 201326592\ntotal_rss 67108864\n" +
		"total_shmem 0\ntotal_active_file 50331648\ntotal_inactive_file 150994944\n"
	s, err := cgroupfs.ParseMemoryStat([]byte(v1), "v1")
	require.NoError(t, err)
	mk := makeupOfStat(s, "v1")
	assert.Equal(t, makeup{Anon: 64 << 20, Cache: 192 << 20, Own: -1, From: "v1"}, mk, "hierarchical total_ lines")
	assert.False(t, mk.anonymous(), "issue 17 case 2: page cache fills a 256 MiB cgroup beside 64 MiB")

	// v2: shmem (tmpfs) is in file but not reclaimable, and not anon.
	v2 := "anon 199229440\nfile 367001600\nshmem 314572800\nactive_file 20971520\ninactive_file 31457280\n"
	s, err = cgroupfs.ParseMemoryStat([]byte(v2), "v2")
	require.NoError(t, err)
	mk = makeupOfStat(s, "v2")
	assert.Equal(t, makeup{Anon: 190 << 20, Cache: 50 << 20, Own: -1, From: "v2"}, mk)
	assert.True(t, mk.anonymous(), "a 180 MiB burst of the process's own garbage")

	assert.False(t, makeup{Anon: -1, Cache: 5}.anonymous(), "unknown: the trim's gate decides, no cancel on it")
	assert.False(t, makeup{Anon: 5, Cache: 5}.anonymous(), "a tie is cache: the kernel reclaims it first")

	mk, err = hostMakeup("testdata/meminfo", "")
	require.NoError(t, err)
	assert.Equal(t, makeup{Anon: 2097152 << 10, Cache: (1048576 + 3145728) << 10, Own: -1, From: "testdata/meminfo"}, mk)
	assert.False(t, mk.anonymous())
	_, err = hostMakeup("testdata/missing", "")
	require.Error(t, err)
}

// The memory.events counters that mean pressure on the cgroup itself.
func TestEventsGrowth(t *testing.T) {
	a := cgroupfs.Events{Low: 1, High: 10, Max: 5, OOM: 0, OOMKill: 0, OOMGroupKill: -1}
	b := a
	b.Low = 100
	assert.Zero(t, eventsGrowth(a, b), "low is others' pressure on our protection")
	b.High, b.Max, b.OOMKill = 12, 8, 1
	assert.Equal(t, int64(6), eventsGrowth(a, b))
	b.High = 3 // went down: a new cgroup
	assert.Equal(t, int64(4), eventsGrowth(a, b))
	assert.Zero(t, eventsGrowth(cgroupfs.Events{Low: -1, High: -1, Max: -1, OOM: -1, OOMKill: -1, OOMGroupKill: -1}, b))
}
