package memctl

import (
	"encoding/json"
	"net/http"
	"os"
	"time"

	"github.com/memctl/memctl/internal/state"
)

// Handler returns an http.Handler that serves the state record of the
// controller of the latest Start as one JSON object, as expvar's /debug/vars:
//
//	mux.Handle("/debug/memctl", memctl.Handler())
//
// It is the document `memctl status -pid` reads (docs/command.md); keys are
// only added. With no controller live it serves "closed": true. It answers GET
// and HEAD (405 otherwise). A browser (Accept names text/html), or
// ?format=html, gets a page without script instead (docs/observing.md). Safe
// for concurrent use.
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
