package state

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/safefs"
)

// readOwn reads this process's record as memctl status reads another's.
func readOwn(t *testing.T) (string, *Record) {
	t.Helper()
	proc, err := safefs.OpenDir("/proc/self", safefs.NoSymlinks)
	require.NoError(t, err)
	defer proc.Close()
	path, b, err := proc.ReadMemfd(MemfdName, MaxSize)
	require.NoError(t, err)
	r, err := Parse(b)
	require.NoError(t, err)
	return path, r
}

func TestPublishReplacesInPlace(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	now = func() time.Time { return t0 }
	defer func() { now = time.Now }()

	require.NoError(t, Publish(&Record{PID: 1, CHeap: "glibc", Trim: Trim{Trims: 1}}))
	fd := Descriptor()
	require.GreaterOrEqual(t, fd, 0)
	path, r := readOwn(t)
	assert.Equal(t, "/proc/self/fd/"+strconv.Itoa(fd), path)
	assert.Equal(t, int64(1), r.Trim.Trims)
	assert.Equal(t, t0, r.Updated)
	seq := r.Seq

	// A reader holding the old record keeps it whole while a new one is
	// published onto the same descriptor number.
	old, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	require.NoError(t, Publish(&Record{PID: 1, CHeap: "glibc", Trim: Trim{Trims: 2}}))
	assert.Equal(t, fd, Descriptor(), "the same descriptor number")
	b := make([]byte, MaxSize)
	n, err := unix.Pread(old, b, 0)
	require.NoError(t, err)
	r0, err := Parse(b[:n])
	require.NoError(t, err)
	assert.Equal(t, int64(1), r0.Trim.Trims, "the old file is unchanged")
	// Closed before reading the new one: with both open, the first in
	// /proc/self/fd order is read, which may be old (a lower number when
	// an earlier test left a hole, as -count=2 does).
	require.NoError(t, unix.Close(old))
	_, r = readOwn(t)
	assert.Equal(t, int64(2), r.Trim.Trims)
	assert.Equal(t, seq+1, r.Seq)

	// Sealed: nobody (not even the process by mistake) changes a record.
	w, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err == nil {
		_, err = unix.Write(w, []byte("x"))
		unix.Close(w)
	}
	require.Error(t, err, "a sealed memfd refuses writes")

	// Only one record descriptor, however many publishes.
	ents, err := readLinks()
	require.NoError(t, err)
	assert.Equal(t, 1, ents["/memfd:"+MemfdName+" (deleted)"])
}

// A program that closes every descriptor (and reuses the number) does not
// get its file overwritten: the next record goes to a new descriptor.
func TestPublishAfterClose(t *testing.T) {
	require.NoError(t, Publish(&Record{}))
	fd := Descriptor()
	require.NoError(t, unix.Close(fd))
	var pfd [2]int
	require.NoError(t, unix.Pipe2(pfd[:], unix.O_CLOEXEC))
	defer unix.Close(pfd[0])
	defer unix.Close(pfd[1])
	require.NoError(t, Publish(&Record{}))
	var st unix.Stat_t
	for _, f := range pfd {
		require.NoError(t, unix.Fstat(f, &st))
		assert.Equal(t, uint32(unix.S_IFIFO), st.Mode&unix.S_IFMT, "the pipe on fd %d is untouched", f)
	}
	_, r := readOwn(t)
	assert.Equal(t, Version, r.Version)
}

func readLinks() (map[string]int, error) {
	d, err := safefs.OpenDir("/proc/self/fd", 0)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	m := map[string]int{}
	for fd := range 1024 {
		if l, err := d.Readlink(strconv.Itoa(fd)); err == nil {
			m[l]++
		}
	}
	return m, nil
}

// BenchmarkPublish measures one publish of a record of the usual size
// (about 1 KiB, two pools): what each decision change costs the process.
func BenchmarkPublish(b *testing.B) {
	gml, lim := int64(241591910), int64(120<<20)
	r := &Record{PID: 1, GoMemLimit: GoMemLimit{Bytes: &gml, Source: "cgroup v1",
		File: "/sys/fs/cgroup/memory/system.slice/app.service/memory.limit_in_bytes", MemoryLimitBytes: 256 << 20, Ratio: 0.9,
		RefreshSeconds: 10, Reason: "default ratio 0.9 of the cgroup v1 limit from /sys/fs/cgroup/memory/system.slice/app.service/memory.limit_in_bytes, minus 3.7 MiB outside the Go runtime"},
		THP: THP{Policy: "disable", State: "disabled", System: "madvise"}, Trim: Trim{DelaySeconds: 2, Trims: 10},
		Pools:    []Pool{{Name: "http", Mode: "enforce", LimitBytes: &lim}, {Name: "grpc", Mode: "observe", LimitBytes: &lim}},
		Pressure: Pressure{Source: "cgroup v1 /sys/fs/cgroup/memory/system.slice/app.service/memory.pressure_level low"}, CHeap: "glibc"}
	b.ReportAllocs()
	for b.Loop() {
		if err := Publish(r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPublishFull is BenchmarkPublish with every field of issues
// 17-21 filled (two pools with their peak histograms, two C heaps): about
// 3 KiB of JSON.
func BenchmarkPublishFull(b *testing.B) {
	gml, lim := int64(241591910), int64(120<<20)
	counts := []int64{10, 200, 3000, 400, 50, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}
	r := &Record{PID: 1, GoMemLimit: GoMemLimit{Bytes: &gml, Source: "cgroup v1",
		File: "/sys/fs/cgroup/memory/system.slice/app.service/memory.limit_in_bytes", MemoryLimitBytes: 256 << 20, Ratio: 0.9,
		RefreshSeconds: 10, Reason: "default ratio 0.9 of the cgroup v1 limit from /sys/fs/cgroup/memory/system.slice/app.service/memory.limit_in_bytes, minus 3.7 MiB outside the Go runtime"},
		THP: THP{Policy: "except-advised", State: "disabled-except-advised", System: "madvise"},
		Trim: Trim{DelaySeconds: 2, Trims: 10, Origins: Origins{Debounced: Origin{Trims: 8, CPUSeconds: 0.1, ReleasedBytes: 1 << 30},
			Pressure: Origin{Trims: 2, Skipped: 30}}, SkippedBy: SkippedBy{MinRelease: 25, Budget: 5}},
		Pools: []Pool{{Name: "http", Mode: "enforce", LimitBytes: &lim, Refused: 3, PeakBytes: 50 << 20},
			{Name: "grpc", Mode: "observe", LimitBytes: &lim, Observed: 9}},
		Pressure: Pressure{Source: "cgroup v1 /sys/fs/cgroup/memory/system.slice/app.service/memory.pressure_level low", Signals: 100, Acted: 2, LeftToKernel: 98},
		CHeap:    "glibc",
		CHeaps: []CHeap{{Allocator: "glibc", Library: "/lib/x86_64-linux-gnu/libc.so.6", OwnsMalloc: true, Trimmed: true, Note: "owns malloc: found through dlsym(RTLD_DEFAULT, \"malloc\") and dladdr", RetainedBytes: 1 << 20},
			{Allocator: "jemalloc", Library: "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", Trimmed: true, Note: "dlsym on the object's handle", Releases: 3, ReleasedBytes: 500 << 20, RetainedBytes: 2 << 20}},
		AutoBurst: AutoBurst{Bursts: 4, Marks: 9, FloorBytes: 20 << 20, GCEnds: 1000}}
	for i := range r.Pools {
		r.Pools[i].Peaks.Set(append([]int64(nil), counts...))
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := Publish(r); err != nil {
			b.Fatal(err)
		}
	}
}
