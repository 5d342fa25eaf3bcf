module github.com/memctl/memctl/connectbudget

go 1.26.0

replace github.com/memctl/memctl => ../

require (
	connectrpc.com/connect v1.21.1
	github.com/memctl/memctl v0.1.0
	github.com/stretchr/testify v1.12.1
	google.golang.org/protobuf v1.36.11
)

require (
	github.com/KimMachineGun/automemlimit v1.0.1 // indirect
	github.com/pbnjay/memory v0.0.0-20210728143218-7b4eea64cf58 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
