package main

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
)

// The objects of one side of a CanUpdateMachine request, before Cluster API trims them.
type machineObjects struct {
	machine   *clusterv1.Machine
	bootstrap runtime.Object
	infra     *unstructured.Unstructured
}

// The objects of one side of a CanUpdateMachineSet request.
type machineSetObjects struct {
	machineSet *clusterv1.MachineSet
	bootstrap  runtime.Object
	infra      *unstructured.Unstructured
}

// trimmed is what Cluster API puts of a provider object into a hook request: its type,
// name, namespace, labels, annotations and spec, nothing else (no status, no managed
// fields), as an Unstructured object.
func trimmed(object runtime.Object) runtime.RawExtension {
	raw, err := json.Marshal(object)
	if err != nil {
		panic(err)
	}
	full := &unstructured.Unstructured{}
	if err := json.Unmarshal(raw, &full.Object); err != nil {
		panic(err)
	}
	out := &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": full.GetAPIVersion(),
		"kind":       full.GetKind(),
		"spec":       full.Object["spec"],
	}}
	out.SetName(full.GetName())
	out.SetNamespace(full.GetNamespace())
	out.SetLabels(full.GetLabels())
	out.SetAnnotations(full.GetAnnotations())
	bytes, err := json.Marshal(out)
	if err != nil {
		panic(err)
	}
	return runtime.RawExtension{Raw: bytes, Object: out}
}

// trimmedMachine is the Machine as hook requests carry it: spec and identifying metadata.
func trimmedMachine(m *clusterv1.Machine) clusterv1.Machine {
	return clusterv1.Machine{
		TypeMeta: metav1.TypeMeta{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine"},
		ObjectMeta: metav1.ObjectMeta{
			Name: m.Name, Namespace: m.Namespace, Labels: m.Labels, Annotations: m.Annotations,
		},
		Spec: *m.Spec.DeepCopy(),
	}
}

func trimmedMachineSet(ms *clusterv1.MachineSet) clusterv1.MachineSet {
	return clusterv1.MachineSet{
		TypeMeta: metav1.TypeMeta{APIVersion: clusterv1.GroupVersion.String(), Kind: "MachineSet"},
		ObjectMeta: metav1.ObjectMeta{
			Name: ms.Name, Namespace: ms.Namespace, Labels: ms.Labels, Annotations: ms.Annotations,
		},
		Spec: *ms.Spec.DeepCopy(),
	}
}

func canUpdateMachineRequest(current, desired machineObjects) *runtimehooksv1.CanUpdateMachineRequest {
	side := func(o machineObjects) runtimehooksv1.CanUpdateMachineRequestObjects {
		return runtimehooksv1.CanUpdateMachineRequestObjects{
			Machine:               trimmedMachine(o.machine),
			InfrastructureMachine: trimmed(o.infra),
			BootstrapConfig:       trimmed(o.bootstrap),
		}
	}
	return &runtimehooksv1.CanUpdateMachineRequest{Current: side(current), Desired: side(desired)}
}

func canUpdateMachineSetRequest(current, desired machineSetObjects) *runtimehooksv1.CanUpdateMachineSetRequest {
	side := func(o machineSetObjects) runtimehooksv1.CanUpdateMachineSetRequestObjects {
		return runtimehooksv1.CanUpdateMachineSetRequestObjects{
			MachineSet:                    trimmedMachineSet(o.machineSet),
			InfrastructureMachineTemplate: trimmed(o.infra),
			BootstrapConfigTemplate:       trimmed(o.bootstrap),
		}
	}
	return &runtimehooksv1.CanUpdateMachineSetRequest{Current: side(current), Desired: side(desired)}
}

// updateMachineRequest is what the Machine controller sends: the desired objects, trimmed
// (so no status, hence no nodeRef: the extension must find the node itself).
func updateMachineRequest(desired machineObjects) *runtimehooksv1.UpdateMachineRequest {
	return &runtimehooksv1.UpdateMachineRequest{Desired: runtimehooksv1.UpdateMachineRequestObjects{
		Machine:               trimmedMachine(desired.machine),
		InfrastructureMachine: trimmed(desired.infra),
		BootstrapConfig:       trimmed(desired.bootstrap),
	}}
}

// Patch outcome helpers: what Cluster API concludes after applying a response's patches.

func judgeMachine(req *runtimehooksv1.CanUpdateMachineRequest, resp *runtimehooksv1.CanUpdateMachineResponse) (outcome, error) {
	var c comparison
	spec, err := machineSpecAfter(req.Current.Machine, resp.MachinePatch, "spec")
	if err != nil {
		return 0, err
	}
	c.machineSpec("machine", spec, req.Desired.Machine.Spec)
	for _, p := range []struct {
		label            string
		current, desired runtime.RawExtension
		patch            runtimehooksv1.Patch
	}{
		{"bootstrapConfig", req.Current.BootstrapConfig, req.Desired.BootstrapConfig, resp.BootstrapConfigPatch},
		{"infrastructureMachine", req.Current.InfrastructureMachine, req.Desired.InfrastructureMachine, resp.InfrastructureMachinePatch},
	} {
		patched, err := patchedPart(p.current.Object, p.patch, "spec")
		if err != nil {
			return 0, err
		}
		c.part(p.label, patched, at(p.desired.Object.(*unstructured.Unstructured).Object, "spec"))
	}
	claimed := resp.MachinePatch.IsDefined() || resp.BootstrapConfigPatch.IsDefined() || resp.InfrastructureMachinePatch.IsDefined()
	return outcomeOf(claimed, c), nil
}

func judgeMachineSet(req *runtimehooksv1.CanUpdateMachineSetRequest, resp *runtimehooksv1.CanUpdateMachineSetResponse) (outcome, error) {
	var c comparison
	template := []string{"spec", "template", "spec"}
	spec, err := machineSpecAfter(req.Current.MachineSet, resp.MachineSetPatch, template...)
	if err != nil {
		return 0, err
	}
	c.machineSpec("machineSet", spec, req.Desired.MachineSet.Spec.Template.Spec)
	for _, p := range []struct {
		label            string
		current, desired runtime.RawExtension
		patch            runtimehooksv1.Patch
	}{
		{"bootstrapConfigTemplate", req.Current.BootstrapConfigTemplate, req.Desired.BootstrapConfigTemplate, resp.BootstrapConfigTemplatePatch},
		{"infrastructureMachineTemplate", req.Current.InfrastructureMachineTemplate, req.Desired.InfrastructureMachineTemplate, resp.InfrastructureMachineTemplatePatch},
	} {
		patched, err := patchedPart(p.current.Object, p.patch, template...)
		if err != nil {
			return 0, err
		}
		c.part(p.label, patched, at(p.desired.Object.(*unstructured.Unstructured).Object, template...))
	}
	claimed := resp.MachineSetPatch.IsDefined() || resp.BootstrapConfigTemplatePatch.IsDefined() || resp.InfrastructureMachineTemplatePatch.IsDefined()
	return outcomeOf(claimed, c), nil
}
