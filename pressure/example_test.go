package pressure_test

import (
	"log"

	"github.com/memctl/memctl/pressure"
)

// A service sheds load while the GC spirals and flushes a cache when the
// kernel signals memory pressure. The channel drops events when full, so a
// slow reader never holds up the GC-end hook or the watcher.
func ExampleMonitor_Subscribe() {
	m, err := pressure.Start(pressure.Config{})
	if err != nil {
		log.Printf("pressure: %v", err) // the detector runs all the same
	}
	defer m.Close()
	events, cancel := m.Subscribe(16)
	defer cancel()
	go func() {
		for e := range events { // ends at cancel or Close
			switch e.Kind {
			case pressure.KindSpiral:
				log.Printf("GC death spiral: GC at %.0f%% of the CPU, live heap %d of %d bytes",
					100*e.GCShare, e.LiveHeap, e.GoMemLimit)
			case pressure.KindSpiralEnd:
				log.Print("GC death spiral over")
			case pressure.KindKernel:
				log.Printf("kernel memory pressure (%s): flushing the cache", e.Source)
			}
		}
	}()
}
