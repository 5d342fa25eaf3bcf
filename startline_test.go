package memctl

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/cgrouptest"
	"github.com/memctl/memctl/internal/childtest"
)

func init() { moreChildren["start-default-logger"] = childStartDefaultLogger }

// childStartDefaultLogger runs Start with no option at all: the line goes
// to slog.Default, as in a service that imports auto.
func childStartDefaultLogger() {
	ctl, _ := Start()
	_ = ctl.Close()
}

// Input (issue 27, item 3): the startup line was 937 characters with 17
// keys, GOMEMLIMIT in raw bytes and arena_max=2 unexplained. In a real
// 256 MiB cgroup with defaults it must be readable at a glance in kubectl
// logs: under 300 characters (the bound), GOMEMLIMIT in MiB and
// where it came from; the details at DEBUG; no WARN line when nothing
// needs action.
func TestStartupLineShortInCgroup(t *testing.T) {
	g := cgrouptest.New(t, 256<<20)
	cmd := childtest.Command(t, "start-default-logger", []string{"MEMCTL", "MEMCTL_THP", "MEMCTL_TRIM_DELAY", "MEMCTL_AUTOBURST",
		"MEMCTL_ARENA_MAX", "MEMCTL_PRESSURE", "GOMEMLIMIT", "AUTOMEMLIMIT", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "LD_PRELOAD"})
	g.Wrap(cmd)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Run(), stderr.String())
	var line string
	for _, l := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(l, "memctl started") {
			line = l
		}
	}
	require.NotEmpty(t, line, stderr.String())
	t.Logf("%d characters: %s", len(line), line)
	assert.Less(t, len(line), 300, "the whole line, with the log package's date and level")
	assert.Regexp(t, regexp.MustCompile(` gomemlimit=[0-9]+\.[0-9]MiB `), line)
	assert.Contains(t, line, `gomemlimit_source="90% of cgroup v`)
	assert.Contains(t, line, "limit 256.0MiB less ")
	assert.Regexp(t, regexp.MustCompile(` thp=\S+ trim_delay=2s auto_burst=on pressure=`), line)
	assert.NotContains(t, stderr.String(), " WARN ", "nothing needs action here")
	assert.NotContains(t, line, "arena_max", "details are at DEBUG")
}
