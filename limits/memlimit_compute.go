package limits

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/memctl/memctl/internal/cgroupfs"
	"github.com/memctl/memctl/internal/logattr"
)

// limState is the limiter's state a decision starts from; compute returns
// it moved on (the probe's directory and files, the estimate of memory
// outside the Go runtime, the Reason's buffer), apply moves applied on.
type limState struct {
	ratio      float64
	ratioFrom  string
	floor      int64
	lift       int64 // bytes added over the decision while lifted (Lift)
	headroom   bool
	sandbox    string   // detectSandbox, read once
	applied    int64    // GOMEMLIMIT memctl set last; 0: none yet
	limit      int64    // the limit behind applied
	maxFile    string   // the hard limit's file behind applied ("" for none)
	outside    int64    // the last estimate of memory outside the Go runtime
	mappedThen int64    // what the Go runtime had mapped at that estimate
	dir        string   // the cgroup directory the last probe read ("" for none)
	version    int      // its cgroup version
	files      []string // the files the last decision came from (bounds, memory.high)
	fileBuf    []string // appendFiles' buffer
	said       string   // the last Reason, returned again when the same
	reason     []byte   // the buffer Reason is written in
}

// planInputs is everything compute decides from, as readPlan read it.
type planInputs struct {
	limState
	first bool  // the decision of NewMemLimiter
	cur   int64 // GOMEMLIMIT in force

	f              found
	probeErr       error
	held, goMapped int64 // m.usage's, read only when the probe found a limit
	usageErr       error
	boundCharges   []chargeRead // the accounts of planLimits.bounds' cgroups
	highCharge     chargeRead   // memory.high's cgroup's
	live           int64        // the live heap; read only when memory.high is followed
}

// chargeRead is one chargeFor: the account and the warning to give.
type chargeRead struct {
	c    charge // zero when there is no account
	warn *planWarning
}

// planWarning is the arguments of one m.warn.
type planWarning struct {
	key   string
	err   error
	first bool
}

// planResult is compute's answer: the decision, its action and error, the
// warnings in order, and the limiter's state moved on.
type planResult struct {
	d     MemLimit
	a     action
	err   error
	warns []planWarning
	st    limState
}

// compute is plan's decision by memctl's rule (see decide); it is pure.
func compute(in planInputs) planResult {
	r := planResult{st: in.limState, d: MemLimit{GoMemLimit: in.cur, LimitUnknown: in.f.unknown, Sandbox: in.sandbox}}
	if err := in.probeErr; err != nil {
		r.d.Reason = "GOMEMLIMIT left as it was: " + err.Error()
		r.warns, r.err = []planWarning{{key: err.Error(), err: err, first: in.first}}, err
		return r
	}
	r.st.dir, r.st.version = in.f.dir, in.f.version
	r.st.fileBuf = in.f.appendFiles(in.fileBuf[:0])
	if !slices.Equal(r.st.fileBuf, in.files) {
		r.st.files = slices.Clone(r.st.fileBuf)
	}
	if in.f.source == SourceNone {
		why := string(in.f.appendWhy(nil))
		r.d.Reason = why + "; GOMEMLIMIT left as it was"
		r.a = action{kind: actRestore, why: why, hardMin: noLimit}
		return r
	}
	lim, warns, err := screen(in)
	r.warns = warns
	if err != nil {
		r.d.Reason = "GOMEMLIMIT left as it was: " + err.Error()
		r.err = err
		return r
	}
	r.d.MemoryLimit, r.d.Ratio, r.d.Source, r.d.File = lim.limit, in.ratio, in.f.source, lim.file
	outside := int64(0)
	if in.headroom && in.usageErr == nil {
		// Held under a growing Go mapping says nothing: keep the last estimate.
		if lim.held >= in.goMapped || in.goMapped <= in.mappedThen {
			r.st.outside = max(lim.held-in.goMapped, 0)
		}
		r.st.mappedThen, outside = in.goMapped, r.st.outside
	}
	p := planner{in: in, lim: lim, r: r, outside: outside, goResident: min(in.goMapped, lim.held),
		floor: min(in.floor, lim.limit), // never over the tightest limit
		want:  math.MaxInt64, limit: lim.limit, file: lim.file, s: sentence{b: in.reason[:0]}}
	p.hard()
	p.hardWant = p.want
	if lim.high != noLimit {
		p.high()
	}
	p.lift()
	return p.result()
}

// planLimits are the limits screen passes: the hard limit (hasHard), else
// memory.high alone; high, memory.high when a target under the hard limit,
// else noLimit; bounds, the hard limits on the path; held, what the process
// holds unreclaimable.
type planLimits struct {
	limit, high    int64
	file, highFile string
	hasHard        bool
	bounds         []cgroupfs.Bound
	held           int64
}

