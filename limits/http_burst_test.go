package limits

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scripted serves requests through a middleware whose handler grows ?n=
// bytes and holds them until the test ends the request.
type scripted struct {
	t      *testing.T
	h      http.Handler
	bursts atomic.Int64
}

type held struct {
	release chan struct{}
	done    chan struct{}
}

func newScripted(t *testing.T, p *Pool, limit int64) *scripted {
	s := &scripted{t: t}
	s.h = mustMiddleware(t, p, HTTPConfig{Limit: limit, AfterBurst: func() { s.bursts.Add(1) }})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		require.NoError(t, Grow(r.Context(), n))
		defer Shrink(r.Context(), n)
		grown := r.Context().Value(grownKey{}).(chan struct{})
		close(grown)
		<-r.Context().Value(releaseKey{}).(chan struct{})
	}))
	return s
}

type grownKey struct{}
type releaseKey struct{}

// start begins a request of n bytes and returns once it holds them.
func (s *scripted) start(n int64) held {
	hd := held{release: make(chan struct{}), done: make(chan struct{})}
	grown := make(chan struct{})
	r := httptest.NewRequest("GET", "/?n="+strconv.FormatInt(n, 10), nil)
	ctx := r.Context()
	r = r.WithContext(context.WithValue(context.WithValue(ctx, grownKey{}, grown), releaseKey{}, hd.release))
	go func() {
		defer close(hd.done)
		s.h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	<-grown
	return hd
}

// end ends the request and returns the bursts counted so far.
func (s *scripted) end(hd held) int64 {
	close(hd.release)
	<-hd.done
	return s.bursts.Load()
}

// Issue 19: requests that together peak above the threshold end a burst,
// when the last of them leaves the pool under half the threshold; each
// under the per-request threshold (32 MiB for a 64 MiB budget).
func TestMiddlewareBurstAcrossRequests(t *testing.T) {
	p := newTestPool(t, PoolConfig{Limit: 1 << 40})
	const limit = 64 * mib // threshold 32 MiB
	const r31 = 31_000_000

	t.Run("three concurrent 31 MB", func(t *testing.T) {
		s := newScripted(t, p, limit)
		a, b, c := s.start(r31), s.start(r31), s.start(r31)
		assert.Zero(t, s.end(a), "62 MB still held")
		assert.Zero(t, s.end(b), "31 MB still held: over half the threshold")
		assert.Equal(t, int64(1), s.end(c), "the last one ends the burst")
	})
	t.Run("two concurrent 20 MiB", func(t *testing.T) {
		s := newScripted(t, p, limit)
		a, b := s.start(20*mib), s.start(20*mib)
		s.end(b)
		assert.Equal(t, int64(1), s.end(a))
	})
	t.Run("staggered", func(t *testing.T) {
		// A and B overlap (62 MB), then C overlaps B: one burst, at C's end.
		s := newScripted(t, p, limit)
		a := s.start(r31)
		b := s.start(r31)
		assert.Zero(t, s.end(a))
		c := s.start(r31)
		assert.Zero(t, s.end(b))
		assert.Equal(t, int64(1), s.end(c))
		// The next stretch starts from zero: two small ones end none.
		d, e := s.start(mib), s.start(mib)
		s.end(d)
		assert.Equal(t, int64(1), s.end(e))
	})
	t.Run("together under the threshold", func(t *testing.T) {
		s := newScripted(t, p, limit)
		a, b, c := s.start(10*mib), s.start(10*mib), s.start(10*mib)
		s.end(a)
		s.end(b)
		assert.Zero(t, s.end(c), "30 MiB together is under 32 MiB")
	})
	t.Run("one after another", func(t *testing.T) {
		s := newScripted(t, p, limit)
		for range 5 {
			assert.Zero(t, s.end(s.start(r31)), "never together")
		}
	})
	t.Run("steady overlap", func(t *testing.T) {
		// Eight requests of 1 MiB always in flight, 400 in all: the pool
		// never holds the threshold, so no burst.
		s := newScripted(t, p, limit)
		var q []held
		for range 8 {
			q = append(q, s.start(mib))
		}
		for range 400 {
			s.end(q[0])
			q = append(q[1:], s.start(mib))
		}
		for _, h := range q {
			s.end(h)
		}
		assert.Zero(t, s.bursts.Load())
	})
	t.Run("high steady load ends one burst when it falls", func(t *testing.T) {
		// Four 12 MiB requests always in flight (48 MiB): the burst ends
		// only when the load falls under 16 MiB.
		s := newScripted(t, p, limit)
		var q []held
		for range 4 {
			q = append(q, s.start(12*mib))
		}
		for range 40 {
			assert.Zero(t, s.end(q[0]))
			q = append(q[1:], s.start(12*mib))
		}
		s.end(q[0])
		assert.Zero(t, s.end(q[1]), "24 MiB left")
		assert.Equal(t, int64(1), s.end(q[2]), "12 MiB left: under half the threshold")
		assert.Equal(t, int64(1), s.end(q[3]), "one burst")
	})
	assert.Zero(t, p.Used())
}
