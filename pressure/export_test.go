package pressure

// Makeup is what the memory under pressure is made of, for tests.
type Makeup = makeup

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

// Parsers and readers of the kernel's sources, for tests.
var (
	SystemdTrigger = systemdTrigger
	HostMakeup     = hostMakeup
	MakeupOfStat   = makeupOfStat
	EventsGrowth   = eventsGrowth
)

// Known is makeup.known, for tests.
func (m Makeup) Known() bool { return m.known() }

// Anonymous is makeup.anonymous, for tests.
func (m Makeup) Anonymous() bool { return m.anonymous() }
