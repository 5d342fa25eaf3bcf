package limits

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/memctl/memctl/internal/relief"
)

// TestHugeSizeIsExhaustedWhateverIsInUse (issue 11, input 5): on an account
// limited to 64 MiB, a client-supplied size past the limit is
// resource_exhausted whether 0 or 1 byte (or anything) is in use, in every
// kind of scope, up to math.MaxInt64.
func TestHugeSizeIsExhaustedWhateverIsInUse(t *testing.T) {
	for _, poolLimit := range []int64{Unlimited, 1 << 40} {
		p := newTestPool(t, PoolConfig{Limit: poolLimit})
		a := mustOpen(t, p, "a", 64*mib)
		q := mustOpen(t, p, "q", Unlimited)
		child := mustOpen(t, q, "child", Unlimited)
		accts := []*Account{a, child, q}
		if poolLimit == Unlimited {
			accts = accts[:1] // the others may hold up to math.MaxInt64
		}
		for _, acct := range accts {
			for _, inUse := range []int64{0, 1, 64 * kib, mib} {
				require.NoError(t, acct.Grow(inUse))
				for _, n := range []int64{math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 - inUse, math.MaxInt64 - inUse + 1, 1 << 62, 65 * mib} {
					if n <= 0 || (acct != a && n == 65*mib) {
						continue
					}
					err := acct.Grow(n)
					require.ErrorIs(t, err, ErrResourceExhausted, "%s: Grow(%d) with %d in use", acct.Name(), n, inUse)
					assert.False(t, errors.Is(err, ErrInvalidSize))
					var e *ExhaustedError
					require.ErrorAs(t, err, &e)
					assert.Equal(t, n, e.Requested)
					assert.Equal(t, inUse, acct.used.Load(), "nothing counted")
				}
				acct.Shrink(inUse)
			}
		}
		child.Close()
		q.Close()
		a.Close()
		assert.Zero(t, p.Used())
		assert.Zero(t, p.Stats().Misuse)
	}
}

// TestNestedGrowToExactlyMaxInt64: a nested account reserves from its
// parent in chunks, but the rounding must not refuse a total that fits
// exactly, and a total past math.MaxInt64 is refused as exhausted, naming
// the size the caller passed, not the rounded reservation.
func TestNestedGrowToExactlyMaxInt64(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: Unlimited})
	parent := mustOpen(t, p, "parent", Unlimited)
	child := mustOpen(t, parent, "child", Unlimited)
	grandchild := mustOpen(t, child, "grandchild", Unlimited)
	require.NoError(t, parent.Grow(100000))

	n := int64(math.MaxInt64 - 100000)
	err := grandchild.Grow(n + 1)
	require.ErrorIs(t, err, ErrResourceExhausted)
	var e *ExhaustedError
	require.ErrorAs(t, err, &e)
	assert.Equal(t, n+1, e.Requested, "the caller's size")
	assert.Zero(t, grandchild.Used())

	require.NoError(t, grandchild.Grow(n), "parent total exactly math.MaxInt64")
	assert.Equal(t, n, grandchild.Used())
	assert.Equal(t, n, child.Used())
	assert.Equal(t, int64(math.MaxInt64), parent.Used())

	require.ErrorIs(t, grandchild.Grow(1), ErrResourceExhausted)
	require.ErrorIs(t, parent.Grow(1), ErrResourceExhausted)

	grandchild.Shrink(n)
	parent.Shrink(100000)
	grandchild.Close()
	child.Close()
	parent.Close()
	assert.Zero(t, p.Used())
}

