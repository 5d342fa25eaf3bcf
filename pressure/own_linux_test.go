package pressure_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/procfs"
	"github.com/memctl/memctl/pressure"
)

// Issue 32, item 1's kind: the own-anon share of host-wide PSI (makeup.Own,
// whether the host's anonymous memory is this process's) must not count
// file-backed pages as held. It is RssAnon, compared with the host's
// AnonPages; neither counts mapped files, the binary's text or shmem (a
// cancel gives back Go heap, which is anonymous). Here 64 MiB of a file
// mapped and read, and 32 MiB of shmem (a memfd mapped and written), raise
// VmRSS by 96 MiB and Own by almost nothing.
func TestHostMakeupOwnIsAnonOnly(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory of the mapped pages this test reads is anonymous memory of this process")
	}
	const n = 64 << 20
	before, err := pressure.HostMakeup("/proc/meminfo", "/proc/self/status")
	require.NoError(t, err)
	rss0, err := procfs.RSS(0)
	require.NoError(t, err)

	path := filepath.Join(t.TempDir(), "mapped")
	// Written from one small buffer: a 64 MiB one would be anonymous memory
	// of this process itself.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for range n / len(chunk) {
		_, err := f.Write(chunk)
		require.NoError(t, err)
	}
	file, err := unix.Mmap(int(f.Fd()), 0, n, unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(file)
	var sum byte
	for i := 0; i < n; i += 4096 {
		sum += file[i]
	}
	mfd, err := unix.MemfdCreate("memctl-own-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(mfd)
	require.NoError(t, unix.Ftruncate(mfd, n/2))
	shm, err := unix.Mmap(mfd, 0, n/2, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(shm)
	for i := 0; i < n/2; i += 4096 {
		shm[i] = 1
	}

	after, err := pressure.HostMakeup("/proc/meminfo", "/proc/self/status")
	require.NoError(t, err)
	rss1, err := procfs.RSS(0)
	require.NoError(t, err)
	t.Logf("VmRSS %d -> %d MiB; Own (RssAnon) %d -> %d MiB (sum %d)", rss0>>20, rss1>>20, before.Own>>20, after.Own>>20, sum)
	require.GreaterOrEqual(t, rss1-rss0, int64(90<<20), "the mapped file and the shmem are resident")
	assert.Less(t, after.Own-before.Own, int64(16<<20), "neither the mapped file nor the shmem counts as this process's anonymous memory")
}
