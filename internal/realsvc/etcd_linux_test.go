package realsvc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The etcd workload: a database of etcdKeys values of etcdValue bytes
// (about 635 MiB of values, a 665 MB bbolt file), in a 1 GiB cgroup.
const (
	etcdLimit = 1 << 30
	etcdKeys  = 6500
	etcdValue = 100 << 10
	// etcdCheckAt is when GOMEMLIMIT is checked, after the start; the
	// reads go on until etcdReadFor.
	etcdCheckAt = 30 * time.Second
	etcdReadFor = 38 * time.Second
)

// etcdArgs are etcd's flags for a single member with its data in dir.
func etcdArgs(dir string, client, peer int, extra ...string) []string {
	c, p := fmt.Sprintf("http://127.0.0.1:%d", client), fmt.Sprintf("http://127.0.0.1:%d", peer)
	return append([]string{"--name", "default", "--data-dir", dir,
		"--listen-client-urls", c, "--advertise-client-urls", c,
		"--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
		"--initial-cluster", "default=" + p}, extra...)
}

// testEtcd runs etcd with the auto import beside plain etcd, each in a
// 1 GiB cgroup with a copy of the same database, reads every value and
// then random ones, and checks GOMEMLIMIT 30 s after the start, OOM kills
// and CPU.
func testEtcd(t *testing.T, b Builds, m Module, cache string, tab *Table) {
	arms := []*arm{newArm(t, "plain", etcdLimit), newArm(t, "auto", etcdLimit)}
	start, loads := etcdStart(t, b, m, cache, arms)
	time.Sleep(time.Until(start.Add(etcdCheckAt)))
	held := map[string]Held{}
	var err error
	for _, a := range arms {
		if held[a.name], err = ReadHeld(a.g.Dir, a.pid()); err != nil {
			t.Errorf("realsvc: etcd %s: %v", a.name, err)
		}
	}
	rec, recErr := ReadRecord(b.Memctl, arms[1].pid())
	for _, a := range arms {
		out, err := loads[a.name]()
		if err != nil {
			t.Errorf("realsvc: etcdload read on %s: %v: %s", a.name, err, out)
		}
		t.Logf("realsvc: etcd %s: %s", a.name, out)
	}
	wall := time.Since(start)
	cpu := map[string]time.Duration{}
	for _, a := range arms {
		if cpu[a.name], err = CPUTime(a.pid()); err != nil {
			t.Errorf("realsvc: etcd %s: %v", a.name, err)
		}
	}
	for _, l := range arms[1].memctlLines(10) {
		t.Logf("realsvc: etcd auto: %s", l)
	}

	// GOMEMLIMIT: [0.85, 0.9] x (limit - held), held between Low and High,
	// each widened by statSlack: memory.stat's counters are per-CPU
	// counters the kernel folds in batches of 64 pages
	// (include/linux/memcontrol.h, MEMCG_CHARGE_BATCH), so memctl's read at
	// its refresh and this one can each be off by a batch per CPU; the
	// process's RssAnon is a per-CPU counter read approximately too.
	h := held["auto"]
	statSlack := int64(64 * runtime.NumCPU() * os.Getpagesize())
	lo := int64(0.85 * float64(etcdLimit-h.High()-statSlack))
	hi := int64(0.9 * float64(etcdLimit-max(0, h.Low()-statSlack)))
	t.Logf("realsvc: etcd auto at %s: held outside Go: %s", etcdCheckAt, h)
	t.Logf("realsvc: etcd plain at %s: held outside Go: %s", etcdCheckAt, held["plain"])
	r := Row{Service: "etcd", Check: "GOMEMLIMIT 30 s after start", Arm: "auto", Issue: "32",
		Plain: fmt.Sprintf("none; holds %.0f-%.0f MiB outside Go, %.0f MiB mapped", mib(held["plain"].Low()), mib(held["plain"].High()), mib(held["plain"].MappedFile)),
		Bound: fmt.Sprintf("[%.0f, %.0f] MiB = [0.85, 0.9] x (1 GiB - %.0f-%.0f MiB held)", mib(lo), mib(hi), mib(h.Low()), mib(h.High()))}
	if recErr != nil {
		r.Value = recErr.Error()
	} else {
		r.Value = fmt.Sprintf("%.1f MiB (counts %.0f MiB outside Go)", mib(rec.GOMEMLIMIT.Bytes), mib(rec.GOMEMLIMIT.OutsideBytes))
		r.OK = rec.GOMEMLIMIT.Bytes >= lo && rec.GOMEMLIMIT.Bytes <= hi
	}
	check(t, tab.Add(r), "etcd's mapped bbolt file is counted as memory outside Go")

	plainOK, plainFate := arms[0].fate(t)
	autoOK, autoFate := arms[1].fate(t)
	check(t, tab.Add(Row{Service: "etcd", Check: "OOM kill", Arm: "auto", Plain: plainFate, Value: autoFate,
		Bound: "none where plain has none", OK: autoOK || !plainOK}), "")
	bound := cpuBound(cpu["plain"], wall)
	check(t, tab.Add(Row{Service: "etcd", Check: fmt.Sprintf("CPU over %.0f s (utime+stime)", wall.Seconds()), Arm: "auto",
		Plain: secs(cpu["plain"]), Value: secs(cpu["auto"]),
		Bound: fmt.Sprintf("<= %s (%.2f x plain + 2%% of %.0f s)", secs(bound), cpuRatio, wall.Seconds()), OK: cpu["auto"] <= bound}), "")
}

