package pressure

// WithMakeup returns cfg with the reading of what the memory under
// pressure is made of replaced by f, for tests.
func WithMakeup(cfg Config, f func() (Makeup, error)) Config {
	cfg.makeup = f
	return cfg
}

// AnonMakeup is a makeup that is mostly anonymous memory.
func AnonMakeup() (Makeup, error) {
	return Makeup{Anon: 200 << 20, Cache: 10 << 20, Own: 190 << 20, From: "test"}, nil
}

// HostMakeup is hostMakeup, for tests.
var HostMakeup = hostMakeup

// SystemdTrigger is systemdTrigger, for tests.
var SystemdTrigger = systemdTrigger

// EventsGrowth is eventsGrowth, for tests.
var EventsGrowth = eventsGrowth

// MakeupOfStat is makeupOfStat, for tests.
var MakeupOfStat = makeupOfStat

// MeminfoMakeup is meminfoMakeup, for tests.
var MeminfoMakeup = meminfoMakeup
