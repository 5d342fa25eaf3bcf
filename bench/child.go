package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/memctl/memctl/internal/burst"
	"github.com/memctl/memctl/internal/trimwire"

	"github.com/memctl/memctl"
	"github.com/memctl/memctl/limits"
)

// Environment of a child process: the scenario and arm it runs
// ("burst/plain"), and the scenario parameters as JSON.
const (
	childEnv  = "MEMCTL_BENCH_CHILD"
	paramsEnv = "MEMCTL_BENCH_PARAMS"
)

// arm is one configuration of the scenario binary.
type arm struct {
	Key   string `json:"key"`
	Label string `json:"label"`
	Desc  string `json:"description"`
}

// arms are run in this order, interleaved (scenario.runs picks them).
var arms = []arm{
	{"plain", "plain", "Go defaults: no GOMEMLIMIT, no trim"},
	{"gomemlimit", "GOMEMLIMIT only", "limits.SetGoMemLimit alone (90% of the cgroup limit, less memory outside the Go runtime)"},
	{"memctl", "memctl", "memctl.Start() with defaults; AfterBurst after each burst; the budget middleware in http"},
	{"memctl-aa", "memctl (A/A)", "identical to memctl, run as a separate arm: the noise floor"},
	{"freeos", "plain + FreeOSMemory", "Go defaults; debug.FreeOSMemory one trim delay (memctl's, 2 s unless -trim-delay) after each burst: what the runtime itself returns; burst only"},
}

// defaultArms are every arm but freeos, the burst target's control.
var defaultArms = []string{"plain", "gomemlimit", "memctl", "memctl-aa"}

var burstArms = append(slices.Clip(defaultArms), "freeos")

func armByKey(key string) (arm, bool) {
	return find(arms, func(a arm) bool { return a.Key == key })
}

func (a arm) memctl() bool { return a.Key == "memctl" || a.Key == "memctl-aa" }

// childResult is what a child reports on its last line, after "result ".
type childResult struct {
	GoMemLimit int64 `json:"gomemlimit"` // bytes; math.MaxInt64: none
	// Trims and TrimTime are the trims memctl ran in the window and their
	// total duration, from "trim: done" records (0 without memctl); TrimCPU
	// is Stats().Trim.TotalCPU, TrimSpans their intervals.
	Trims     int64         `json:"trims"`
	TrimTime  time.Duration `json:"trim_time"`
	TrimCPU   time.Duration `json:"trim_cpu"`
	TrimSpans []span        `json:"trim_spans,omitempty"`
	Elapsed   time.Duration `json:"elapsed"` // the measured window
	// Extra are the figures the child measured, by key; runOne adds them to
	// the parent's.
	Extra map[string]float64 `json:"extra,omitempty"`
}

// childMain runs one arm of one scenario ("scenario/arm") and returns the
// exit status. It prints "ready", waits for "go", runs, prints "end", waits
// for stdin to close and prints "result {json}".
func childMain(spec string) int {
	if err := runChild(spec, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", spec+":", err)
		return 1
	}
	return 0
}

