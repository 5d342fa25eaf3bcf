module github.com/memctl/memctl

go 1.26.0

require (
	github.com/KimMachineGun/automemlimit v1.0.1
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.25.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/pbnjay/memory v0.0.0-20210728143218-7b4eea64cf58 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
