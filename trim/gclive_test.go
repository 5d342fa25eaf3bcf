package trim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadSample(t *testing.T) {
	h := readSample()
	assert.Positive(t, h.HeapObjects)
	assert.Positive(t, h.Live)
}

// The GC-end hook's cost per cycle, given the sample.
func BenchmarkGCEndHook(b *testing.B) {
	tr, err := New(Config{NoCHeap: true})
	require.NoError(b, err)
	defer tr.Close()
	tr.gcSub.Stop() // the benchmark is the only caller of gcEnd
	b.ReportAllocs()
	live := readSample().Live
	for b.Loop() {
		tr.atGCEnd(live)
	}
}

// gcEnd reads the live heap now and records it as a GC end would.
func (t *Trimmer) gcEnd() bool { return t.atGCEnd(readSample().Live) }
