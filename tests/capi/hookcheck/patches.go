package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"k8s.io/apimachinery/pkg/api/equality"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
)

// applyPatch applies one response patch to the JSON of an object, with the JSON Patch
// (RFC 6902) and JSON Merge Patch (RFC 7386) library Cluster API applies them with. An
// undefined patch leaves the object as it is.
func applyPatch(object []byte, patch runtimehooksv1.Patch) ([]byte, error) {
	if !patch.IsDefined() {
		return object, nil
	}
	switch patch.PatchType {
	case runtimehooksv1.JSONPatchType:
		operations, err := jsonpatch.DecodePatch(patch.Patch)
		if err != nil {
			return nil, fmt.Errorf("decoding the JSON patch %s: %w", patch.Patch, err)
		}
		return operations.Apply(object)
	case runtimehooksv1.JSONMergePatchType:
		return jsonpatch.MergePatch(object, patch.Patch)
	default:
		return nil, fmt.Errorf("unknown patchType %q", patch.PatchType)
	}
}

// at walks `fields` down a JSON object.
func at(object map[string]interface{}, fields ...string) interface{} {
	var value interface{} = object
	for _, field := range fields {
		m, ok := value.(map[string]interface{})
		if !ok {
			return nil
		}
		value = m[field]
	}
	return value
}

// patchedPart is the part under `fields` of `object` once `patch` is applied. Cluster API
// takes only that part from the patched object (changes elsewhere are dropped).
func patchedPart(object interface{}, patch runtimehooksv1.Patch, fields ...string) (interface{}, error) {
	raw, err := json.Marshal(object)
	if err != nil {
		return nil, err
	}
	patched, err := applyPatch(raw, patch)
	if err != nil {
		return nil, err
	}
	var decoded map[string]interface{}
	if err := json.Unmarshal(patched, &decoded); err != nil {
		return nil, err
	}
	return at(decoded, fields...), nil
}

// comparableMachineSpec drops what Cluster API leaves out of its "current + patches ==
// desired" comparison: fields that never change, are not the extension's business, or are
// changed in place by Cluster API itself (so they never call for an in-place update).
func comparableMachineSpec(spec clusterv1.MachineSpec) clusterv1.MachineSpec {
	spec = *spec.DeepCopy()
	spec.ClusterName = ""
	spec.Bootstrap = clusterv1.Bootstrap{}
	spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{}
	spec.ProviderID = ""
	spec.MinReadySeconds = nil
	spec.ReadinessGates = nil
	spec.Deletion.NodeDrainTimeoutSeconds = nil
	spec.Deletion.NodeVolumeDetachTimeoutSeconds = nil
	spec.Deletion.NodeDeletionTimeoutSeconds = nil
	spec.Taints = nil
	return spec
}

// machineSpecAfter is the current Machine spec (at `fields` of `object`) with `patch` applied.
func machineSpecAfter(object interface{}, patch runtimehooksv1.Patch, fields ...string) (clusterv1.MachineSpec, error) {
	var spec clusterv1.MachineSpec
	part, err := patchedPart(object, patch, fields...)
	if err != nil {
		return spec, err
	}
	raw, err := json.Marshal(part)
	if err != nil {
		return spec, err
	}
	// Strict, as a typed object: a patch that writes a field the Machine does not have is
	// a patch Cluster API cannot honour.
	decoder := json.NewDecoder(bytes.NewReader(raw))
	decoder.DisallowUnknownFields()
	return spec, decoder.Decode(&spec)
}

// comparison is what Cluster API would conclude from one CanUpdate* answer.
type comparison struct {
	// differing names the objects that still differ after the patches.
	differing []string
}

func (c *comparison) machineSpec(label string, patched, desired clusterv1.MachineSpec) {
	if !equality.Semantic.DeepEqual(comparableMachineSpec(patched), comparableMachineSpec(desired)) {
		c.differing = append(c.differing, label)
	}
}

func (c *comparison) part(label string, patched, desired interface{}) {
	if !reflect.DeepEqual(patched, desired) {
		c.differing = append(c.differing, label)
	}
}

// matches says whether Cluster API would now update in place.
func (c *comparison) matches() bool { return len(c.differing) == 0 }
