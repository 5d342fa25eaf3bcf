package memctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memctl/memctl/internal/plot"
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
	r.Version, r.Updated = state.Version, time.Now().UTC()
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

// wantsHTML reports whether Accept names text/html or ?format=html.
func wantsHTML(req *http.Request) bool {
	if f := req.URL.Query().Get("format"); f != "" {
		return f == "html"
	}
	return strings.Contains(req.Header.Get("Accept"), "text/html")
}

// pageTemplate is the page; html/template escapes, and plot's SVG escapes its own.
var pageTemplate = template.Must(template.New("memctl").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>memctl</title>
<style>body{font-family:sans-serif;margin:1em}td{padding:0 1em 0 0;vertical-align:top}td:first-child{color:#555}</style>
</head><body>
<h1>memctl, process {{.PID}}</h1>
<p>{{.Summary}}</p>
{{.Chart}}
<table>{{range .Rows}}<tr><td>{{.K}}</td><td>{{.V}}</td></tr>{{end}}</table>
</body></html>
`))

type pageRow struct{ K, V string }

// servePage writes the page for the live controller's record r.
func servePage(w http.ResponseWriter, r *state.Record) {
	var entries []historyEntry
	var high int64
	if c := current.Load(); c != nil {
		entries, high = c.hist.Entries(), c.MemLimit().High
	}
	var svg bytes.Buffer
	_ = historyChart(entries, r, high).WriteSVG(&svg)
	data := struct {
		PID     int
		Summary string
		Chart   template.HTML
		Rows    []pageRow
	}{r.PID, "No memctl controller is live.", template.HTML(svg.String()), recordRows(r)}
	if !r.Closed {
		data.Summary = fmt.Sprintf("The last %d moments memctl woke at (GC ends, trims, limit changes, pressure), as of %s.",
			len(entries), r.Updated.Format(time.RFC3339))
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	_ = pageTemplate.Execute(w, data)
}

// historyChart draws RSS and the live heap (MiB), limits and events.
func historyChart(entries []historyEntry, r *state.Record, high int64) *plot.Chart {
	c := &plot.Chart{Title: "RSS and live heap", XLabel: "seconds before now", YLabel: "MiB"}
	if len(entries) == 0 {
		return c
	}
	newest := entries[len(entries)-1].At
	rss, live := plot.Series{Name: "RSS"}, plot.Series{Name: "live heap"}
	for _, e := range entries {
		x := -newest.Sub(e.At).Seconds()
		if e.RSS >= 0 {
			rss.Points = append(rss.Points, plot.Point{X: x, Y: mib(e.RSS)})
		}
		live.Points = append(live.Points, plot.Point{X: x, Y: mib(e.Live)})
		if e.Kind != kindGCEnd {
			c.Marks = append(c.Marks, plot.Mark{Label: e.Kind.String(), X: x})
		}
	}
	c.Series = []plot.Series{rss, live}
	if g := r.GoMemLimit.Bytes; g != nil {
		c.Lines = append(c.Lines, plot.Line{Label: "GOMEMLIMIT", Y: mib(*g)})
	}
	if m := r.GoMemLimit.MemoryLimitBytes; m > 0 {
		c.Lines = append(c.Lines, plot.Line{Label: "memory limit", Y: mib(m)})
	}
	if high > 0 {
		c.Lines = append(c.Lines, plot.Line{Label: "memory.high", Y: mib(high)})
	}
	return c
}

func mib(b int64) float64 {
	if b == math.MaxInt64 {
		return math.NaN()
	}
	return float64(b) / (1 << 20)
}

// recordRows flattens the record, as its JSON names it, into sorted rows.
func recordRows(r *state.Record) []pageRow {
	b, err := json.Marshal(r)
	if err != nil {
		return nil
	}
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // bytes as written, not as floats
	if dec.Decode(&doc) != nil {
		return nil
	}
	var rows []pageRow
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				walk(strings.TrimPrefix(prefix+"."+k, "."), x)
			}
		case []any:
			for i, x := range v {
				walk(fmt.Sprintf("%s[%d]", prefix, i), x)
			}
		case nil:
			rows = append(rows, pageRow{prefix, "none"})
		default:
			rows = append(rows, pageRow{prefix, fmt.Sprint(v)})
		}
	}
	walk("", doc)
	sort.Slice(rows, func(i, j int) bool { return rows[i].K < rows[j].K })
	return rows
}

// eventKind says what a historyEntry records.
type eventKind uint8

const (
	kindGCEnd    eventKind = iota // a GC cycle ended
	kindTrim                      // a trim ran or was skipped
	kindLimit                     // GOMEMLIMIT or the memory limit changed
	kindPressure                  // kernel memory pressure, or a death spiral
)

func (k eventKind) String() string {
	if names := [...]string{"gc", "trim", "limit", "pressure"}; int(k) < len(names) {
		return names[k]
	}
	return "gc"
}

// historyEntry is one moment of the /debug/memctl page's history: RSS
// (bytes, -1 unknown), the live heap at the last GC end and GOMEMLIMIT.
type historyEntry struct {
	At         time.Time
	Kind       eventKind
	RSS        int64
	Live       int64
	GoMemLimit int64
}

// historySize is how many entries a ring keeps: at most one GC end every
// historyGap, so three minutes of a busy process, more of a quiet one.
const (
	historySize = 720
	historyGap  = 250 * time.Millisecond
)

// historyRing is a controller's history, recorded when memctl already wakes
// (GC ends, trims, limit changes, pressure): no timer, no goroutine, and
// recording allocates nothing. The zero value is ready; safe for concurrent
// use.
type historyRing struct {
	live   atomic.Int64 // the live heap of the last GC end
	lastGC atomic.Int64 // when the last GC-end entry was made, Unix ns; 0 none

	mu    sync.Mutex
	e     [historySize]historyEntry
	n     int      // entries added, ever
	statm *os.File // /proc/self/statm, opened at the first read; nil if it cannot be
	tried bool
	buf   [128]byte
}

// GCEnd records a GC end; within historyGap of the last only the live heap
// is kept.
func (r *historyRing) GCEnd(t time.Time, live, gomemlimit int64) {
	r.live.Store(live)
	ns := t.UnixNano()
	if last := r.lastGC.Load(); last != 0 && ns-last < int64(historyGap) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastGC.Store(ns)
	r.add(historyEntry{At: t, Kind: kindGCEnd, RSS: r.rss(), Live: live, GoMemLimit: gomemlimit})
}

// Mark records an event of kind k at t, with RSS read now.
func (r *historyRing) Mark(t time.Time, k eventKind, gomemlimit int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.add(historyEntry{At: t, Kind: k, RSS: r.rss(), Live: r.live.Load(), GoMemLimit: gomemlimit})
}

// Entries returns the entries recorded, oldest first.
func (r *historyRing) Entries() []historyEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []historyEntry
	for i := max(0, r.n-historySize); i < r.n; i++ {
		out = append(out, r.e[i%historySize])
	}
	return out
}

// Close closes the file the ring reads RSS from.
func (r *historyRing) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.statm != nil {
		r.statm.Close()
		r.statm = nil
	}
}

func (r *historyRing) add(e historyEntry) {
	r.e[r.n%historySize] = e
	r.n++
}

// rss returns RSS in bytes from /proc/self/statm (proc(5)), -1 when
// unreadable, from a file kept open and a fixed buffer. r.mu held.
func (r *historyRing) rss() int64 {
	if !r.tried {
		r.tried = true
		r.statm, _ = os.Open("/proc/self/statm")
	}
	if r.statm == nil {
		return -1
	}
	n, err := r.statm.ReadAt(r.buf[:], 0)
	if n == 0 && err != nil {
		return -1
	}
	return parseStatm(r.buf[:n])
}

// parseStatm returns a statm line's resident size (its second field) in
// bytes, -1 if malformed.
func parseStatm(b []byte) int64 {
	_, rest, ok := bytes.Cut(bytes.TrimSuffix(b, []byte("\n")), []byte(" "))
	field, _, _ := bytes.Cut(rest, []byte(" "))
	pages, err := strconv.ParseUint(string(field), 10, 63)
	if !ok || err != nil {
		return -1
	}
	return int64(pages) * int64(os.Getpagesize())
}
