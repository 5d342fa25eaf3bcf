package limits

import (
	"fmt"
	"math"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/gomemlimit"
)

// action is what plan leaves to apply: set want (kind actSet), go back to
// GOMEMLIMIT's value before memctl set it (actRestore), or nothing.
type action struct {
	kind       int
	want       int64 // GOMEMLIMIT memctl's rule gives
	hardWant   int64 // the most the hard limit allows, charges taken off
	hard       int64 // the hard limit followed; noLimit for memory.high alone
	hardMin    int64 // the smallest hard limit on the path; noLimit for none
	hardFile   string
	maxFile    string
	highDriven bool
	why        string // for actRestore
}

const (
	actNone = iota
	actSet
	actRestore
)

// plan reads the limit and the memory outside the Go runtime and returns
// the decision memctl's rule gives and what applying it takes; it writes
// nothing. Called with m.mu held.
func (m *MemLimiter) plan(first bool, cur int64) (MemLimit, action, error) {
	d := MemLimit{GoMemLimit: cur}
	f, err := m.probe()
	d.LimitUnknown, d.Sandbox = f.unknown, m.sandbox
	if err == nil {
		m.dir, m.version, m.files = f.dir, f.version, f.files()
	}
	if err != nil {
		d.Reason = "GOMEMLIMIT left as it was: " + err.Error()
		m.warn(first, err.Error(), err)
		return d, action{}, err
	}
	if f.source == SourceNone {
		d.Reason = f.why + "; GOMEMLIMIT left as it was"
		return d, action{kind: actRestore, why: f.why, hardMin: noLimit}, nil
	}
	// held: what this process holds that the kernel cannot reclaim
	// (RssAnon + RssShmem; see readUsage).
	held, goMapped, uerr := m.usage()
	if uerr != nil {
		held = goMapped // no /proc here: judge by the Go runtime's share alone
	}
	// limit is the hard limit when there is one (memory.max, v1's
	// limit), else memory.high alone; high is memory.high when it is
	// under the hard limit (or there is none).
	limit, file, high, highFile := f.max, f.maxFile, f.high, f.highFile
	if high != noLimit && high <= 1 {
		// 0 and 1 are not a target any process could run under: a
		// malformed file. memory.max is honoured without it.
		err := fmt.Errorf("%w: %s says %d bytes; it is not followed", ErrImplausibleLimit, highFile, high)
		if limit == noLimit {
			d.Reason = "GOMEMLIMIT left as it was: " + err.Error()
			m.warn(first, fmt.Sprintf("implausible %s %d", highFile, high), err)
			return d, action{}, err
		}
		m.warn(false, fmt.Sprintf("implausible %s %d", highFile, high), fmt.Errorf("limits: memory.high ignored: %w", err))
		high, highFile = noLimit, ""
	}
	hasHard := limit != noLimit
	if !hasHard {
		limit, file = high, highFile
	} else if high != noLimit && high >= limit {
		high, highFile = noLimit, ""
	}
	if hasHard && limit > 0 && limit <= held && !first && m.applied != 0 && f.maxFile != "" && f.maxFile == m.maxFile {
		// The hard limit memctl follows is at or under what this
		// process holds at run time: lowered (an in-place resize,
		// set-property MemoryMax=), or reached. The kernel reclaims, or
		// OOM-kills, above it, so it is honoured, not taken for a file
		// that is not this process's.
		// Said once per file, and only when the limit moved: a usage
		// at an unchanged limit is not a lowered limit.
		if limit < m.limit {
			m.warn(false, "under usage "+file, fmt.Errorf("limits: %s was lowered from %d to %d bytes, under the %d bytes this process holds (RssAnon + RssShmem): followed; the kernel reclaims or OOM-kills above it", file, m.limit, limit, held))
		}
	} else if hasHard && (limit <= 0 || limit <= held) {
		err := fmt.Errorf("%w: %s says %d bytes, but this process already holds %d bytes (RssAnon + RssShmem); GOMEMLIMIT left at %d",
			ErrImplausibleLimit, cmpString(file, f.source.String()), limit, held, cur)
		d.Reason = "GOMEMLIMIT left as it was: " + err.Error()
		m.warn(first, fmt.Sprintf("implausible %s %d", file, limit), err)
		return d, action{}, err
	}
	d.MemoryLimit, d.Ratio, d.Source, d.File = limit, m.ratio, f.source, file

	outside := int64(0)
	if m.headroom && uerr == nil {
		// Held memory below what the runtime has mapped while that grows
		// (heap mapped during a burst that the kernel has not backed yet)
		// says nothing about the memory outside it: the last estimate is
		// kept rather than dropped to 0 exactly when the heap is large.
		// Otherwise the estimate is taken afresh (it errs low by the
		// pages the runtime mapped and never touched).
		if held >= goMapped || goMapped <= m.goMapped {
			m.outside = max(held-goMapped, 0)
		}
		m.goMapped = goMapped
		outside = m.outside
	}
	// The cgroup's own account, from the cgroup whose limit applies:
	// what it is charged that the Go runtime does not hold and the kernel
	// cannot reclaim.
	goResident := min(goMapped, held)
	charged := func(cgFile string) (int64, charge) {
		dir := f.chargeDir(cgFile)
		if !m.headroom || dir == "" {
			return 0, charge{}
		}
		c, ok := m.chargeOf(f.version, dir)
		if !ok {
			return 0, charge{}
		}
		return max(c.total()-goResident, 0), c
	}
	floor := min(m.floor, limit) // never over the tightest limit
	want := int64(math.MaxInt64)
	why := f.why
	var hardCharged int64 // of the hard limit followed
	var hc charge
	if hasHard {
		// Every hard limit on the path binds: the one that leaves the
		// least once its cgroup's charge is taken off is followed (a pod's
		// limit, with sidecars charged to the pod, can leave less than
		// the container's own).
		bounds := f.bounds
		if len(bounds) == 0 {
			bounds = []cgroupfs.Bound{{Bytes: limit, File: file}}
		}
		for i, b := range bounds {
			c, cc := charged(b.File)
			w := int64(min(float64(b.Bytes)*m.ratio, math.MaxInt64)) - max(outside, c)
			if i == 0 || w < want {
				want, hardCharged, hc, limit, file = w, c, cc, b.Bytes, b.File
			}
		}
		d.Reclaimable = max(hc.reclaimable, 0)
		if f.maxFile != "" && file != f.maxFile {
			why = fmt.Sprintf("from %s (with what its cgroup is charged, it leaves less than the tighter %s)", file, f.maxFile)
		}
		d.MemoryLimit, d.File, d.Source = limit, file, f.sourceOf(file)
		d.Outside = max(outside, hardCharged)
	}
	d.Reason = fmt.Sprintf("%s ratio %v of the %s limit %s", m.ratioFrom, m.ratio, d.Source, why)
	if hasHard {
		if hardCharged > outside {
			d.Charged = hardCharged
			d.Reason += fmt.Sprintf(", minus %s charged to the cgroup that the Go runtime does not hold and the kernel cannot reclaim (%s)", inMiB(hardCharged), hc)
		} else if d.Outside > 0 {
			d.Reason += fmt.Sprintf(", minus %s outside the Go runtime", inMiB(d.Outside))
		}
		if d.Outside > limit/2 {
			m.warn(false, "headroom "+file, fmt.Errorf("limits: %s of the %s limit of %s is charged outside the Go runtime, most of it: %s", inMiB(d.Outside), inMiB(limit), file, d.Reason))
		}
		if want < floor {
			want, d.AtFloor = floor, true
			if floor < m.floor {
				d.Reason += fmt.Sprintf(", raised to the limit itself (under the floor %s): the GC will run often", inMiB(m.floor))
			} else {
				d.Reason += fmt.Sprintf(", raised to the floor %s: the GC will run often", inMiB(floor))
			}
			m.warn(false, fmt.Sprintf("floor %s %d", file, limit),
				fmt.Errorf("limits: GOMEMLIMIT at the floor %d bytes (%s): the GC will run often", want, d.Reason))
		}
	}
	// hardWant is the most memory.max allows, charges taken off; the dead
	// band below never holds GOMEMLIMIT above it.
	hardWant := want
	highDriven := false
	if high != noLimit {
		// memory.high is a target: above it the kernel throttles and
		// reclaims but kills nothing, so GOMEMLIMIT follows it down only
		// as far as the live heap allows.
		highCharged, hc := charged(highFile)
		highOut := max(outside, highCharged)
		target := int64(min(float64(high)*m.ratio, math.MaxInt64)) - highOut
		why := ""
		if hasHard {
			why = fmt.Sprintf(", toward memory.high %s (%s: the throttle limit, a target under memory.max)", inMiB(high), highFile)
		} else {
			d.Outside = highOut
		}
		if highCharged > outside {
			d.Charged = max(d.Charged, highCharged)
			why += fmt.Sprintf(", minus %s charged to its cgroup that the Go runtime does not hold and the kernel cannot reclaim (%s)", inMiB(highCharged), hc)
		} else if !hasHard && highOut > 0 {
			why += fmt.Sprintf(", minus %s outside the Go runtime", inMiB(highOut))
		}
		live := m.live()
		if liveFloor := int64(min(float64(live)*LiveHeapFactor, math.MaxInt64/2)); target < liveFloor {
			target, d.LiveFloor = liveFloor, true
			why += fmt.Sprintf(", held at %v x the live heap of %s so that GOMEMLIMIT never drives the GC into a spiral", LiveHeapFactor, inMiB(live))
		}
		// Above memory.high the kernel throttles, it does not kill: the
		// floor is capped by the hard limit only.
		tfloor := m.floor
		if hasHard {
			tfloor = floor
		}
		if target < tfloor {
			target = tfloor
			why += fmt.Sprintf(", held at the floor %s", inMiB(tfloor))
		}
		if target < want {
			want, highDriven, d.AtFloor = target, true, false
			d.High, d.HighFile = high, highFile
			d.Reason += why
		}
	}
	if m.lift > 0 {
		// The lift ends at the limit less what the cgroup is charged
		// outside the Go runtime (a lift to the limit itself with 300 MiB
		// of tmpfs in a 512 MiB cgroup was an OOM kill); want and the lift
		// capped at limit (under 2^62) cannot overflow:
		// Lift(math.MaxInt64) means all the way up.
		lift := min(m.lift, max(limit-d.Outside-want, 0))
		want += lift
		hardWant = min(hardWant, math.MaxInt64-lift) + lift
		d.Reason += fmt.Sprintf(", lifted by %s (death spiral)", inMiB(lift))
	}
	d.GoMemLimit = want
	// hard is the limit a change of which is followed at once: memory.max
	// (or v1's), not a memory.high alone.
	hard, hardMin := limit, int64(noLimit)
	if !hasHard {
		hard = noLimit
	}
	for _, b := range f.bounds {
		if b.Bytes != noLimit && (hardMin == noLimit || b.Bytes < hardMin) {
			hardMin = b.Bytes
		}
	}
	if hasHard && hardMin == noLimit {
		hardMin = limit
	}
	return d, action{kind: actSet, want: want, hardWant: hardWant, hard: hard, hardMin: hardMin,
		hardFile: file, maxFile: f.maxFile, highDriven: highDriven}, nil
}

