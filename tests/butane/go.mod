// Test bed only: pins the real Butane (coreos/butane) that tests/tests/butane_flatcar.rs runs
// on packaging/node/flatcar/inplace-agent.bu. Nothing in this module ships.
module inplace.dev/tests/butane

go 1.25

tool github.com/coreos/butane/internal

require (
	github.com/aws/aws-sdk-go v1.55.6 // indirect
	github.com/clarketm/json v1.17.1 // indirect
	github.com/coreos/butane v0.25.0 // indirect
	github.com/coreos/go-json v0.0.0-20230131223807-18775e0fb4fb // indirect
	github.com/coreos/go-semver v0.3.1 // indirect
	github.com/coreos/go-systemd/v22 v22.7.0 // indirect
	github.com/coreos/ignition/v2 v2.21.0 // indirect
	github.com/coreos/vcontext v0.0.0-20230201181013-d72178a18687 // indirect
	github.com/davecgh/go-spew v1.1.2-0.20180830191138-d8f796af33cc // indirect
	github.com/kr/text v0.2.0 // indirect
	github.com/pmezard/go-difflib v1.0.1-0.20181226105442-5d4384ee4fb2 // indirect
	github.com/rogpeppe/go-internal v1.16.0 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	github.com/stretchr/testify v1.10.0 // indirect
	github.com/vincent-petithory/dataurl v1.0.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)