// screen passes the limits in.f holds, with their warnings, or returns the
// error that leaves GOMEMLIMIT as it is (ErrImplausibleLimit).
func screen(in planInputs) (planLimits, []planWarning, error) {
	f := in.f
	held := in.held // RssAnon + RssShmem (selfReads.usage)
	if in.usageErr != nil {
		held = in.goMapped // no /proc here: judge by the Go runtime's share alone
	}
	var warns []planWarning
	limit, file, high, highFile := f.max, f.maxFile, f.high, f.highFile
	if high != noLimit && high <= 1 { // malformed: memory.max is honoured without it
		err := fmt.Errorf("%w: %s says %d bytes; it is not followed", ErrImplausibleLimit, highFile, high)
		key := fmt.Sprintf("implausible %s %d", highFile, high)
		if limit == noLimit {
			return planLimits{}, append(warns, planWarning{key: key, err: err, first: in.first}), err
		}
		warns = append(warns, planWarning{key: key, err: fmt.Errorf("limits: memory.high ignored: %w", err)})
		high, highFile = noLimit, ""
	}
	hasHard := limit != noLimit
	if !hasHard {
		limit, file = high, highFile
	} else if high != noLimit && high >= limit {
		high, highFile = noLimit, ""
	}
	if hasHard && limit > 0 && limit <= held && !in.first && in.applied != 0 && f.maxFile != "" && f.maxFile == in.maxFile {
		// Lowered under the usage at run time: followed, said when it moved.
		if limit < in.limit {
			warns = append(warns, planWarning{key: "under usage " + file, err: fmt.Errorf("limits: %s was lowered from %d to %d bytes, under the %d bytes this process holds (RssAnon + RssShmem): followed; the kernel reclaims or OOM-kills above it", file, in.limit, limit, held)})
		}
	} else if hasHard && (limit <= 0 || limit <= held) {
		err := fmt.Errorf("%w: %s says %d bytes, but this process already holds %d bytes (RssAnon + RssShmem); GOMEMLIMIT left at %d",
			ErrImplausibleLimit, cmp.Or(file, f.source.String()), limit, held, in.cur)
		return planLimits{}, append(warns, planWarning{key: fmt.Sprintf("implausible %s %d", file, limit), err: err, first: in.first}), err
	}
	lim := planLimits{limit: limit, file: file, high: high, highFile: highFile, hasHard: hasHard, held: held}
	if hasHard {
		lim.bounds = f.bounds
		if len(lim.bounds) == 0 {
			lim.bounds = []cgroupfs.Bound{{Bytes: limit, File: file}}
		}
	}
	return lim, warns, nil
}

// planner carries compute's decision through hard, high and lift.
type planner struct {
	in  planInputs
	lim planLimits
	r   planResult

	outside     int64 // the process's own estimate of memory outside the Go runtime
	goResident  int64 // what the Go runtime holds resident
	floor       int64 // the floor, capped by the screened limit
	want        int64 // GOMEMLIMIT so far
	hardWant    int64 // the most the hard limit allows, charges taken off
	limit       int64 // the limit followed (the binding hard limit, or memory.high alone)
	file        string
	highDriven  bool
	hardCharged int64 // charged to the cgroup of the hard limit followed
	hc          charge
	s           sentence // the Reason
}

func (p *planner) warn(w planWarning) { p.r.warns = append(p.r.warns, w) }

// charged returns what cr's cgroup is charged beyond the Go runtime,
// unreclaimable, and the account, adding the read's warning.
func (p *planner) charged(cr chargeRead) (int64, charge) {
	if cr.warn != nil {
		p.warn(*cr.warn)
	}
	return max(cr.c.total()-p.goResident, 0), cr.c
}

// hard follows the binding hard limit less its charges, raised to the floor.
func (p *planner) hard() {
	in, d, s := p.in, &p.r.d, &p.s
	if p.lim.hasHard {
		p.bind()
	}
	s.add(in.ratioFrom, " ratio ").num(in.ratio).add(" of the ", d.Source.String(), " limit ")
	if p.lim.hasHard && in.f.maxFile != "" && p.file != in.f.maxFile {
		s.add("from ", p.file, " (with what its cgroup is charged, it leaves less than the tighter ", in.f.maxFile, ")")
	} else {
		s.b = in.f.appendWhy(s.b)
	}
	if !p.lim.hasHard {
		return
	}
	if p.hardCharged > p.outside {
		d.Charged = p.hardCharged
		s.add(", minus ").mib(p.hardCharged).add(" charged to the cgroup that the Go runtime does not hold and the kernel cannot reclaim (")
		p.hc.write(s)
		s.add(")")
	} else if d.Outside > 0 {
		s.add(", minus ").mib(d.Outside).add(" outside the Go runtime")
	}
	if d.Outside > p.limit/2 {
		p.warn(planWarning{key: "headroom " + p.file, err: fmt.Errorf("limits: %s of the %s limit of %s is charged outside the Go runtime, most of it: %s", logattr.MiB(d.Outside), logattr.MiB(p.limit), p.file, s.b)})
	}
	if p.want < p.floor {
		p.want, d.AtFloor = p.floor, true
		if p.floor < in.floor {
			s.add(", raised to the limit itself (under the floor ").mib(in.floor).add("): the GC will run often")
		} else {
			s.add(", raised to the floor ").mib(p.floor).add(": the GC will run often")
		}
		p.warn(planWarning{key: fmt.Sprintf("floor %s %d", p.file, p.limit),
			err: fmt.Errorf("limits: GOMEMLIMIT at the floor %d bytes (%s): the GC will run often", p.want, s.b)})
	}
}