// apply sets GOMEMLIMIT as a says and returns d with the value in force.
// Hysteresis: a memory.high that falls step by step (a proactive reclaim
// agent) is followed in steps of at least 1/20 of GOMEMLIMIT, not at each
// refresh; the hard limit is followed at once, and the value held is never
// over what it allows (hardWant: a memory.high just under memory.max, and
// more charged outside the Go runtime, lowers both). Called with m.mu held.
func (m *MemLimiter) apply(d MemLimit, a action, cur int64, first bool) MemLimit {
	switch a.kind {
	case actRestore:
		if m.applied != 0 {
			// The limit memctl followed is gone (a resize to no limit):
			// back to what GOMEMLIMIT was before memctl set it.
			gomemlimit.Set(m.before)
			noteMemLimitSet()
			m.info(fmt.Sprintf("limits: GOMEMLIMIT %d (was %d), as before memctl set it: %s", m.before, cur, a.why))
			d.GoMemLimit, d.Reason = m.before, a.why+"; GOMEMLIMIT back to its value before memctl set it"
			m.applied, m.limit, m.maxFile = 0, 0, ""
		}
		return d
	case actNone:
		return d
	}
	falling := a.highDriven && m.applied != 0 && a.hard == m.limit && a.want < m.applied && m.applied-a.want < m.applied/20 && m.applied <= a.hardWant
	if !falling && (m.applied == 0 || a.hard != m.limit || !within(a.want, m.applied, 100)) {
		prev := gomemlimit.Set(a.want)
		noteMemLimitSet()
		if m.applied == 0 {
			m.before = prev
		}
		if !first && prev != a.want {
			m.info(fmt.Sprintf("limits: GOMEMLIMIT %d (was %d): %s", a.want, prev, d.Reason))
		}
		m.applied, m.limit, m.maxFile = a.want, a.hard, a.maxFile
	} else {
		d.GoMemLimit = m.applied // moved by less than 1% (5% down toward memory.high): left as it is
	}
	return d
}