// TestEightRequestsAgainstPool: eight concurrent 80 MiB Grows, each under a
// 100 MiB per-request budget, against a 400 MiB pool: exactly five fit, and
// the three others are refused by the pool.
func TestEightRequestsAgainstPool(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 400 * mib})
	start := make(chan struct{})
	errs := make(chan error, 8)
	accts := make([]*Account, 8)
	for i := range accts {
		accts[i] = mustOpen(t, p, "req", 100*mib)
		go func() {
			<-start
			errs <- accts[i].Grow(80 * mib)
		}()
	}
	close(start)
	ok, refused := 0, 0
	for range accts {
		err := <-errs
		if err == nil {
			ok++
			continue
		}
		var e *ExhaustedError
		require.ErrorAs(t, err, &e)
		assert.Equal(t, "pool", e.Scope)
		assert.Equal(t, 80*mib, e.Requested)
		assert.Equal(t, 400*mib, e.Limit)
		refused++
	}
	assert.Equal(t, 5, ok)
	assert.Equal(t, 3, refused)
	assert.Equal(t, 400*mib, p.Used())
	shrinkClose(accts...)
	assert.Zero(t, p.Used())
}

// TestGrowRacingRelease puts a release, then a Close, exactly between the
// fast path's add and its check against the reservation: the Grow must
// notice the lowered reservation and take the slow path, so an account
// never uses more than it holds from its parent.
func TestGrowRacingRelease(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 10 * mib, ChunkSize: 4 * kib})
	a := mustOpen(t, p, "a", Unlimited)
	require.NoError(t, a.Grow(mib))
	// A Shrink has lowered used; its release has not run yet.
	a.used.Add(-mib)
	hooked := 0
	testHookGrow = func() {
		if hooked++; hooked == 1 {
			a.release() // lowers reserved to one chunk
		}
	}
	t.Cleanup(func() { testHookGrow = nil })
	require.NoError(t, a.Grow(64*kib))
	assert.Equal(t, 1, hooked, "the release ran between check and swap")
	assert.Equal(t, 64*kib, a.Used())
	assert.GreaterOrEqual(t, a.reserved.Load(), a.used.Load(), "reserved below used")
	assert.Equal(t, a.reserved.Load(), p.Used())

	a.Shrink(kib) // leaves a kibibyte of slack for the fast path
	hooked = 0
	testHookGrow = func() {
		if hooked++; hooked == 1 {
			a.close(nil) // a Close by another goroutine, not strict about the leak
		}
	}
	assert.ErrorIs(t, a.Grow(1), ErrClosed, "a Grow racing Close fails")
	assert.Equal(t, 1, hooked)
	assert.Zero(t, p.Used())
}

// checkLimits reports every way a pool and its accounts are above a limit
// right now; it runs while the accounts are in use. An account's own counter
// may be above what it holds for a moment (a Grow on the fast path adds
// before it checks); what it holds from its parent (reserved plus its
// children's) and its peak are never above its limit. Both of the first
// change only under the account's lock, which the check takes to read them
// at one instant: read apart, a trim of the account's own slack followed by
// a child's reservation would add up to more than was ever held.
func checkLimits(p *Pool, accts []*Account) []string {
	var bad []string
	if u, pk, l := p.Used(), p.peak.Load(), p.limit.Load(); u > l || pk > l || u < 0 {
		bad = append(bad, fmt.Sprintf("pool: used %d, peak %d, limit %d", u, pk, l))
	}
	for _, a := range accts {
		a.mu.Lock()
		r, k := a.reserved.Load(), a.kids.Load()
		a.mu.Unlock()
		pk := a.peak.Load()
		if k < 0 {
			bad = append(bad, fmt.Sprintf("%s: children hold %d < 0", a.scope(), k))
		}
		if a.limit != Unlimited && (r+k > a.limit || pk > a.limit) {
			bad = append(bad, fmt.Sprintf("%s: reserved %d + children %d, peak %d, limit %d", a.scope(), r, k, pk, a.limit))
		}
	}
	return bad
}

// TestStressInvariants runs random concurrent Grow, Shrink, Resize, Open
// and Close calls from many goroutines on a three-level tree of accounts
// (closing a parent closes its children) while a checker samples the
// limits, then returns everything and checks that every counter is at
// exactly zero. Run it with -race.
func TestStressInvariants(t *testing.T) {
	seeds := []uint64{1, 2, 3, uint64(time.Now().UnixNano())}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { stress(t, seed) })
	}
}

