package trim

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// Issue 32: no log line shows a sentinel as a number. The DEBUG lines of a
// trim ("trim: done", "trim: skipped") printed go_estimate_bytes=-1 and
// c_estimate_bytes=-1 for an estimate that is unknown (the Go heap's when
// it cannot be read, mimalloc's always) and for a Trimmer with no C step.
// Now: "unknown", and the C estimate is left out where there is no C step.
func TestTrimLinesNoSentinel(t *testing.T) {
	for _, tc := range []struct {
		name        string
		goEst, cRet int64
		noC         bool
		msg, want   string
		absent      string
	}{
		{"done, both unknown", -1, -1, false, "trim: done", "go_estimate_bytes=unknown c_estimate_bytes=unknown", ""},
		{"done, no C step", -1, 0, true, "trim: done", "go_estimate_bytes=unknown", "c_estimate_bytes"},
		{"skipped, C known", 40 << 10, 1 << 20, false, "trim: skipped", "go_estimate_bytes=40960 c_estimate_bytes=1048576", ""},
		{"skipped, no C step", 40 << 10, 0, true, "trim: skipped", "go_estimate_bytes=40960", "c_estimate_bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakeStep{}
				logs, logger := newLog()
				cfg := fakeConfig(f)
				cfg.Logger = logger
				if !tc.noC {
					cfg.NoCHeap, cfg.cheap = false, &fakeCHeapRetained{retained: tc.cRet}
				}
				cfg.estimate = func() int64 { return tc.goEst }
				tr := mustNew(t, cfg)
				defer tr.Close()
				tr.AfterBurst()
				time.Sleep(time.Minute)
				var line string
				for l := range strings.SplitSeq(logs.String(), "\n") {
					if strings.Contains(l, `msg="`+tc.msg+`"`) {
						line = l
					}
				}
				assert.Contains(t, line, tc.want, logs.String())
				assert.NotContains(t, line, "=-", line)
				if tc.absent != "" {
					assert.NotContains(t, line, tc.absent, line)
				}
			})
		})
	}
}