// applyOperator keeps the operator's GOMEMLIMIT in force, except while it
// is above the smallest hard limit and memctl may write (see
// MemLimitConfig.KeepOperator): then memctl's own value d is applied, and
// the operator's comes back when the limit rises above it again. The
// result says which is in force. Called with m.mu held.
func (m *MemLimiter) applyOperator(own MemLimit, a action, first bool) MemLimit {
	over := a.kind == actSet && m.op != math.MaxInt64 && a.hardMin != noLimit && m.op > a.hardMin
	if over && m.opWrites {
		d := m.apply(own, a, m.expected(), first)
		d.Operator, d.Overridden = m.op, true
		d.Reason = fmt.Sprintf("%s (%s) is above the %s limit of %s (%s) and cannot take effect before the OOM killer: memctl sets %s until the limit rises above it again (MEMCTL_KEEP_GOMEMLIMIT=on keeps it); %s",
			m.opText, inMiB(m.op), own.Source, inMiB(a.hardMin), a.hardFile, inMiB(d.GoMemLimit), d.Reason)
		m.warnAlways(fmt.Sprintf("operator over %s %d", a.hardFile, a.hardMin), "limits: "+d.Reason)
		return d
	}
	if m.applied != 0 {
		// The limit rose above the operator's value again: back to it.
		gomemlimit.Set(m.op)
		noteMemLimitSet()
		m.info(fmt.Sprintf("limits: GOMEMLIMIT back to the operator's %s (%d bytes): the hard limit %d (%s) is above it again", m.opText, m.op, a.hardMin, a.hardFile))
		m.applied, m.limit, m.maxFile = 0, 0, ""
	}
	d := MemLimit{GoMemLimit: m.op, Source: SourceEnv, Operator: m.op, Sandbox: own.Sandbox, LimitUnknown: own.LimitUnknown,
		Reason: m.opText + " is set in the environment"}
	if strings.HasPrefix(m.opText, "AUTOMEMLIMIT") {
		d.Operator = 0
	}
	if a.kind != actSet {
		return d
	}
	d.MemoryLimit, d.Ratio, d.File, d.High, d.HighFile = own.MemoryLimit, own.Ratio, own.File, own.High, own.HighFile
	d.Outside, d.Charged = own.Outside, own.Charged
	switch {
	case over:
		d.Reason = fmt.Sprintf("%s (%s) is set in the environment; it is above the %s limit of %s (%s) and cannot take effect before the OOM killer, and is kept (MEMCTL_KEEP_GOMEMLIMIT)", m.opText, inMiB(m.op), own.Source, inMiB(a.hardMin), a.hardFile)
		m.warnAlways(fmt.Sprintf("operator over %s %d", a.hardFile, a.hardMin), "limits: "+d.Reason)
	case m.op != math.MaxInt64 && m.op > a.hardWant:
		// At or near the limit, leaving less than memctl's rule would:
		// said at WARN once per limit.
		err := fmt.Errorf("limits: %s (%s) is set in the environment and is left as set, but it leaves %s under the %s limit of %s (%s), where memctl's rule leaves %s: ratio %v of the limit (%s for what the Go runtime does not count) and %s charged outside the Go heap; "+
			"the OOM killer may act before the GC does: lower GOMEMLIMIT, or unset it and let memctl set it (%s for a limit no cgroup shows)",
			m.opText, inMiB(m.op), signedMiB(d.MemoryLimit-m.op), own.Source, inMiB(d.MemoryLimit), d.File, inMiB(d.MemoryLimit-a.hardWant),
			own.Ratio, inMiB(int64((1-own.Ratio)*float64(d.MemoryLimit))), inMiB(own.Outside), declaredLimitEnv)
		d.Reason += "; " + strings.TrimPrefix(err.Error(), "limits: "+m.opText+" ")
		if key := fmt.Sprintf("operator headroom %s %d", d.File, d.MemoryLimit); !m.seen[key] && len(m.seen) < maxSeen {
			m.seen[key] = true
			if m.log != nil {
				m.log.Warn("limits: GOMEMLIMIT leaves little headroom", "error", err,
					"gomemlimit", m.op, "limit", d.MemoryLimit, "limit_file", d.File,
					"headroom", d.MemoryLimit-m.op, "ratio", own.Ratio, "outside", own.Outside)
			}
		}
	}
	return d
}

