package pressure

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"time"

	"golang.org/x/sys/unix"

	"github.com/memctl/memctl/internal/logattr"
)

// procPressure is the system-wide memory PSI file (Linux 4.20 and later,
// CONFIG_PSI).
const procPressure = "/proc/pressure/memory"

// watcher is the kernel watcher: one goroutine blocked in poll(2) on the
// source and on wake, an eventfd that close writes to.
type watcher struct {
	m        *Monitor
	sig      *signal
	name     string
	note     string // why the process's own cgroup is not watched (SourceNote)
	hostWide bool   // the system-wide PSI: the host's pressure
	// makeup reads what the memory is made of; makeupBad: it cannot now.
	makeup    func() (makeup, error)
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

// run is the watcher's goroutine. On a signal it acts, then ignores the
// source for MinInterval, then looks again: signals latched meanwhile (the
// eventfd counter, the PSI event flag) give one more action. An unexplained
// PSI event gets one more look a window later (recheck): the kernel sends no
// event for a window after one, so a real stall just after would be missed.
func (w *watcher) run() {
	defer close(w.done)
	fds := []unix.PollFd{w.sig.pollFd(), {Fd: int32(w.wake), Events: unix.POLLIN}}
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
				if _, _, ignore := w.sig.unexplained(); !ignore {
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
			recheck = time.Now().Add(w.sig.window())
		}
	}
}

// ceilMillis returns d in whole milliseconds, rounded up, at least 0.
func ceilMillis(d time.Duration) int {
	return int(max(0, (d+time.Millisecond-1)/time.Millisecond))
}

// signal drains the source, checks a PSI event against the stall since arming
// and responds. handled: a signal was answered; ignored: a PSI event the stall
// does not explain; stop: the source is gone.
func (w *watcher) signal(re int16, st *stretch) (handled, ignored, stop bool) {
	m := w.m
	if w.sig.gone(re) {
		m.log.Warn("memctl: memory pressure watcher stopped: source gone", "source", w.name, "revents", re)
		return false, false, true
	}
	got := w.sig.drain()
	switch {
	case got < 0:
		m.log.Warn("memctl: memory pressure watcher stopped: the service manager closed the socket", "source", w.name)
		return false, false, true
	case got == 0:
		return false, false, false
	}
	if since, threshold, ignore := w.sig.unexplained(); ignore {
		m.unexplained.Add(1)
		m.log.LogAttrs(bg, slog.LevelDebug, "memctl: PSI event ignored: the stall since the trigger was armed does not explain it; looked at again a window later",
			slog.String("source", w.name), slog.Duration("stall_since_armed", since), slog.Duration("threshold", threshold))
		return false, true, false
	}
	w.respond(got, st)
	return true, false, false
}

// respond counts got signals, opens a stretch of pressure if needed and acts.
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

// logPressure logs the WARN that opens a stretch of pressure, with the memory's
// makeup ("unknown", never -1); own_anon_bytes is for host-wide PSI only.
func (w *watcher) logPressure(mk makeup) {
	attrs := []slog.Attr{slog.String("source", w.name),
		logattr.Bytes("anon_bytes", mk.Anon), logattr.Bytes("page_cache_bytes", mk.Cache)}
	if w.hostWide {
		attrs = append(attrs, logattr.Bytes("own_anon_bytes", mk.Own))
	}
	attrs = append(attrs, slog.String("makeup_from", mk.From))
	w.m.log.LogAttrs(bg, slog.LevelWarn, "memctl: kernel memory pressure", attrs...)
}

// readMakeup reads the memory's makeup; a failure is an unknown makeup, with
// one WARN naming the file each time it turns unknown. Watcher goroutine only.
func (w *watcher) readMakeup() makeup {
	mk, err := w.makeup()
	if err == nil && mk.known() {
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
	w.sig.close()
}
