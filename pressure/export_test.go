package pressure

import "github.com/memctl/memctl/internal/memsignal"

// Makeup is memsignal.Makeup, for tests.
type Makeup = memsignal.Makeup

// Fakes replace what a Monitor acts through, for tests; a nil field keeps
// the real one.
type Fakes struct {
	Trim   func()
	Cancel func()
	Makeup func() (Makeup, error)
}

// StartWith is Start with fakes.
func StartWith(cfg Config, f Fakes) (*Monitor, error) {
	d := realDeps
	if f.Trim != nil {
		d.trim = func() bool { f.Trim(); return true }
	}
	if f.Cancel != nil {
		d.cancel = func() int { f.Cancel(); return 1 }
	}
	d.makeup = f.Makeup
	return start(cfg, d)
}

// AnonMakeup is a makeup that is mostly anonymous memory.
func AnonMakeup() (Makeup, error) {
	return Makeup{Anon: 200 << 20, Cache: 10 << 20, Own: 190 << 20, From: "test"}, nil
}
