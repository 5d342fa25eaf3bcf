package memctl

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Burst detection is on by default and follows the one grammar: the off
// words turn it off, the on words keep it, an invalid word turns it off and
// is an error; with trimming off there is no detector.
func TestAutoBurstSwitch(t *testing.T) {
	r, recs := runStart(t, nil)
	assert.Equal(t, "true", r["AUTOBURST"])
	_, line := infoLines(recs)
	assert.Equal(t, "on", line["auto_burst"])
	for _, v := range []string{"off", "0", "No"} {
		r, recs := runStart(t, nil, "MEMCTL_AUTOBURST="+v)
		assert.Equal(t, "<nil>", r["ERR"], v)
		assert.Equal(t, "false", r["AUTOBURST"], v)
		_, line := infoLines(recs)
		assert.Equal(t, "off", line["auto_burst"], v)
	}
	r, _ = runStart(t, nil, "MEMCTL_AUTOBURST=on")
	assert.Equal(t, "true", r["AUTOBURST"])
	r, _ = runStart(t, nil, "MEMCTL_AUTOBURST=sometimes")
	assert.Contains(t, r["ERR"], `MEMCTL_AUTOBURST="sometimes"`)
	assert.Equal(t, "false", r["AUTOBURST"], "invalid: off")
	r, _ = runStart(t, nil, "MEMCTL_TRIM_DELAY=off")
	assert.Equal(t, "false", r["AUTOBURST"], "no trimmer, no detector")
}

// Issue 19: MEMCTL_BUDGET and MEMCTL_TRIMDELAY (typos) were ignored without
// a word. Each unknown MEMCTL_* variable gets one WARN naming the closest
// known one; it is not an error and changes nothing else.
func TestUnknownEnvWarns(t *testing.T) {
	r, recs := runStart(t, nil, "MEMCTL_BUDGET=observe", "MEMCTL_TRIMDELAY=5s", "MEMCTL_AUTO_BURST=off")
	assert.Equal(t, "<nil>", r["ERR"])
	assert.Equal(t, "2s", r["TRIM_DELAY"], "the typo is not guessed at")
	got := map[string]any{}
	for _, rec := range recs {
		if rec["level"] == "WARN" && rec["msg"] == "memctl: unknown environment variable ignored" {
			got[rec["name"].(string)] = rec["closest"]
		}
	}
	assert.Equal(t, map[string]any{"MEMCTL_BUDGET": "MEMCTL_BUDGETS", "MEMCTL_TRIMDELAY": "MEMCTL_TRIM_DELAY",
		"MEMCTL_AUTO_BURST": "MEMCTL_AUTOBURST"}, got)
	assert.Equal(t, 3, countLevel(recs, "WARN"), "one WARN each, nothing else: %v", recs)
	_, recs = runStart(t, nil)
	assert.Zero(t, countLevel(recs, "WARN"), "the test's own MEMCTL_TEST_CHILD is not reported: %v", recs)
}
