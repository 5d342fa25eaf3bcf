module github.com/memctl/memctl/otelmetrics

go 1.26.0

// For development in this repository: the otelmetrics module builds against
// the memctl module next to it (users get the version it requires; the tag
// otelmetrics/v0.1.0 releases this module).
// The module walks the metric table of the memctl module's
// internal/metrictable: a release must require a memctl version with the
// same table.
replace github.com/memctl/memctl => ../

require (
	github.com/memctl/memctl v0.1.0
	github.com/stretchr/testify v1.12.1
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/metric v1.47.0
	go.opentelemetry.io/otel/sdk/metric v1.47.0
)

require (
	github.com/KimMachineGun/automemlimit v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/pbnjay/memory v0.0.0-20210728143218-7b4eea64cf58 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/sdk v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