// warnAlways logs msg at WARN once per key, the first decision's included.
func (m *MemLimiter) warnAlways(key, msg string) {
	if m.seen[key] || len(m.seen) >= maxSeen {
		return
	}
	m.seen[key] = true
	if m.log != nil {
		m.log.Warn(msg)
	}
}

// Lift adds extra bytes to the GOMEMLIMIT the limiter sets, never above
// the cgroup limit, from now until Lift(0), re-applying GOMEMLIMIT at once;
// the refresh keeps the lift, so a lift is not mistaken for the program
// taking GOMEMLIMIT over. It is how package pressure lifts GOMEMLIMIT during
// a GC death spiral while the limit is refreshed. It returns GOMEMLIMIT
// before and after, and false (changing nothing) when the limiter does not
// set GOMEMLIMIT (the operator's, no cgroup limit, stopped, closed) or
// extra is negative. Safe for concurrent use.
func (m *MemLimiter) Lift(extra int64) (from, to int64, ok bool) {
	if m == nil || extra < 0 {
		return 0, 0, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.on || m.stopped || m.applied == 0 {
		return 0, 0, false
	}
	from = debug.SetMemoryLimit(-1)
	m.lift = extra
	d, err := m.decide(false)
	if err != nil || m.stopped {
		m.lift = 0
		return from, debug.SetMemoryLimit(-1), false
	}
	return from, d.GoMemLimit, true
}

// Ceiling returns the cgroup's hard memory limit GOMEMLIMIT follows, the
// ceiling of a lift, in bytes; 0 when the limiter sets no GOMEMLIMIT from
// a cgroup limit. Safe for concurrent use.
func (m *MemLimiter) Ceiling() int64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if src := m.Last().Source; m.applied == 0 || m.stopped || m.limit <= 0 || src != SourceCgroupV1 && src != SourceCgroupV2 {
		return 0
	}
	return m.limit
}

// Hold calls fn while no refresh and no Lift can set GOMEMLIMIT, and
// returns when fn does: a caller that lowers GOMEMLIMIT for a moment does
// it through the limiter (the trim's Go step holds internal/gomemlimit).
// fn must restore GOMEMLIMIT exactly before it returns, so that the
// refresh does not take the transient value for the program's; a refresh
// due meanwhile runs at a later GC end, a Lift waits. On a nil
// *MemLimiter fn is called directly. Safe for concurrent use; fn must not
// call the limiter's methods.
func (m *MemLimiter) Hold(fn func()) { gomemlimit.Do(fn) }

// within reports whether a is within 1/frac of b.
func within(a, b, frac int64) bool {
	diff := a - b
	if diff < 0 {
		diff = -diff
	}
	return diff < b/frac
}

func cmpString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func inMiB(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB" }
