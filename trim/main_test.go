package trim

import (
	"bytes"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/memctl/memctl/internal/childtest"
	"github.com/memctl/memctl/internal/procfs"
)

func TestMain(m *testing.M) {
	if os.Getenv(childtest.EnvVar) != "" {
		childtest.Main(m, map[string]func(){
			"burst-trim":         func() { burstChild(true) },
			"burst-notrim":       func() { burstChild(false) },
			"lazy":               lazyChild,
			"throttled":          throttledChild,
			"load-nogc":          func() { loadChild(false) },
			"load-freeosmemory":  func() { loadChild(true) },
			"limiter-last-cycle": limiterChild,
		})
	}
	goleak.VerifyTestMain(m)
}

func childRSS() int64 {
	r, err := procfs.RSS(0)
	if err != nil {
		childtest.Fail("%v", err)
	}
	return r
}

// reportsAtOnce runs the arms of one comparison at the same time, under
// the same load, and returns their reports (see childtest.Report).
func reportsAtOnce(t *testing.T, cmds ...*exec.Cmd) []map[string]string {
	t.Helper()
	outs, errs := make([]bytes.Buffer, len(cmds)), make([]bytes.Buffer, len(cmds))
	for i, c := range cmds {
		c.Stdout, c.Stderr = &outs[i], &errs[i]
		require.NoError(t, c.Start())
	}
	var reps []map[string]string
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("child %v: %v\nstdout:\n%s\nstderr:\n%s", c.Args, err, outs[i].String(), errs[i].String())
		}
		reps = append(reps, childtest.ParseReport(outs[i].Bytes()))
	}
	return reps
}
