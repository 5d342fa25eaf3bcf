package limits_test

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/memctl/memctl/limits"
)

// A queue consumer runs each message's job under an account of its own
// with Pool.Do: the job charges what it builds, the one that would take it
// past its budget is refused with resource_exhausted (and is not retried:
// a retry meets the same budget), and the next message is served as usual.
// Each job's peak goes into the pool's histogram, in every mode.
func ExamplePool_Do() {
	pool, _ := limits.NewPool(limits.PoolConfig{Name: "jobs", Limit: 256 << 20})
	defer pool.Close()

	// sortJob sorts n values: 8·n bytes, charged before they are built.
	sortJob := func(ctx context.Context, n int) error {
		if err := limits.Grow(ctx, 8*int64(n)); err != nil {
			return fmt.Errorf("sort %d values: %w", n, err)
		}
		defer limits.Shrink(ctx, 8*int64(n))
		v := make([]int64, n)
		for i := range v {
			v[i] = int64(n - i)
		}
		slices.Sort(v)
		return nil
	}
	messages := []struct {
		id string
		n  int
	}{{"msg-1", 1_000}, {"msg-2", 50_000_000}, {"msg-3", 100_000}}
	for _, m := range messages {
		err := pool.Do(context.Background(), limits.WorkConfig{Name: m.id, Limit: 64 << 20}, func(ctx context.Context) error {
			return sortJob(ctx, m.n)
		})
		switch {
		case errors.Is(err, limits.ErrResourceExhausted):
			fmt.Println(m.id, "dropped:", err)
		case err != nil:
			fmt.Println(m.id, "failed:", err)
		default:
			fmt.Println(m.id, "done")
		}
	}
	st := pool.Stats()
	fmt.Println("jobs:", st.Peaks.Count, "over 64 MiB:", st.Peaks.Above(64<<20), "in flight:", st.InFlight)
	// Output:
	// msg-1 done
	// msg-2 dropped: sort 50000000 values: limits: resource_exhausted in jobs/msg-2: requested 400000000 bytes, 0 in use, limit 67108864
	// msg-3 done
	// jobs: 3 over 64 MiB: 1 in flight: 0
}