func runChild(spec string, stdin io.Reader, stdout io.Writer) error {
	name, armKey, _ := strings.Cut(spec, "/")
	sc, ok := scenarioByName(name)
	if !ok {
		return fmt.Errorf("unknown scenario %q", name)
	}
	a, ok := armByKey(armKey)
	if !ok {
		return fmt.Errorf("unknown arm %q", armKey)
	}
	var p params
	if err := json.Unmarshal([]byte(os.Getenv(paramsEnv)), &p); err != nil {
		return fmt.Errorf("%s: %w", paramsEnv, err)
	}
	if sc.setup != nil {
		sc.setup(p)
	}
	st, err := setupArm(a, p)
	if err != nil {
		return err
	}
	defer st.close()
	c := &childIO{in: bufio.NewScanner(stdin), out: stdout}
	res, err := sc.child(p, st, c)
	if err != nil {
		return err
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return c.say("result " + string(b))
}

// childIO is the child's side of the protocol.
type childIO struct {
	in  *bufio.Scanner
	out io.Writer
}

func (c *childIO) say(line string) error {
	_, err := fmt.Fprintln(c.out, line)
	return err
}

// handshake says "ready" and waits for "go".
func (c *childIO) handshake() error {
	if err := c.say("ready"); err != nil {
		return err
	}
	if !c.in.Scan() {
		return fmt.Errorf("waiting for %q: stdin closed: %v", "go", c.in.Err())
	}
	if got := c.in.Text(); got != "go" {
		return fmt.Errorf("waiting for %q: got %q", "go", got)
	}
	return nil
}

// end says "end" and waits until the parent closes stdin: the window is
// over.
func (c *childIO) end() error {
	if err := c.say("end"); err != nil {
		return err
	}
	for c.in.Scan() {
	}
	return nil
}

// armState is what an arm set up in the child.
type armState struct {
	arm  arm
	ctl  *memctl.Controller
	log  *trimLog
	pool *limits.Pool
	// freeOSDelay is, in the freeos arm, when debug.FreeOSMemory runs
	// after each burst; close stops the timers.
	freeOSDelay time.Duration
	mu          sync.Mutex
	timers      []*time.Timer
}

// setupArm applies the arm's configuration to this process.
func setupArm(a arm, p params) (*armState, error) {
	st := &armState{arm: a}
	switch {
	case a.Key == "gomemlimit":
		if _, err := limits.SetGoMemLimit(context.Background(), limits.MemLimitConfig{}); err != nil {
			return nil, err
		}
	case a.Key == "freeos":
		st.freeOSDelay = cmp.Or(p.TrimDelay, trimwire.DefaultDelay)
	case a.memctl():
		st.log = &trimLog{trims: new(trims), next: slog.NewTextHandler(os.Stderr, nil)}
		opts := []memctl.Option{memctl.WithLogger(slog.New(st.log))}
		if p.TrimDelay > 0 {
			opts = append(opts, memctl.WithTrimDelay(p.TrimDelay))
		}
		ctl, err := memctl.Start(opts...)
		if err != nil {
			ctl.Close()
			return nil, err // a part failed: the arm would not be memctl's defaults
		}
		st.ctl = ctl
	}
	return st, nil
}

// afterBurst is the arm's reaction to the end of a burst.
func (st *armState) afterBurst() {
	if st.freeOSDelay > 0 {
		st.mu.Lock()
		st.timers = append(st.timers, time.AfterFunc(st.freeOSDelay, debug.FreeOSMemory))
		st.mu.Unlock()
		return
	}
	st.ctl.AfterBurst()
}

func (st *armState) close() {
	if st.pool != nil {
		st.pool.Close()
	}
	st.mu.Lock()
	for _, t := range st.timers {
		t.Stop()
	}
	st.mu.Unlock()
	st.ctl.Close()
}

// snapshot fills the result's GOMEMLIMIT and trim figures, as of now.
func (st *armState) snapshot(r *childResult) error {
	r.GoMemLimit = debug.SetMemoryLimit(-1)
	if st.log == nil {
		return nil
	}
	// The trimmer counts a trim before it logs it: wait for the log to
	// catch up with the counter.
	for range 100 {
		spans := st.log.get()
		if s := st.ctl.Stats().Trim; s.Trims == int64(len(spans)) {
			r.Trims, r.TrimCPU, r.TrimSpans = s.Trims, s.TotalCPU, spans
			for _, sp := range spans {
				r.TrimTime += time.Duration(sp[1] - sp[0])
			}
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("counted %d \"trim: done\" records, Stats says %d trims", len(st.log.get()), st.ctl.Stats().Trim.Trims)
}

// trimLog records the interval of each DEBUG "trim: done" record and passes
// INFO and above to next; the handlers WithAttrs and WithGroup derive share
// its trims.
type trimLog struct {
	*trims
	next slog.Handler
}

type trims struct {
	mu    sync.Mutex
	spans []span
}

// get returns a copy of the trims' intervals.
func (t *trims) get() []span {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.spans)
}

func (h *trimLog) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelDebug
}

func (h *trimLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message != "trim: done" {
		if r.Level < slog.LevelInfo {
			return nil
		}
		return h.next.Handle(ctx, r)
	}
	var took slog.Value
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "took" {
			took = a.Value
		}
		return a.Key != "took"
	})
	if took.Kind() != slog.KindDuration {
		return errors.New("bench: \"trim: done\" record without a took duration")
	}
	end := cmp.Or(r.Time, time.Now()) // when the trimmer logged it: just after the trim
	h.mu.Lock()
	h.spans = append(h.spans, span{end.Add(-took.Duration()).UnixNano(), end.UnixNano()})
	h.mu.Unlock()
	return nil
}

func (h *trimLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &trimLog{h.trims, h.next.WithAttrs(as)}
}

func (h *trimLog) WithGroup(g string) slog.Handler {
	return &trimLog{h.trims, h.next.WithGroup(g)}
}

// holdLive allocates the live set of n bytes and lets it settle.
func holdLive(n int64) [][]byte {
	live := burst.Alloc(n)
	time.Sleep(settle)
	return live
}

// settle is the pause after building the live set.
const settle = 300 * time.Millisecond
