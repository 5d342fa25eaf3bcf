package memctl

import (
	"encoding/json"
	"net/http"
	"os"
	"time"

	"github.com/memctl/memctl/internal/state"
)

// Handler returns an http.Handler that serves the state record of the
// controller of the latest Start as one JSON object, built afresh on each
// request, in the manner of expvar's /debug/vars:
//
//	mux.Handle("/debug/memctl", memctl.Handler())
//
// It is the document `memctl status -pid` reads from outside the process
// (docs/command.md); keys are only added, never renamed. With no controller
// live it serves "closed": true and GOMEMLIMIT as it is. It answers GET and
// HEAD (405 otherwise) and registers nothing by itself. A browser (Accept names
// text/html), or ?format=html, gets a self-contained page for people instead,
// with no script and every string escaped (docs/observing.md). Safe for
// concurrent use.
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
