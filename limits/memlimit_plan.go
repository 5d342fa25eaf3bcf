package limits

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"runtime/debug"
	"strings"

	"github.com/memctl/memctl/internal/gomemlimit"
	"github.com/memctl/memctl/internal/logattr"
)

// action is what plan leaves to apply.
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
	actNone    = iota
	actSet     // set want
	actRestore // go back to GOMEMLIMIT before memctl
)

// readPlan reads what compute decides from, each read only when needed.
// Called with m.mu held.
func (m *MemLimiter) readPlan(first bool, cur int64) planInputs {
	in := planInputs{limState: m.limState, first: first, cur: cur}
	in.f, in.probeErr = m.probe()
	if in.probeErr != nil || in.f.source == SourceNone {
		return in
	}
	in.held, in.goMapped, in.usageErr = m.usage()
	lim, _, err := screen(in)
	if err != nil {
		return in
	}
	in.boundCharges = m.boundCharges[:0]
	for _, b := range lim.bounds {
		in.boundCharges = append(in.boundCharges, m.chargeFor(in.f, b.File))
	}
	m.boundCharges = in.boundCharges
	if lim.high != noLimit {
		in.highCharge = m.chargeFor(in.f, lim.highFile)
		in.live = m.live()
	}
	return in
}

// chargeFor reads the account of file's cgroup, or on a read error the last
// one read, with the warning to give; none with the headroom off, and none
// when the cgroup has no account (the v2 root).
func (m *MemLimiter) chargeFor(f found, file string) chargeRead {
	dir := f.chargeDir(file)
	if !m.headroom || dir == "" {
		return chargeRead{}
	}
	c, err := m.charge(f.version, dir)
	if err == nil {
		m.charges[dir] = c
		if c.statErr != nil {
			err = fmt.Errorf("%w; its usage %s is subtracted instead, page cache included (GOMEMLIMIT errs low)", c.statErr, c.file)
			return chargeRead{c: c, warn: chargeWarning(dir, err)}
		}
		return chargeRead{c: c}
	}
	cr := chargeRead{c: m.charges[dir]}
	if !errors.Is(err, fs.ErrNotExist) {
		cr.warn = chargeWarning(dir, err)
	}
	return cr
}

func chargeWarning(dir string, err error) *planWarning {
	return &planWarning{key: "charge " + dir, err: fmt.Errorf("limits: the cgroup's account for the GOMEMLIMIT headroom: %w", err)}
}

// apply sets GOMEMLIMIT as a says and returns d with the value in force.
// Called with m.mu held.
func (m *MemLimiter) apply(d MemLimit, a action, cur int64, first bool) MemLimit {
	switch a.kind {
	case actRestore:
		if m.applied != 0 {
			gomemlimit.Set(m.before) // the limit is gone
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

// applyOperator keeps the operator's GOMEMLIMIT in force, except while it is
// above the smallest hard limit and m.opWrites: then own is applied. Called
// with m.mu held.
func (m *MemLimiter) applyOperator(own MemLimit, a action, first bool) MemLimit {
	over := a.kind == actSet && m.op != math.MaxInt64 && a.hardMin != noLimit && m.op > a.hardMin
	if over && m.opWrites {
		d := m.apply(own, a, m.expected(), first)
		d.Operator, d.Overridden = m.op, true
		d.Reason = fmt.Sprintf("%s (%s) is above the %s limit of %s (%s) and cannot take effect before the OOM killer: memctl sets %s until the limit rises above it again (MEMCTL_KEEP_GOMEMLIMIT=on keeps it); %s",
			m.opText, logattr.MiB(m.op), own.Source, logattr.MiB(a.hardMin), a.hardFile, logattr.MiB(d.GoMemLimit), d.Reason)
		m.warnAlways(fmt.Sprintf("operator over %s %d", a.hardFile, a.hardMin), "limits: "+d.Reason)
		return d
	}
	if m.applied != 0 {
		gomemlimit.Set(m.op) // the limit rose above it again
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
		d.Reason = fmt.Sprintf("%s (%s) is set in the environment; it is above the %s limit of %s (%s) and cannot take effect before the OOM killer, and is kept (MEMCTL_KEEP_GOMEMLIMIT)", m.opText, logattr.MiB(m.op), own.Source, logattr.MiB(a.hardMin), a.hardFile)
		m.warnAlways(fmt.Sprintf("operator over %s %d", a.hardFile, a.hardMin), "limits: "+d.Reason)
	case m.op != math.MaxInt64 && m.op > a.hardWant:
		err := fmt.Errorf("limits: %s (%s) is set in the environment and is left as set, but it leaves %s under the %s limit of %s (%s), where memctl's rule leaves %s: ratio %v of the limit (%s for what the Go runtime does not count) and %s charged outside the Go heap; "+
			"the OOM killer may act before the GC does: lower GOMEMLIMIT, or unset it and let memctl set it (%s for a limit no cgroup shows)",
			m.opText, logattr.MiB(m.op), signedMiB(d.MemoryLimit-m.op), own.Source, logattr.MiB(d.MemoryLimit), d.File, logattr.MiB(d.MemoryLimit-a.hardWant),
			own.Ratio, logattr.MiB(int64((1-own.Ratio)*float64(d.MemoryLimit))), logattr.MiB(own.Outside), declaredLimitEnv)
		d.Reason += "; " + strings.TrimPrefix(err.Error(), "limits: "+m.opText+" ")
		if m.once(fmt.Sprintf("operator headroom %s %d", d.File, d.MemoryLimit)) && m.log != nil {
			m.log.Warn("limits: GOMEMLIMIT leaves little headroom", "error", err,
				"gomemlimit", m.op, "limit", d.MemoryLimit, "limit_file", d.File,
				"headroom", d.MemoryLimit-m.op, "ratio", own.Ratio, "outside", own.Outside)
		}
	}
	return d
}

// warnAlways logs msg at WARN once per key, the first decision's included.
func (m *MemLimiter) warnAlways(key, msg string) {
	if m.once(key) && m.log != nil {
		m.log.Warn(msg)
	}
}

// once reports whether key is new, and remembers it (up to maxSeen keys).
func (m *MemLimiter) once(key string) bool {
	if m.seen[key] || len(m.seen) >= maxSeen {
		return false
	}
	m.seen[key] = true
	return true
}

// Lift adds extra bytes to the GOMEMLIMIT the limiter sets, never above the
// cgroup limit, until Lift(0), at once and at each refresh. It returns
// GOMEMLIMIT before and after, and false, changing nothing, when the limiter
// does not set GOMEMLIMIT or extra is negative.
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

// Ceiling returns the cgroup's hard memory limit GOMEMLIMIT follows, in bytes;
// 0 when the limiter sets no GOMEMLIMIT from a cgroup limit.
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

// Hold calls fn while no refresh and no Lift can set GOMEMLIMIT. fn must
// restore GOMEMLIMIT exactly before it returns and must not call the limiter.
func (m *MemLimiter) Hold(fn func()) { gomemlimit.Do(fn) }

// within reports whether a is within 1/frac of b.
func within(a, b, frac int64) bool {
	diff := a - b
	if diff < 0 {
		diff = -diff
	}
	return diff < b/frac
}
