package sandbox

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestDetect: gVisor's two documented signs each give GVisor; a host
// kernel's log and no marker give "" (this machine is no gVisor sandbox:
// its kernel log, if readable, does not start with gVisor's line).
func TestDetect(t *testing.T) {
	marker, read := markerFile, readLog
	t.Cleanup(func() { markerFile, readLog = marker, read })
	if _, err := os.Stat("/proc/gvisor"); err == nil {
		t.Skip("running in gVisor: the host case cannot be checked here")
	}
	assert.Equal(t, "", Detect(), "this host")

	markerFile = t.TempDir()
	assert.Equal(t, GVisor, Detect(), "the marker file")

	markerFile = filepath.Join(t.TempDir(), "none")
	gvisorLog := "[    0.000000] Starting gVisor...\n[    0.354495] Daemonizing children...\n[    2.613217] Ready!\n"
	readLog = func(buf []byte) (int, error) { return copy(buf, gvisorLog), nil }
	assert.Equal(t, GVisor, Detect(), "gVisor's kernel log")
	readLog = func(buf []byte) (int, error) { return copy(buf, "[    0.000000] Linux version 6.1.0\n"), nil }
	assert.Equal(t, "", Detect(), "a host kernel's log")
	readLog = func(buf []byte) (int, error) { return 0, os.ErrPermission }
	assert.Equal(t, "", Detect(), "a log that cannot be read")
	readLog = func(buf []byte) (int, error) { return -1, nil }
	assert.Equal(t, "", Detect(), "a bad count")
}
