package trim

import (
	"sync"
	"testing"
	"time"
)

// mutexTimer is the simple alternative AfterBurst is measured against: a
// mutex around time.Timer.Reset, which also debounces.
type mutexTimer struct {
	mu    sync.Mutex
	timer *time.Timer
	delay time.Duration
}

func (m *mutexTimer) AfterBurst() {
	m.mu.Lock()
	if m.timer == nil {
		m.timer = time.AfterFunc(m.delay, func() {})
	} else {
		m.timer.Reset(m.delay)
	}
	m.mu.Unlock()
}

func (m *mutexTimer) stop() {
	m.mu.Lock()
	if m.timer != nil {
		m.timer.Stop()
	}
	m.mu.Unlock()
}

// benchTrimmer returns a Trimmer with the default delay whose trims do
// nothing, closed when the benchmark ends.
func benchTrimmer(b *testing.B) *Trimmer {
	tr, err := newT(testConfig{Config: Config{NoCHeap: true}, hooks: hooks{goStep: func() int64 { return 0 }}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tr.Close() })
	return tr
}

func BenchmarkAfterBurst(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		tr := benchTrimmer(b)
		b.ReportAllocs()
		for b.Loop() {
			tr.AfterBurst()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		tr := benchTrimmer(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				tr.AfterBurst()
			}
		})
	})
}

func BenchmarkAfterBurstMutexTimer(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		m := &mutexTimer{delay: defaultDelay}
		b.Cleanup(m.stop)
		b.ReportAllocs()
		for b.Loop() {
			m.AfterBurst()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		m := &mutexTimer{delay: defaultDelay}
		b.Cleanup(m.stop)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				m.AfterBurst()
			}
		})
	})
}

// BenchmarkBeginEnd is one Begin and its end (which calls AfterBurst).
func BenchmarkBeginEnd(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		tr := benchTrimmer(b)
		b.ReportAllocs()
		for b.Loop() {
			tr.Begin()()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		tr := benchTrimmer(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				tr.Begin()()
			}
		})
	})
}

// disarm returns an armed Trimmer to idle without running its tick; for
// BenchmarkAfterBurstFromIdle (the delay is long enough that the tick never
// fires during the benchmark).
func (t *Trimmer) disarm() {
	t.mu.Lock()
	if t.armed && t.timer.Stop() {
		t.armed = false
		t.ticks.Done()
	}
	t.mu.Unlock()
	t.dirty.Store(0)
	t.state.CompareAndSwap(statePending, stateIdle)
}

// BenchmarkAfterBurstFromIdle is the slow path: the first AfterBurst after
// the Trimmer went idle, which sets the timer (disarming is included).
func BenchmarkAfterBurstFromIdle(b *testing.B) {
	tr := benchTrimmer(b)
	b.ReportAllocs()
	for b.Loop() {
		tr.AfterBurst()
		tr.disarm()
	}
}
