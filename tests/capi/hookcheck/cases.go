package main

import (
	"context"
	"fmt"
	"strings"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
)

// outcome is what Cluster API concludes from a CanUpdate* answer.
type outcome int

const (
	// inPlace: the patches turn current into desired, so Cluster API updates in place.
	inPlace outcome = iota
	// partial: some changes are claimed, not all, so Cluster API replaces the machine.
	partial
	// refused: nothing is claimed, so Cluster API replaces the machine.
	refused
)

func (o outcome) String() string {
	return [...]string{"updated in place", "partially claimed (machine replaced)", "refused (machine replaced)"}[o]
}

func outcomeOf(claimed bool, c comparison) outcome {
	switch {
	case c.matches():
		return inPlace
	case claimed:
		return partial
	default:
		return refused
	}
}

// The versions of the cases: the bed holds a NodeRelease for each but v1.32.0. The release
// of toVersion says it updates control-plane nodes; the one of fromVersion does not, so a
// control-plane Machine moving to fromVersion is refused.
const (
	fromVersion      = "v1.31.2"
	toVersion        = "v1.31.3"
	olderVersion     = "v1.31.1"
	skippedToVersion = "v1.33.0"
)

type machineCase struct {
	name             string
	current, desired machineObjects
	want             outcome
}

type machineSetCase struct {
	name             string
	current, desired machineSetObjects
	want             outcome
}

// workerSide is a MachineDeployment's Machine with its objects (what UpdateMachine is
// called for in the cases).
func (t target) workerSide(version string, memoryMiB int64, config *bootstrapv1.KubeadmConfig) machineObjects {
	return machineObjects{machine: t.machine(version), bootstrap: config, infra: t.vsphereMachine(memoryMiB)}
}

// controlPlaneSide is a KubeadmControlPlane's Machine with its objects: KubeadmControlPlane
// is the controller that asks CanUpdateMachine.
func (t target) controlPlaneSide(version string, memoryMiB int64, config *bootstrapv1.KubeadmConfig) machineObjects {
	infra := t.vsphereMachine(memoryMiB)
	infra.SetName(controlPlaneMachine)
	return machineObjects{machine: t.controlPlaneMachineAt(version), bootstrap: config, infra: infra}
}

// withChangedFile is `config` with different content in its one file.
func withChangedFile(config *bootstrapv1.KubeadmConfig) *bootstrapv1.KubeadmConfig {
	config = config.DeepCopy()
	config.Spec.Files[0].Content = "net.ipv4.ip_forward = 1\nvm.max_map_count = 262144\n"
	return config
}

func (t target) machineCases() []machineCase {
	kc := t.controlPlaneKubeadmConfig()
	from := t.controlPlaneSide(fromVersion, 8192, kc)
	side := t.controlPlaneSide
	return []machineCase{
		{"can-update-machine-patch-version", from, side(toVersion, 8192, kc), inPlace},
		{"can-update-machine-nothing-differs", from, side(fromVersion, 8192, kc), inPlace},
		{"can-update-machine-infrastructure-field", from, side(fromVersion, 16384, kc), refused},
		{"can-update-machine-bootstrap-file", from, side(fromVersion, 8192, withChangedFile(kc)), refused},
		{"can-update-machine-version-and-infrastructure", from, side(toVersion, 16384, kc), partial},
		{"can-update-machine-minor-version-skip", from, side(skippedToVersion, 8192, kc), refused},
		{"can-update-machine-downgrade", from, side(olderVersion, 8192, kc), refused},
		{"can-update-machine-control-plane-without-opt-in", side(olderVersion, 8192, kc), from, refused},
	}
}

func (t target) machineSetCases() []machineSetCase {
	side := func(name, version, bootstrapTemplate, infraTemplate string, memoryMiB int64) machineSetObjects {
		return machineSetObjects{
			machineSet: t.machineSet(name, version, bootstrapTemplate, infraTemplate),
			bootstrap:  t.kubeadmConfigTemplate(bootstrapTemplate),
			infra:      t.vsphereMachineTemplate(infraTemplate, memoryMiB),
		}
	}
	from := side("workers-7d9f8", fromVersion, "workers-v1", "workers-v1", 8192)
	// A new MachineSet of the same MachineDeployment: Cluster API asks whether the old one
	// can become it, with templates that may have new names and the same content.
	return []machineSetCase{
		{"can-update-machineset-patch-version", from, side("workers-6c5b4", toVersion, "workers-v1", "workers-v2", 8192), inPlace},
		{"can-update-machineset-infrastructure-template-field", from, side("workers-6c5b4", fromVersion, "workers-v1", "workers-v2", 16384), refused},
		{"can-update-machineset-version-skip", from, side("workers-6c5b4", skippedToVersion, "workers-v1", "workers-v1", 8192), refused},
		{"can-update-machineset-downgrade", from, side("workers-6c5b4", olderVersion, "workers-v1", "workers-v1", 8192), refused},
	}
}

// runCanUpdate calls CanUpdateMachine and CanUpdateMachineSet for every case and checks
// Cluster API's conclusion against the expected one.
func runCanUpdate(ctx context.Context, c *runtimeClient, t target) []error {
	var failures []error
	for _, tc := range t.machineCases() {
		req := canUpdateMachineRequest(tc.current, tc.desired)
		resp := &runtimehooksv1.CanUpdateMachineResponse{}
		got, err := callAndJudge(ctx, c, tc.name, runtimehooksv1.CanUpdateMachine, req, resp, func() (outcome, error) { return judgeMachine(req, resp) })
		failures = appendMismatch(failures, tc.name, tc.want, got, err, resp.Message)
	}
	for _, tc := range t.machineSetCases() {
		req := canUpdateMachineSetRequest(tc.current, tc.desired)
		resp := &runtimehooksv1.CanUpdateMachineSetResponse{}
		got, err := callAndJudge(ctx, c, tc.name, runtimehooksv1.CanUpdateMachineSet, req, resp, func() (outcome, error) { return judgeMachineSet(req, resp) })
		failures = appendMismatch(failures, tc.name, tc.want, got, err, resp.Message)
	}
	return failures
}

func callAndJudge(ctx context.Context, c *runtimeClient, name string, hook runtimecatalog.Hook, req runtimehooksv1.RequestObject, resp runtimehooksv1.ResponseObject, judge func() (outcome, error)) (outcome, error) {
	if err := c.call(ctx, name, hook, req, resp); err != nil {
		return 0, err
	}
	return judge()
}

func appendMismatch(failures []error, name string, want, got outcome, err error, message string) []error {
	switch {
	case err != nil:
		failures = append(failures, fmt.Errorf("%s: %w", name, err))
	case got != want:
		failures = append(failures, fmt.Errorf("%s: Cluster API would conclude %q, want %q (message: %s)", name, got, want, message))
	case got == inPlace && strings.Contains(message, "not claimed"):
		// The message ends up in logs and conditions: it must not tell people that a
		// change was left out when Cluster API updates in place.
		failures = append(failures, fmt.Errorf("%s: Cluster API updates in place, yet the message says %q", name, message))
	default:
		fmt.Printf("ok   %s: %s (%s)\n", name, got, message)
	}
	return failures
}
