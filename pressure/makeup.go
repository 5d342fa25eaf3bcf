package pressure

import (
	"time"

	"github.com/memctl/memctl/internal/memsignal"
)

// response is what to do on a signal: act (a trim through its gate and the
// event) and cancel the largest request.
type response struct{ act, cancel bool }

// respond decides the response to a signal whose memory is mk
// (docs/pressure.md). A cgroup's memory known to be mostly page cache is left
// to the kernel; an unknown makeup asks for the trim, whose gate decides. A
// request is cancelled only for memory known mostly anonymous and, host-wide,
// mostly this process's.
func respond(mk memsignal.Makeup, hostWide bool) response {
	anon := mk.Anonymous()
	if mk.Known() && !anon && !hostWide {
		return response{}
	}
	return response{act: true, cancel: anon && (!hostWide || mk.OwnsHostAnon())}
}

// act answers signals of w whose memory is mk (respond), and reports
// whether it acted.
func (m *Monitor) act(w *watcher, signals int64, mk memsignal.Makeup) bool {
	r := respond(mk, w.hostWide)
	if !r.act {
		m.leftToKernel.Add(1)
		return false
	}
	m.acted.Add(1)
	m.deps.trim()
	if r.cancel {
		m.deps.cancel()
	} else {
		m.held.Add(1)
	}
	e := Event{Kind: KindKernel, Time: time.Now(), Source: w.name, Signals: signals}
	e.Makeup = mk
	m.publish(e)
	return true
}
