package sandbox

import (
	"bytes"
	"os"

	"golang.org/x/sys/unix"
)

// markerFile is runsc's marker (--gvisor-marker-file).
var markerFile = "/proc/gvisor"

// logSign is the first line gVisor's kernel writes to its log.
var logSign = []byte("Starting gVisor...")

func markerExists() bool {
	_, err := os.Stat(markerFile)
	return err == nil
}

// readLog reads the end of the kernel log; tests replace it.
var readLog = func(buf []byte) (int, error) {
	return unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
}

func logSaysGVisor() bool {
	buf := make([]byte, 4096)
	n, err := readLog(buf)
	if err != nil || n <= 0 {
		return false
	}
	return bytes.Contains(buf[:min(n, len(buf))], logSign)
}