// bind follows the hard limit on the path that leaves the least once its
// cgroup's charge is taken off.
func (p *planner) bind() {
	in, d := p.in, &p.r.d
	for i, b := range p.lim.bounds {
		var cr chargeRead
		if i < len(in.boundCharges) {
			cr = in.boundCharges[i]
		}
		c, cc := p.charged(cr)
		w := int64(min(float64(b.Bytes)*in.ratio, math.MaxInt64)) - max(p.outside, c)
		if i == 0 || w < p.want {
			p.want, p.hardCharged, p.hc, p.limit, p.file = w, c, cc, b.Bytes, b.File
		}
	}
	d.Reclaimable = max(p.hc.reclaimable, 0)
	d.MemoryLimit, d.File, d.Source = p.limit, p.file, in.f.sourceOf(p.file)
	d.Outside = max(p.outside, p.hardCharged)
}

// high lowers GOMEMLIMIT toward memory.high, held at liveHeapFactor × the
// live heap and the floor.
func (p *planner) high() {
	in, d, s := p.in, &p.r.d, &p.s
	high, highFile, hasHard := p.lim.high, p.lim.highFile, p.lim.hasHard
	highCharged, hc := p.charged(in.highCharge)
	highOut := max(p.outside, highCharged)
	target := int64(min(float64(high)*in.ratio, math.MaxInt64)) - highOut
	said := len(s.b) // what follows is said only when memory.high lowers GOMEMLIMIT
	if hasHard {
		s.add(", toward memory.high ").mib(high).add(" (", highFile, ": the throttle limit, a target under memory.max)")
	} else {
		d.Outside = highOut
	}
	if highCharged > p.outside {
		d.Charged = max(d.Charged, highCharged)
		s.add(", minus ").mib(highCharged).add(" charged to its cgroup that the Go runtime does not hold and the kernel cannot reclaim (")
		hc.write(s)
		s.add(")")
	} else if !hasHard && highOut > 0 {
		s.add(", minus ").mib(highOut).add(" outside the Go runtime")
	}
	if liveFloor := int64(min(float64(in.live)*liveHeapFactor, math.MaxInt64/2)); target < liveFloor {
		target, d.LiveFloor = liveFloor, true
		s.add(", held at ").num(liveHeapFactor).add(" x the live heap of ").mib(in.live).add(" so that GOMEMLIMIT never drives the GC into a spiral")
	}
	tfloor := in.floor // capped by the hard limit only
	if hasHard {
		tfloor = p.floor
	}
	if target < tfloor {
		target = tfloor
		s.add(", held at the floor ").mib(tfloor)
	}
	if target < p.want {
		p.want, p.highDriven, d.AtFloor = target, true, false
		d.High, d.HighFile = high, highFile
	} else {
		s.b = s.b[:said]
	}
}

// lift adds Lift's bytes to GOMEMLIMIT and hardWant, up to the limit less
// what is charged outside the Go runtime.
func (p *planner) lift() {
	if p.in.lift <= 0 {
		return
	}
	d := &p.r.d
	lift := min(p.in.lift, max(p.limit-d.Outside-p.want, 0))
	p.want += lift
	p.hardWant = min(p.hardWant, math.MaxInt64-lift) + lift
	p.s.add(", lifted by ").mib(lift).add(" (death spiral)")
}

// result returns the decision and its action.
func (p *planner) result() planResult {
	r := p.r
	r.d.GoMemLimit = p.want
	r.d.Reason, r.st.reason = p.in.said, p.s.b
	if string(p.s.b) != p.in.said {
		r.d.Reason = string(p.s.b)
	}
	hard := p.limit
	if !p.lim.hasHard {
		hard = noLimit
	}
	r.a = action{kind: actSet, want: p.want, hardWant: p.hardWant, hard: hard,
		hardMin:  hardMin(p.in.f.bounds, p.limit, p.lim.hasHard),
		hardFile: p.file, maxFile: p.in.f.maxFile, highDriven: p.highDriven}
	return r
}

// hardMin returns the smallest hard limit of bounds, else limit when
// hasHard, else noLimit.
func hardMin(bounds []cgroupfs.Bound, limit int64, hasHard bool) int64 {
	least := int64(noLimit)
	for _, b := range bounds {
		if b.Bytes != noLimit && (least == noLimit || b.Bytes < least) {
			least = b.Bytes
		}
	}
	if hasHard && least == noLimit {
		least = limit
	}
	return least
}
