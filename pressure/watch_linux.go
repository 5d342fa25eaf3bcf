package pressure

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"time"

	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/logattr"
	"github.com/memctl/memctl/internal/memsignal"
)

// procPressure is the system-wide memory PSI file (Linux 4.20 and later,
// CONFIG_PSI).
const procPressure = "/proc/pressure/memory"

// watcher is the kernel watcher: one goroutine blocked in poll(2) on the
// source and on wake, an eventfd that close writes to.
type watcher struct {
	m    *Monitor
	sig  *memsignal.Signal
	name string
	// note says why the process's own cgroup is not watched (SourceNote).
	note string
	// hostWide is set for the system-wide PSI: the host's pressure.
	hostWide bool
	// makeup reads what the memory under pressure is made of; makeupBad
	// is set while it cannot (readMakeup).
	makeup    func() (memsignal.Makeup, error)
	makeupBad bool
	wake      int
	done      chan struct{}
}

// stretch is a stretch of pressure: from the first signal to the first
// look after MinInterval that finds none.
type stretch struct {
	in                  bool
	signals, acts, left int64
}

// run is the watcher's goroutine. It polls the source with no timeout; on
// a signal it acts, then ignores the source for MinInterval (poll with a
// timeout, on wake only), then looks at it again: signals latched meanwhile
// (the eventfd counter, the PSI event flag) give one more action.
//
// A PSI event ignored as unexplained gets one more look a window later
// (recheck): the kernel sends no event for a window after one it sent, so
// a real stall that begins just after a false event would otherwise go
// unanswered.
func (w *watcher) run() {
	defer close(w.done)
	fds := []unix.PollFd{w.sig.PollFd(), {Fd: int32(w.wake), Events: unix.POLLIN}}
	fd := fds[0].Fd
	var until, recheck time.Time // end of the quiet interval, the look after an ignored event; zero: none
	var st stretch
	for {
		timeout, look := -1, false
		fds[0].Fd = fd
		if !until.IsZero() {
			if d := time.Until(until); d > 0 {
				timeout = ceilMillis(d)
				fds[0].Fd = -1 // ignored by poll
			} else {
				until, timeout, look = time.Time{}, 0, true // look once: anything latched?
			}
		}
		if !recheck.IsZero() && timeout != 0 {
			if d := ceilMillis(time.Until(recheck)); timeout < 0 || d < timeout {
				timeout = d
			}
		}
		fds[0].Revents, fds[1].Revents = 0, 0
		n, err := unix.Poll(fds, timeout)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			w.m.log.Warn("memctl: memory pressure watcher stopped", "source", w.name, "error", err)
			return
		case fds[1].Revents != 0:
			return
		case n == 0:
			if !recheck.IsZero() && !time.Now().Before(recheck) {
				recheck = time.Time{}
				if _, _, ignore := w.sig.Unexplained(); !ignore {
					w.respond(1, &st)
					until, look = time.Now().Add(w.m.cfg.MinInterval), false
				}
			}
			if look {
				w.eased(&st)
			}
			continue
		}
		handled, ignored, stop := w.signal(fds[0].Revents, &st)
		switch {
		case stop:
			return
		case handled:
			until, recheck = time.Now().Add(w.m.cfg.MinInterval), time.Time{}
		case ignored:
			recheck = time.Now().Add(w.sig.Window())
		}
	}
}

// ceilMillis returns d in whole milliseconds, rounded up, for poll(2); at
// least 0.
func ceilMillis(d time.Duration) int {
	return int(max(0, (d+time.Millisecond-1)/time.Millisecond))
}

// signal handles the source's revents: it drains the source, checks a PSI
// event against the stall since arming and responds. handled is false
// when there was no signal to answer; ignored is set for a PSI event the
// stall since arming does not explain; stop is true when the source is
// gone.
func (w *watcher) signal(re int16, st *stretch) (handled, ignored, stop bool) {
	m := w.m
	if w.sig.Gone(re) {
		m.log.Warn("memctl: memory pressure watcher stopped: source gone", "source", w.name, "revents", re)
		return false, false, true
	}
	got := w.sig.Drain()
	switch {
	case got < 0:
		m.log.Warn("memctl: memory pressure watcher stopped: the service manager closed the socket", "source", w.name)
		return false, false, true
	case got == 0:
		return false, false, false
	}
	if since, threshold, ignore := w.sig.Unexplained(); ignore {
		m.unexplained.Add(1)
		m.log.LogAttrs(bg, slog.LevelDebug, "memctl: PSI event ignored: the stall since the trigger was armed does not explain it; looked at again a window later",
			slog.String("source", w.name), slog.Duration("stall_since_armed", since), slog.Duration("threshold", threshold))
		return false, true, false
	}
	w.respond(got, st)
	return true, false, false
}

// respond answers got signals: it counts them, opens a stretch of pressure
// if none is in progress and acts.
func (w *watcher) respond(got int64, st *stretch) {
	m := w.m
	m.signals.Add(got)
	mk := w.readMakeup()
	if !st.in {
		*st = stretch{in: true}
		w.logPressure(mk)
	}
	st.signals += got
	if m.act(w, got, mk) {
		st.acts++
	} else {
		st.left++
	}
}

// eased logs the end of a stretch of pressure, if one is in progress.
func (w *watcher) eased(st *stretch) {
	if !st.in {
		return
	}
	st.in = false
	w.m.log.LogAttrs(bg, slog.LevelInfo, "memctl: kernel memory pressure eased", slog.String("source", w.name),
		slog.Int64("signals", st.signals), slog.Int64("actions", st.acts), slog.Int64("left_to_kernel", st.left))
}

// logPressure logs the WARN that opens a stretch of pressure, with what
// the memory under pressure is made of: a figure that could not be read is
// "unknown", never -1, and own_anon_bytes (this process's RssAnon, read for
// host-wide PSI only) is left out for a cgroup's source.
func (w *watcher) logPressure(mk memsignal.Makeup) {
	attrs := []slog.Attr{slog.String("source", w.name),
		logattr.Bytes("anon_bytes", mk.Anon), logattr.Bytes("page_cache_bytes", mk.Cache)}
	if w.hostWide {
		attrs = append(attrs, logattr.Bytes("own_anon_bytes", mk.Own))
	}
	attrs = append(attrs, slog.String("makeup_from", mk.From))
	w.m.log.LogAttrs(bg, slog.LevelWarn, "memctl: kernel memory pressure", attrs...)
}

// readMakeup reads what the memory under pressure is made of. A read that
// fails or gives an unknown figure is an unknown makeup (the trim still
// passes its gate, no request is cancelled), said in one WARN naming the
// file each time the makeup turns unknown. Only the watcher's goroutine
// calls it.
func (w *watcher) readMakeup() memsignal.Makeup {
	mk, err := w.makeup()
	if err == nil && mk.Known() {
		w.makeupBad = false
		return mk
	}
	mk.Anon, mk.Cache = -1, -1
	if !w.makeupBad {
		w.makeupBad = true
		if err == nil {
			err = errors.New("active_file or inactive_file missing")
		}
		w.m.log.LogAttrs(bg, slog.LevelWarn,
			"memctl: cannot tell what the memory under pressure is made of; pressure trims still pass the trim gate, CancelLargest is held until it can",
			slog.String("source", w.name), slog.String("file", mk.From), slog.Any("error", err))
	}
	return mk
}

// close wakes the goroutine, waits for it and closes the fds.
func (w *watcher) close() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(w.wake, one[:])
	<-w.done
	_ = unix.Close(w.wake)
	w.sig.Close()
}
