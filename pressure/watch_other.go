//go:build !linux

package pressure

// watcher is the kernel watcher; there is none off Linux.
type watcher struct {
	name, note string
}

func startWatcher(*Monitor) (*watcher, error) { return nil, ErrNoSource }

func (*watcher) close() {}