// etcdStart copies the database for each arm, from inside its cgroup so
// that its page cache is charged there (as a pod's database is charged to
// the pod), starts the arms' etcd at once and, when they answer, an
// etcdload reading each until etcdReadFor after the start. It returns the
// start and, by arm, a function that waits for its reader's end and
// returns what it printed.
func etcdStart(t *testing.T, b Builds, m Module, cache string, arms []*arm) (time.Time, map[string]func() (string, error)) {
	data := etcdData(t, b, m, cache)
	work, err := os.MkdirTemp(cache, "run-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	if err := notTmpfs(work); err != nil {
		t.Skipf("realsvc: %v", err)
	}
	var wg sync.WaitGroup
	for _, a := range arms {
		wg.Go(func() {
			cmd := exec.Command("cp", "-a", data, filepath.Join(work, a.name))
			a.g.Wrap(cmd)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("realsvc: copy the database for %s: %v: %s", a.name, err, out)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	bins := map[string]string{"plain": b.EtcdPlain, "auto": b.EtcdAuto}
	ports := map[string]int{}
	start := time.Now()
	for _, a := range arms {
		ports[a.name] = freePort(t)
		a.start(t, work, bins[a.name], etcdArgs(filepath.Join(work, a.name), ports[a.name], freePort(t))...)
	}
	for _, a := range arms {
		if err := waitHTTP(a, fmt.Sprintf("http://127.0.0.1:%d/health", ports[a.name]), 30*time.Second); err != nil {
			t.Fatalf("realsvc: etcd %v\n%s", err, a.tail(20))
		}
	}
	t.Logf("realsvc: etcd plain and auto ready %.1f s after the start", time.Since(start).Seconds())
	loads := map[string]func() (string, error){}
	for _, a := range arms {
		d := etcdReadFor - time.Since(start)
		cmd := exec.Command(b.EtcdLoad, "-endpoint", fmt.Sprintf("127.0.0.1:%d", ports[a.name]), "-n", strconv.Itoa(etcdKeys), "-d", d.String(), "read")
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		loads[a.name] = func() (string, error) {
			err := cmd.Wait()
			return strings.TrimSpace(out.String()), err
		}
	}
	return start, loads
}

// check reports a failed row as a test error, naming the issue it depends
// on and why.
func check(t *testing.T, r Row, why string) {
	t.Helper()
	if r.OK {
		return
	}
	msg := fmt.Sprintf("%s %s: %s: %s, plain %s; want %s", r.Service, r.Arm, r.Check, r.Value, r.Plain, r.Bound)
	if r.Issue != "" {
		msg = fmt.Sprintf("[needs issue %s: %s] %s", r.Issue, why, msg)
	}
	t.Error(msg)
}

// etcdData returns a data directory with the suite's database, made once
// per etcd version in the cache: plain etcd (no cgroup) is written etcdKeys
// values with fsync off and a snapshot every 200 entries (so that a restart
// replays a short log, not the whole database), stopped, and started once
// more with --max-wals 1 so that the WAL written meanwhile is purged.
func etcdData(t *testing.T, b Builds, m Module, cache string) string {
	t.Helper()
	dir := filepath.Join(cache, "etcd-data", fmt.Sprintf("%s-%dx%d-%s", m.Version, etcdKeys, etcdValue, layout))
	if _, err := os.Stat(filepath.Join(dir, "member", "snap", "db")); err == nil {
		return dir
	}
	t0 := time.Now()
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "tmp-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	data := filepath.Join(tmp, "data")
	run := func(wait func(port int) error, extra ...string) {
		port := freePort(t)
		cmd := exec.Command(b.EtcdPlain, etcdArgs(data, port, freePort(t), extra...)...)
		var log strings.Builder
		cmd.Stdout, cmd.Stderr, cmd.Env = &log, &log, env()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		werr := wait(port)
		_ = cmd.Process.Signal(os.Interrupt)
		cerr := cmd.Wait()
		if werr != nil {
			t.Fatalf("realsvc: making the etcd database: %v (etcd: %v)\n%s", werr, cerr, lastLines(log.String(), 20))
		}
	}
	run(func(port int) error {
		out, err := exec.Command(b.EtcdLoad, "-endpoint", fmt.Sprintf("127.0.0.1:%d", port), "-n", strconv.Itoa(etcdKeys), "-size", strconv.Itoa(etcdValue), "put").CombinedOutput()
		t.Logf("realsvc: %s", strings.TrimSpace(string(out)))
		return err
	}, "--unsafe-no-fsync", "--snapshot-count", "200", "--snapshot-catchup-entries", "100")
	run(func(int) error {
		for range 300 {
			w, _ := filepath.Glob(filepath.Join(data, "member", "wal", "*.wal"))
			if len(w) == 1 {
				return nil
			}
			time.Sleep(100 * time.Millisecond)
		}
		return fmt.Errorf("the WAL was not purged to one file in 30 s")
	}, "--max-wals", "1")
	st, err := os.Stat(filepath.Join(data, "member", "snap", "db"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() < 600<<20 || st.Size() > 700<<20 {
		t.Fatalf("realsvc: the etcd database is %s, want 600-700 MiB", MiB(st.Size()))
	}
	if err := os.Rename(data, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "member", "snap", "db")); serr != nil {
			t.Fatal(err)
		} // else made by a concurrent run
	}
	t.Logf("realsvc: made the etcd database (%s) in %.0f s: %s", MiB(st.Size()), time.Since(t0).Seconds(), dir)
	return dir
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}
