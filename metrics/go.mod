module github.com/memctl/memctl/metrics

go 1.26.0

// For development in this repository: the metrics module builds against the
// memctl module next to it (users get the v0.1.0 it requires; the tag
// metrics/v0.1.0 releases this module).
// The module walks the metric table of the memctl module's
// internal/metrictable: a release must require a memctl version with the
// same table.
replace github.com/memctl/memctl => ../

require (
	github.com/memctl/memctl v0.1.0
	github.com/prometheus/client_golang v1.25.0
	github.com/prometheus/client_model v0.6.3
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/KimMachineGun/automemlimit v1.0.1 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/kylelemons/godebug v1.1.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pbnjay/memory v0.0.0-20210728143218-7b4eea64cf58 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.50.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
