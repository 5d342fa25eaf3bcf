package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
)

// memctl status on a process in each layout containers use, read from the
// host as an operator would, and memctl exec run inside each layout: the
// cgroup's limit (or, where the limit is above a namespace root the process
// cannot see, "unknown", never a wrong one) and GOMEMLIMIT from it. They
// run on a real cgroup v2 kernel under internal/v2vm and skip elsewhere.
func TestV2StatusAndExec(t *testing.T) {
	cgrouptest.RequireV2(t)
	const limit = 256 << 20
	for _, l := range cgrouptest.Layouts() {
		t.Run(l.Name, func(t *testing.T) {
			t.Parallel()
			g := cgrouptest.NewV2(t, l, limit)

			// status -pid of a process in the layout.
			sl := exec.Command("sleep", "120")
			g.Wrap(t, sl)
			require.NoError(t, sl.Start())
			t.Cleanup(func() { _ = sl.Process.Kill(); _ = sl.Wait() })
			pid := sl.Process.Pid
			require.Eventually(t, func() bool { // the layout's sh has exec'd sleep
				b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
				return strings.TrimSpace(string(b)) == "sleep"
			}, 10*time.Second, 20*time.Millisecond)
			stdout, stderr, _ := result(t, memctl(t, nil, "status", "-pid", strconv.Itoa(pid), "-json"))
			var rep statusReport
			require.NoError(t, json.Unmarshal([]byte(stdout), &rep), "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			statusOK := rep.Cgroup != nil && rep.Cgroup.Version == 2 && rep.Cgroup.LimitBytes != nil && *rep.Cgroup.LimitBytes == limit
			var got string
			if rep.Cgroup != nil {
				got = fmt.Sprintf("limit %v from %v (view %s, unknown %v)", v2Deref(rep.Cgroup.LimitBytes), v2Deref(rep.Cgroup.LimitFile), rep.Cgroup.View, rep.Cgroup.LimitUnknown)
			} else {
				got = "no cgroup: " + rep.CgroupError
			}
			t.Logf("layout %s: status: %s; memory_events %v", l.Name, got, rep.MemoryEvents)
			if statusOK {
				assert.Contains(t, rep.MemoryEvents, "max", "memory.events in status")
			}

			// exec inside the layout: GOMEMLIMIT for the program.
			cmd := memctl(t, nil, "exec", "--", "/bin/sh", "-c", `echo "GOMEMLIMIT=$GOMEMLIMIT"`)
			g.Wrap(t, cmd)
			out, errOut, code := result(t, cmd)
			require.Zero(t, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
			v, err := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(out), "GOMEMLIMIT=")), 10, 64)
			execOK := err == nil && v > limit/2 && v <= limit
			t.Logf("layout %s: exec: %s", l.Name, strings.TrimSpace(out))

			if !statusOK || !execOK {
				msg := fmt.Sprintf("layout %s: status %s; exec %q with a %d-byte limit", l.Name, got, strings.TrimSpace(out), limit)
				if l.LimitAbove {
					if rep.Cgroup != nil && rep.Cgroup.LimitUnknown && !execOK && v == 0 {
						return // called unknown, not "none": what the layout allows
					}
				}
				t.Fatal(msg)
			}
		})
	}
}

func v2Deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// memctl status on a service inside a container shows, from the state
// record, the pressure source the library watches there and why the PSI
// trigger was refused, and GOMEMLIMIT from the container's limit.
func TestV2StatusRecordInContainer(t *testing.T) {
	cgrouptest.RequireV2(t)
	for _, tc := range []struct {
		l    cgrouptest.Layout
		note string
	}{
		{cgrouptest.LayoutContainer, "PSI trigger refused: EPERM at the cgroup namespace root (nsdelegate)"},
		{cgrouptest.LayoutReadOnly, "PSI trigger refused: read-only cgroup mount"},
	} {
		t.Run(tc.l.Name, func(t *testing.T) {
			g := cgrouptest.NewV2(t, tc.l, 256<<20)
			cmd := childtest.Command(t, "service", operatorVars)
			g.Wrap(t, cmd)
			rep := startReady(t, cmd)
			out, _, code := result(t, memctl(t, nil, "status", "-json", "-pid", rep["PID"]))
			require.Zero(t, code)
			var doc statusReport
			require.NoError(t, json.Unmarshal([]byte(out), &doc))
			require.NotNil(t, doc.Memctl, "the record")
			assert.Equal(t, "cgroup v2", doc.Memctl.GoMemLimit.Source)
			assert.Contains(t, doc.Memctl.Pressure.Source, "memory.events")
			assert.Equal(t, tc.note, doc.Memctl.Pressure.Note)
		})
	}
}
