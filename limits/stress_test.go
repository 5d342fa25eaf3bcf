package limits

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkLimits reports every way a pool and its accounts are above a limit
// right now. It reads only atomics, so it runs while the accounts are in use.
func checkLimits(p *Pool, accts []*Account) []string {
	var bad []string
	if u, pk := p.Used(), p.peak.Load(); u > p.limit || pk > p.limit || u < 0 {
		bad = append(bad, fmt.Sprintf("pool: used %d, peak %d, limit %d", u, pk, p.limit))
	}
	for _, a := range accts {
		u, r, pk := a.used.Load(), a.reserved.Load(), a.peak.Load()
		if u < 0 {
			bad = append(bad, fmt.Sprintf("%s: used %d < 0", a.scope(), u))
		}
		if a.limit > 0 && (u > a.limit || r > a.limit || pk > a.limit) {
			bad = append(bad, fmt.Sprintf("%s: used %d, reserved %d, peak %d, limit %d", a.scope(), u, r, pk, a.limit))
		}
	}
	return bad
}

// TestStressInvariants runs random concurrent Grow, Shrink, Resize and Close
// calls from many goroutines on a tree of accounts while a checker samples
// the limits, then returns everything and checks that every account and the
// pool are at exactly zero. Run it with -race.
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
	p := newTestPool(t, PoolConfig{Name: "p", Limit: 3 * mib, ChunkSize: 4 * kib})
	// Two levels: tops with and without limits, each with two children.
	var accts []*Account
	for i, lim := range []int64{mib, 0, 2 * mib, 256 * kib} {
		top := mustOpen(t, p, fmt.Sprint("q", i), lim)
		accts = append(accts, top)
		for j, clim := range []int64{0, 192 * kib} {
			accts = append(accts, mustOpen(t, top, fmt.Sprint("op", j), clim))
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

	var granted, refused, closedErrs, closes atomic.Int64
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
				case op < 45:
					n := size()
					if err = a.Grow(n); err == nil {
						held[i] += n
					}
				case op < 80:
					n := rng.Int64N(held[i] + 1)
					a.Shrink(n)
					held[i] -= n
				case op < 99:
					n := size()
					if err = a.Resize(held[i], n); err == nil {
						held[i] = n
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

	assert.Empty(t, violations, "limits exceeded while running")
	t.Logf("seed %d: %d granted, %d refused, %d ErrClosed, %d closes, %d limit checks, pool peak %d of %d",
		seed, granted.Load(), refused.Load(), closedErrs.Load(), closes.Load(), checks.Load(), p.peak.Load(), p.limit)
	require.Positive(t, refused.Load(), "the test must reach the limits")

	// Quiescent: exact accounting. Every account's own counter is back to
	// what its open children hold (closed accounts too: their holders shrank
	// after Close), each open account holds at most releaseAt beyond use, and
	// the pool holds exactly what the open top-level accounts hold.
	childHeld := make(map[*Account]int64)
	for _, a := range accts {
		if r := a.reserved.Load(); r > 0 && a.parent != nil {
			childHeld[a.parent] += r
		}
	}
	var held int64
	for _, a := range accts {
		assert.Equal(t, childHeld[a], a.used.Load(), "%s used", a.scope())
		r := a.reserved.Load()
		if r < 0 {
			assert.Zero(t, a.Used(), "%s Used() after Close", a.scope())
			continue
		}
		assert.Equal(t, childHeld[a], a.Used(), "%s Used()", a.scope())
		assert.LessOrEqual(t, r-a.used.Load(), a.releaseAt, "%s holds %d, uses %d", a.scope(), r, a.used.Load())
		assert.GreaterOrEqual(t, r, a.used.Load(), "%s holds less than it uses", a.scope())
		if a.parent == nil {
			held += r
		}
	}
	assert.Equal(t, held, p.Used())
	assert.Zero(t, p.Stats().Misuse)
	for i := len(accts) - 1; i >= 0; i-- {
		accts[i].Close()
	}
	assert.Zero(t, p.Used(), "pool after every account closed")
	assert.Empty(t, checkLimits(p, accts))
}

// FuzzAccountModel drives a pool → query → operator chain with a sequence of
// Grow, Shrink and Resize calls on the operator and checks each result
// against a model with exact arithmetic: a Grow is refused if and only if
// the operator's, the query's or the pool's limit would be passed, by the
// first of them that would be, with exact error fields. Chunks must never
// cause a refusal the limits do not.
func FuzzAccountModel(f *testing.F) {
	f.Add([]byte{1, 8, 4, 2, 0, 10, 0, 200, 1, 100, 0, 255, 2, 50, 0, 30})
	f.Add([]byte{0, 0, 0, 0, 0, 255, 0, 255, 0, 255, 1, 255, 2, 0, 0, 1})
	f.Add([]byte{3, 3, 3, 1, 0, 1, 0, 2, 0, 3, 0, 4, 1, 1, 1, 9, 0, 64})
	f.Add([]byte{7, 1, 9, 5, 2, 255, 2, 0, 2, 128, 0, 77, 0, 91, 1, 200})
	f.Fuzz(accountModel)
}

func accountModel(t *testing.T, data []byte) {
	if len(data) < 4 {
		return
	}
	// Limits in units of 1000 bytes (not a chunk multiple), 0 = none
	// for the accounts; chunk sizes 1 byte .. 16 KiB.
	opLimit := int64(data[0]%8) * 3000
	qLimit := int64(data[1]%8) * 5000
	poolLimit := int64(data[2]%8+1) * 7000
	chunk := int64(1) << (data[3] % 15)
	p := newTestPool(t, PoolConfig{Limit: poolLimit, ChunkSize: chunk})
	q := mustOpen(t, p, "q", qLimit)
	op := mustOpen(t, q, "op", opLimit)
	var used, peak int64
	ops := data[4:]
	if len(ops) > 1024 {
		ops = ops[:1024] // keep each run short: long inputs add no coverage
	}
	for ; len(ops) >= 2; ops = ops[2:] {
		n := int64(ops[1]) * 97
		switch ops[0] % 3 {
		case 0, 2:
			newSize := used + n
			var err error
			if ops[0]%3 == 0 {
				err = op.Grow(n)
			} else {
				err = op.Resize(used, newSize)
			}
			var want *ExhaustedError
			switch {
			case opLimit > 0 && newSize > opLimit:
				want = &ExhaustedError{Requested: n, Used: used, Limit: opLimit, Scope: "pool/q/op"}
			case qLimit > 0 && newSize > qLimit:
				want = &ExhaustedError{Requested: n, Limit: qLimit, Scope: "pool/q"}
			case newSize > poolLimit:
				want = &ExhaustedError{Requested: n, Limit: poolLimit, Scope: "pool"}
			}
			if want == nil {
				require.NoError(t, err, "grow %d with %d used (limits %d/%d/%d, chunk %d)", n, used, opLimit, qLimit, poolLimit, chunk)
				used = newSize
				peak = max(peak, used)
				break
			}
			var got *ExhaustedError
			require.ErrorAs(t, err, &got, "grow %d with %d used (limits %d/%d/%d, chunk %d)", n, used, opLimit, qLimit, poolLimit, chunk)
			if want.Scope != "pool/q/op" {
				// The query and the pool hold the operator's reservation,
				// which is at least what it uses.
				assert.GreaterOrEqual(t, got.Used, used)
				want.Used = got.Used
			}
			assert.Equal(t, *want, *got)
		case 1:
			n = min(n, used)
			op.Shrink(n)
			used -= n
		}
		require.Equal(t, used, op.Used())
		require.Equal(t, peak, op.Peak())
		// What the chain holds beyond use is bounded by two chunks per
		// level.
		require.GreaterOrEqual(t, p.Used(), used)
		require.LessOrEqual(t, p.Used(), used+4*chunk)
		require.Empty(t, checkLimits(p, []*Account{q, op}))
	}
	op.Shrink(used)
	op.Close()
	assert.Zero(t, q.Used())
	q.Close()
	assert.Zero(t, p.Used())
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
		accts = append(accts, top, mustOpen(t, top, "op", 0))
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