func stress(t *testing.T, seed uint64) {
	const (
		workers = 12
		ops     = 3000
	)
	// Not strict: a Close while other goroutines hold bytes is a leak,
	// counted, which is what this test does on purpose.
	p, err := NewPool(PoolConfig{Name: "p", Limit: 3 * mib, ChunkSize: 4 * kib, ShedSize: 640 * kib, HeapPressure: -1, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer p.Close()
	// Three levels: tops with and without limits, each with two children,
	// the first child with two grandchildren.
	var accts []*Account
	for i, lim := range []int64{mib, Unlimited, 2 * mib, 256 * kib} {
		top := mustOpen(t, p, fmt.Sprint("q", i), lim)
		accts = append(accts, top)
		for j, clim := range []int64{Unlimited, 192 * kib} {
			child := mustOpen(t, top, fmt.Sprint("op", j), clim)
			accts = append(accts, child)
			if j == 0 {
				for k, glim := range []int64{Unlimited, 64 * kib} {
					accts = append(accts, mustOpen(t, child, fmt.Sprint("g", k), glim))
				}
			}
		}
	}

	stop := make(chan struct{})
	var violations []string
	var checks atomic.Int64
	checker := make(chan struct{})
	go func() {
		defer close(checker)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if bad := checkLimits(p, accts); len(bad) > 0 && len(violations) < 10 {
				violations = append(violations, bad...)
			}
			checks.Add(1)
		}
	}()

	// Shed goes on and off while the workers grow (the death-spiral
	// detector's switch), with a ShedSize the accounts reach.
	shedDone := make(chan struct{})
	go func() {
		defer close(shedDone)
		defer relief.Shed(false)
		for on := true; ; on = !on {
			select {
			case <-stop:
				return
			default:
			}
			relief.Shed(on)
			time.Sleep(50 * time.Microsecond)
		}
	}()

	var granted, refused, closedErrs, closes, opens, misuses, unsure atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			held := make([]int64, len(accts))
			size := func() int64 {
				switch rng.IntN(10) {
				case 0:
					return 1 + rng.Int64N(512*kib) // crosses chunks and limits
				case 1:
					return 0
				default:
					return 1 + rng.Int64N(8*kib)
				}
			}
			for range ops {
				i := rng.IntN(len(accts))
				a := accts[i]
				var err error
				switch op := rng.IntN(100); {
				case op < 40:
					n := size()
					if err = a.Grow(n); err == nil {
						held[i] += n
					}
				case op < 75:
					n := rng.Int64N(held[i] + 1)
					a.Shrink(n)
					held[i] -= n
				case op < 94:
					n := size()
					if err = a.Resize(held[i], n); err == nil {
						held[i] = n
					}
				case op < 96:
					// Sizes at the edges: negative or MaxInt64 Shrinks are
					// misuse (exactly one each, changing nothing); MaxInt64
					// Grows and Resizes are refused.
					switch rng.IntN(5) {
					case 0:
						a.Shrink(-1 - rng.Int64N(10))
						misuses.Add(1)
					case 1:
						// Misuse while the account is open; after Close, a
						// Shrink does nothing.
						open := a.reserved.Load() >= 0
						a.Shrink(math.MaxInt64)
						if open != (a.reserved.Load() >= 0) {
							unsure.Add(1) // closed meanwhile
						} else if open {
							misuses.Add(1)
						}
					case 2:
						a.Shrink(math.MinInt64)
						misuses.Add(1)
					case 3:
						err = a.Grow(math.MaxInt64)
					default:
						if err = a.Resize(0, math.MaxInt64); err == nil {
							t.Errorf("%s: Resize(0, MaxInt64) granted", a.scope())
						}
					}
				case op < 99:
					// A short-lived child: open, grow, shrink, close, while
					// its parent may be closing.
					var c *Account
					lim := []int64{Unlimited, 32 * kib}[rng.IntN(2)]
					if c, err = a.Open("tmp", lim); err == nil {
						opens.Add(1)
						n := size()
						if err = c.Grow(n); err == nil {
							c.Shrink(n)
						}
						c.Close()
						if c.Used() != 0 {
							t.Errorf("%s: Used %d after Close", c.scope(), c.Used())
						}
					}
				default:
					if rng.IntN(20) == 0 {
						a.Close()
						closes.Add(1)
					}
				}
				switch {
				case err == nil:
					granted.Add(1)
				case errors.Is(err, ErrResourceExhausted):
					refused.Add(1)
				case errors.Is(err, ErrClosed):
					closedErrs.Add(1)
				default:
					t.Errorf("unexpected error: %v", err)
				}
			}
			for i, n := range held {
				accts[i].Shrink(n)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-checker
	<-shedDone

	assert.Empty(t, violations, "limits exceeded while running")
	t.Logf("seed %d: %d granted, %d refused, %d ErrClosed, %d closes, %d opens, %d limit checks, pool peak %d of %d, %d leaked",
		seed, granted.Load(), refused.Load(), closedErrs.Load(), closes.Load(), opens.Load(), checks.Load(), p.peak.Load(), p.limit.Load(), p.Stats().Leaked)
	require.Positive(t, refused.Load(), "the test must reach the limits")

	// Quiescent: exact accounting. Every account's own counter is back to
	// zero (closed ones too: their holders shrank after Close), what each
	// open account's children hold is exactly the sum of what the open
	// children hold, each open account holds at most releaseAt beyond use,
	// and the pool holds exactly what the open top-level accounts hold.
	childHeld := make(map[*Account]int64)
	for _, a := range accts {
		if r := a.reserved.Load(); r >= 0 && a.parent != nil {
			childHeld[a.parent] += r + a.kids.Load()
		}
	}
	var held int64
	for _, a := range accts {
		assert.Zero(t, a.used.Load(), "%s used", a.scope())
		r := a.reserved.Load()
		if r < 0 {
			assert.Zero(t, a.Used(), "%s Used() after Close", a.scope())
			continue
		}
		assert.Equal(t, childHeld[a], a.kids.Load(), "%s children", a.scope())
		assert.Equal(t, childHeld[a], a.Used(), "%s Used()", a.scope())
		assert.LessOrEqual(t, r, a.releaseAt, "%s holds %d, uses 0", a.scope(), r)
		if a.parent == nil {
			held += r + a.kids.Load()
		}
	}
	assert.Equal(t, held, p.Used())
	assert.GreaterOrEqual(t, p.Stats().Misuse, misuses.Load(), "each misuse counted exactly once")
	assert.LessOrEqual(t, p.Stats().Misuse, misuses.Load()+unsure.Load(), "each misuse counted exactly once")
	for i := len(accts) - 1; i >= 0; i-- {
		accts[i].Close()
	}
	assert.Zero(t, p.Used(), "pool after every account closed")
	assert.Empty(t, checkLimits(p, accts))
	for _, a := range accts {
		assert.Zero(t, a.Used())
		assert.Zero(t, a.kids.Load())
	}
}

// FuzzAccountModel drives a pool → query → operator chain with a sequence of
// Grow, Shrink and Resize calls on the operator and on the query itself,
// Shrinks of more than an account grew, and Closes of either (then opened
// again), and checks each result against a model with exact arithmetic: a
// Grow is refused if and only if the operator's, the query's or the pool's
// limit would be passed, by the first of them that would be, with exact
// error fields; a Shrink past what the account grew itself is misuse and
// changes nothing; a Close with bytes grown is a leak; a closed account
// refuses with ErrClosed. Chunks must never cause a refusal the limits do
// not, except the operator's reserved slack when the query grows itself
// (at most two chunks, read from the account).
func FuzzAccountModel(f *testing.F) {
	f.Add([]byte{1, 8, 4, 2, 0, 10, 0, 200, 1, 100, 0, 255, 2, 50, 0, 30})
	f.Add([]byte{0, 0, 0, 0, 0, 255, 0, 255, 0, 255, 1, 255, 2, 0, 0, 1})
	f.Add([]byte{3, 3, 3, 1, 0, 1, 0, 2, 0, 3, 0, 4, 1, 1, 1, 9, 0, 64})
	f.Add([]byte{7, 1, 9, 5, 2, 255, 2, 0, 2, 128, 0, 77, 0, 91, 1, 200})
	// Issue 11, input 1: the query shrinks what the operator grew.
	f.Add([]byte{0, 0, 0, 4, 0, 100, 4, 100, 3, 10, 0, 200, 4, 150, 5, 0, 5, 1})
	f.Add([]byte{2, 5, 6, 3, 3, 40, 0, 60, 4, 41, 5, 1, 0, 30, 3, 90, 5, 0, 0, 255})
	// Sizes at the edges, on the operator and the query, Grow and Shrink;
	// grandchildren, with their parent closed under them.
	f.Add([]byte{1, 1, 1, 3, 6, 0, 6, 1, 6, 2, 6, 0x44, 6, 0x85, 6, 0xc0, 0, 10, 6, 0x83, 6, 0xc6})
	f.Add([]byte{0, 0, 7, 10, 0, 50, 7, 3, 7, 1, 7, 6, 7, 255, 3, 20, 7, 9, 7, 130, 1, 50})
	f.Fuzz(accountModel)
}

// edgeSizes are the sizes at the edges of int64 that the model tries.
var edgeSizes = [...]int64{math.MaxInt64, math.MaxInt64 - 1, 1 << 62, math.MaxInt64 / 2, -1, math.MinInt64, -97, math.MinInt64 + 1}

func accountModel(t *testing.T, data []byte) {
	if len(data) < 4 {
		return
	}
	// Limits in units of 1000 bytes (not a chunk multiple), 0 = none
	// for the accounts; chunk sizes 1 byte .. 16 KiB.
	limit := func(l int64) int64 {
		if l == 0 {
			return Unlimited
		}
		return l
	}
	opLimit := limit(int64(data[0]%8) * 3000)
	qLimit := limit(int64(data[1]%8) * 5000)
	poolLimit := int64(data[2]%8+1) * 7000
	chunk := int64(1) << (data[3] % 15)
	p, err := NewPool(PoolConfig{Limit: poolLimit, ChunkSize: chunk, HeapPressure: -1, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer p.Close()
	q := mustOpen(t, p, "q", qLimit)
	op := mustOpen(t, q, "op", opLimit)
	var used, qOwn, peak, misuse, leaked, leakedBytes int64
	ops := data[4:]
	if len(ops) > 1024 {
		ops = ops[:1024] // keep each run short: long inputs add no coverage
	}
	refusal := func(scope string, n, inUse, lim int64) *ExhaustedError {
		e := &ExhaustedError{Requested: n, Used: inUse, Limit: lim, Scope: scope}
		if scope == "pool" {
			e.RetryAfter = defaultRetryAfter
		}
		return e
	}
	for ; len(ops) >= 2; ops = ops[2:] {
		n := int64(ops[1]) * 97
		what := fmt.Sprintf("op %d n %d, op used %d, q own %d (limits %d/%d/%d, chunk %d)", ops[0]%8, n, used, qOwn, opLimit, qLimit, poolLimit, chunk)
		switch ops[0] % 8 {
		case 0, 2:
			newSize := used + n
			if ops[0]%6 == 0 {
				err = op.Grow(n)
			} else {
				err = op.Resize(used, newSize)
			}
			var want *ExhaustedError
			switch {
			case newSize > opLimit:
				want = refusal("pool/q/op", n, used, opLimit)
			case qOwn+newSize > qLimit:
				want = refusal("pool/q", n, 0, qLimit)
			case qOwn+newSize > poolLimit:
				want = refusal("pool", n, 0, poolLimit)
				if newSize > poolLimit {
					want.RetryAfter = 0 // the operator alone does not fit
				}
			}
			if want == nil {
				require.NoError(t, err, what)
				used = newSize
				peak = max(peak, used)
				break
			}
			var got *ExhaustedError
			require.ErrorAs(t, err, &got, what)
			if want.Scope != "pool/q/op" {
				// The query and the pool hold the operator's reservation,
				// which is at least what it uses.
				assert.GreaterOrEqual(t, got.Used, used+qOwn)
				want.Used = got.Used
			}
			assert.Equal(t, *want, *got, what)
		case 1:
			if n > used {
				misuse++
			} else {
				used -= n
			}
			op.Shrink(n)
		case 3:
			// The query grows itself: the operator's reservation beyond
			// its use (at most two chunks) counts against it.
			slack := op.reserved.Load() - used
			require.LessOrEqual(t, slack, 2*chunk, what)
			err = q.Grow(n)
			switch {
			case qOwn+n+used+slack > qLimit:
				var got *ExhaustedError
				require.ErrorAs(t, err, &got, what)
				assert.Equal(t, "pool/q", got.Scope, what)
			case qOwn+n+used+slack > poolLimit:
				var got *ExhaustedError
				require.ErrorAs(t, err, &got, what)
				assert.Equal(t, "pool", got.Scope, what)
			default:
				require.NoError(t, err, what)
				qOwn += n
			}
		case 4:
			// Issue 11, input 1: a Shrink of more than the query grew
			// itself (the operator's bytes are not its own) is misuse.
			if n > qOwn {
				misuse++
			} else {
				qOwn -= n
			}
			q.Shrink(n)
		case 5:
			// Close the operator, or the query (which closes the operator),
			// then open them again.
			if used > 0 {
				leaked++
				leakedBytes += used
			}
			old := op
			if ops[1]%2 == 0 {
				op.Close()
			} else {
				if qOwn > 0 {
					leaked++
					leakedBytes += qOwn
				}
				q.Close()
				require.ErrorIs(t, q.Grow(1), ErrClosed, what)
				q = mustOpen(t, p, "q", qLimit)
				qOwn = 0
			}
			require.ErrorIs(t, old.Grow(1), ErrClosed, what)
			_, err = old.Open("x", Unlimited)
			require.ErrorIs(t, err, ErrClosed, what)
			op = mustOpen(t, q, "op", opLimit)
			used, peak = 0, 0
		case 6:
			// Sizes at the edges: negative sizes are invalid (Grow) or
			// misuse (Shrink) and change nothing; sizes that overflow any
			// sum are refused by the first limit, however large.
			sz := edgeSizes[int(ops[1])%len(edgeSizes)]
			what += fmt.Sprintf(", size %d", sz)
			// held is what q holds for the operator: its use, and, when q
			// grows itself, its reservation beyond (at most two chunks).
			a, own, held := op, used, used
			if ops[1]&0x40 != 0 {
				a, own, held = q, qOwn, op.reserved.Load()
			}
			if ops[1]&0x80 != 0 {
				if sz < 0 || sz > own {
					misuse++
				} else if a == op {
					used -= sz
				} else {
					qOwn -= sz
				}
				a.Shrink(sz)
				break
			}
			err = a.Grow(sz)
			if sz < 0 {
				require.ErrorIs(t, err, ErrInvalidSize, what)
				require.NotErrorIs(t, err, ErrResourceExhausted, what)
				break
			}
			var got *ExhaustedError
			require.ErrorAs(t, err, &got, what)
			assert.Equal(t, sz, got.Requested, what)
			assert.Zero(t, got.RetryAfter, "%s: more than the pool's whole limit: no retry can succeed", what)
			switch {
			case a == op && sz > opLimit-used:
				assert.Equal(t, "pool/q/op", got.Scope, what)
			case sz > qLimit-held-qOwn:
				assert.Equal(t, "pool/q", got.Scope, what)
			default:
				assert.Equal(t, "pool", got.Scope, what)
			}
		case 7:
			// A grandchild grows, shrinks and closes; its bytes count in
			// the operator's and the query's Used while open and leave
			// nothing behind. Every third time the operator is closed first:
			// the grandchild refuses Grow and Open with ErrClosed.
			gLimit := limit(int64(ops[1]%4) * 4000)
			g := mustOpen(t, op, "g", gLimit)
			gn := int64(ops[1]) * 31
			err = g.Grow(gn)
			if err == nil {
				require.Equal(t, gn, g.Used(), what)
				require.GreaterOrEqual(t, op.Used(), used+gn, what)
				// The operator's peak counts what the grandchild holds: its
				// bytes rounded up to a chunk, within its limit.
				require.GreaterOrEqual(t, op.Peak(), used+gn, what)
				require.LessOrEqual(t, op.Peak(), max(peak, used+min(roundUp(gn, chunk), gLimit)), what)
				peak = op.Peak()
				require.Empty(t, checkLimits(p, []*Account{q, op, g}), what)
				g.Shrink(gn)
			} else {
				var got *ExhaustedError
				require.ErrorAs(t, err, &got, what)
				room := min(opLimit-used, qLimit-used-qOwn, poolLimit-used-qOwn)
				require.True(t, gn > gLimit || gn > room-4*chunk, "%s: refused %v", what, err)
			}
			if ops[1]%3 == 0 {
				if used > 0 {
					leaked++
					leakedBytes += used
				}
				op.Close()
				require.ErrorIs(t, g.Grow(1), ErrClosed, what)
				_, err = g.Open("x", Unlimited)
				require.ErrorIs(t, err, ErrClosed, what)
				g.Close()
				op = mustOpen(t, q, "op", opLimit)
				used, peak = 0, 0
			} else {
				g.Close()
			}
			require.Equal(t, used, op.Used(), what)
		}
		require.Equal(t, used, op.Used(), what)
		require.Equal(t, peak, op.Peak(), what)
		require.Equal(t, qOwn+op.reserved.Load(), q.Used(), what)
		st := p.Stats()
		require.Equal(t, misuse, st.Misuse, what)
		require.Equal(t, leaked, st.Leaked, what)
		require.Equal(t, leakedBytes, st.LeakedBytes, what)
		// What the chain holds beyond use is bounded by two chunks per
		// level, and never past the pool's limit.
		require.GreaterOrEqual(t, p.Used(), used+qOwn, what)
		require.LessOrEqual(t, p.Used(), used+qOwn+4*chunk, what)
		require.Empty(t, checkLimits(p, []*Account{q, op}), what)
	}
	op.Shrink(used)
	q.Shrink(qOwn)
	op.Close()
	assert.Zero(t, q.Used())
	q.Close()
	assert.Zero(t, p.Used())
	assert.Equal(t, leaked, p.Stats().Leaked)
}

// TestStressNeverOvercommitted checks the limits against the truth: the
// bytes that callers were granted and still hold, counted outside the
// package. With 256-byte chunks nearly every call reserves or
// releases, so the fast path races releases all the time; a Grow that
// slipped through a concurrent release would let the granted total of an
// account pass what it holds from its parent, and the pool's total pass
// the pool's limit.
func TestStressNeverOvercommitted(t *testing.T) {
	const (
		workers = 8
		ops     = 4000
		limit   = 96 * kib
	)
	p := newTestPool(t, PoolConfig{Limit: limit, ChunkSize: 256})
	var accts []*Account
	for i := range 3 {
		top := mustOpen(t, p, fmt.Sprint("q", i), 48*kib)
		accts = append(accts, top, mustOpen(t, top, "op", Unlimited))
	}
	var total atomic.Int64
	perAcct := make([]atomic.Int64, len(accts))
	var over atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			held := make([]int64, len(accts))
			for range ops {
				i := rng.IntN(len(accts))
				if rng.IntN(2) == 0 {
					n := 1 + rng.Int64N(2*kib)
					if accts[i].Grow(n) == nil {
						held[i] += n
						top := i &^ 1
						if total.Add(n) > limit || perAcct[top].Add(n) > 48*kib {
							over.Add(1)
						}
					}
				} else if held[i] > 0 {
					n := 1 + rng.Int64N(held[i])
					held[i] -= n
					total.Add(-n)
					perAcct[i&^1].Add(-n)
					accts[i].Shrink(n)
				}
			}
			for i, n := range held {
				total.Add(-n)
				perAcct[i&^1].Add(-n)
				accts[i].Shrink(n)
			}
		}()
	}
	wg.Wait()
	assert.Zero(t, over.Load(), "granted bytes exceeded a limit")
	for i := len(accts) - 1; i >= 0; i-- {
		accts[i].Close()
	}
	assert.Zero(t, p.Used())
	assert.Zero(t, p.Stats().Misuse)
}
