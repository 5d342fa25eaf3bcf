package memctl

import (
	"encoding/json"
	"net/http"
	"os"
	"time"

	"github.com/memctl/memctl/internal/state"
)

// Handler returns an http.Handler that serves the state record of the
// controller of the latest Start as one JSON object, in the manner of
// expvar's /debug/vars and net/http/pprof: mount it where the service's
// debug endpoints are, for example
//
//	mux.Handle("/debug/memctl", memctl.Handler())
//
// It is the document that `memctl status -pid` reads from outside the
// process (see docs/command.md), built afresh on each request, so its
// counters are current: "gomemlimit" (bytes, null for none, source, file,
// reason), "thp", "trim" (delay, trims run and skipped, bytes released),
// "pools" (name, mode, limit_bytes), "pressure" (the source watched) and
// "c_heap"; keys are only added, never renamed. "updated" is the time of
// the request and "seq" is 0 (they number the published records). With no controller live it
// serves "closed": true and GOMEMLIMIT as it is. It answers GET and HEAD
// (405 otherwise) and registers nothing by itself. Safe for concurrent use.
//
// A browser (an Accept header that names text/html), or ?format=html, gets
// a page for people instead: the last minutes of RSS and the live heap as
// a chart, with GOMEMLIMIT, the memory limit and memory.high as lines and
// the trims, limit changes and pressure events as marks, and the record's
// figures beside it. The page is self-contained (no script, no resource
// from elsewhere; a Content-Security-Policy forbids them) and every string
// from the process is escaped, so it is safe on a debug port. Its samples
// come from the moments memctl already wakes (GC ends at most every 250
// ms, trims, limit changes, pressure): an idle process adds none.
func Handler() http.Handler { return http.HandlerFunc(serveState) }

func serveState(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "memctl: method not allowed", http.StatusMethodNotAllowed)
		return
	}
	r := current.Load().record()
	r.Version, r.PID, r.Updated = state.Version, os.Getpid(), time.Now().UTC()
	if wantsHTML(req) {
		servePage(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(r)
}
