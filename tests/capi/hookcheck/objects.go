package main

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"
)

// The workload cluster the objects belong to; the test bed passes its names on the command line.
type target struct {
	namespace string
	cluster   string
	node      string
}

const infraAPIVersion = "infrastructure.cluster.x-k8s.io/v1beta1"

func (t target) meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:      name,
		Namespace: t.namespace,
		Labels: map[string]string{
			clusterv1.ClusterNameLabel:           t.cluster,
			clusterv1.MachineDeploymentNameLabel: "workers",
		},
	}
}

// machineSpec is a worker's spec at `version`, as a MachineDeployment stamps it out.
func (t target) machineSpec(version string) clusterv1.MachineSpec {
	return clusterv1.MachineSpec{
		ClusterName: t.cluster,
		Bootstrap: clusterv1.Bootstrap{
			ConfigRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: bootstrapv1.GroupVersion.Group,
				Kind:     "KubeadmConfig",
				Name:     "workers-kc7vz",
			},
			DataSecretName: ptr.To("workers-kc7vz"),
		},
		InfrastructureRef: clusterv1.ContractVersionedObjectReference{
			APIGroup: "infrastructure.cluster.x-k8s.io",
			Kind:     "VSphereMachine",
			Name:     "workers-9xq2d",
		},
		Version:       version,
		ProviderID:    "vsphere://4231c1a0-5b2e-4f5c-9d3e-6a7b8c9d0e1f",
		FailureDomain: "zone-a",
		Deletion: clusterv1.MachineDeletionSpec{
			NodeDrainTimeoutSeconds: ptr.To[int32](300),
		},
	}
}

// machine is the worker Machine at `version` on the node, with status as the management
// cluster holds it (Cluster API strips status from hook requests).
func (t target) machine(version string) *clusterv1.Machine {
	m := &clusterv1.Machine{
		TypeMeta:   metav1.TypeMeta{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine"},
		ObjectMeta: t.meta("workers-7d9f8-x2k4p"),
		Spec:       t.machineSpec(version),
	}
	m.Status.NodeRef = clusterv1.MachineNodeReference{Name: t.node}
	return m
}

// inPlaceMarked is the Machine as Cluster API leaves it once it decided to update it in
// place and before UpdateMachine is done.
func inPlaceMarked(m *clusterv1.Machine) *clusterv1.Machine {
	m = m.DeepCopy()
	m.Annotations = map[string]string{
		clusterv1.UpdateInProgressAnnotation: "",
		runtimev1.PendingHooksAnnotation:     "UpdateMachine",
	}
	return m
}

func kubeadmConfigSpec() bootstrapv1.KubeadmConfigSpec {
	return bootstrapv1.KubeadmConfigSpec{
		JoinConfiguration: bootstrapv1.JoinConfiguration{
			NodeRegistration: bootstrapv1.NodeRegistrationOptions{
				CRISocket: "unix:///run/containerd/containerd.sock",
				KubeletExtraArgs: []bootstrapv1.Arg{
					{Name: "cloud-provider", Value: ptr.To("external")},
				},
			},
		},
		Files: []bootstrapv1.File{{
			Path:        "/etc/sysctl.d/90-kubernetes.conf",
			Owner:       "root:root",
			Permissions: "0644",
			Content:     "net.ipv4.ip_forward = 1\n",
		}},
		PreKubeadmCommands: []string{"sysctl --system"},
	}
}

func (t target) kubeadmConfig() *bootstrapv1.KubeadmConfig {
	return &bootstrapv1.KubeadmConfig{
		TypeMeta:   metav1.TypeMeta{APIVersion: bootstrapv1.GroupVersion.String(), Kind: "KubeadmConfig"},
		ObjectMeta: t.meta("workers-kc7vz"),
		Spec:       kubeadmConfigSpec(),
	}
}

func (t target) kubeadmConfigTemplate(name string) *bootstrapv1.KubeadmConfigTemplate {
	return &bootstrapv1.KubeadmConfigTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: bootstrapv1.GroupVersion.String(), Kind: "KubeadmConfigTemplate"},
		ObjectMeta: t.meta(name),
		Spec: bootstrapv1.KubeadmConfigTemplateSpec{
			Template: bootstrapv1.KubeadmConfigTemplateResource{Spec: kubeadmConfigSpec()},
		},
	}
}

// vsphereSpec is a vSphere-shaped infrastructure machine spec: Cluster API knows nothing
// of it but its place, so it travels unstructured.
func vsphereSpec(memoryMiB int64) map[string]interface{} {
	return map[string]interface{}{
		"cloneMode":                "linkedClone",
		"datacenter":               "dc-1",
		"datastore":                "ds-ssd",
		"diskGiB":                  int64(40),
		"folder":                   "workers",
		"memoryMiB":                memoryMiB,
		"numCPUs":                  int64(4),
		"resourcePool":             "pool-a",
		"server":                   "vcenter.example.internal",
		"template":                 "ubuntu-2404-kube-v1.31",
		"network":                  map[string]interface{}{"devices": []interface{}{map[string]interface{}{"networkName": "vm-net", "dhcp4": true}}},
		"providerID":               "vsphere://4231c1a0-5b2e-4f5c-9d3e-6a7b8c9d0e1f",
		"powerOffMode":             "trySoft",
		"guestSoftPowerOffTimeout": "5m0s",
	}
}

func (t target) vsphereMachine(memoryMiB int64) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": infraAPIVersion,
		"kind":       "VSphereMachine",
		"spec":       vsphereSpec(memoryMiB),
	}}
	u.SetName("workers-9xq2d")
	u.SetNamespace(t.namespace)
	u.SetLabels(map[string]string{clusterv1.ClusterNameLabel: t.cluster})
	return u
}

func (t target) vsphereMachineTemplate(name string, memoryMiB int64) *unstructured.Unstructured {
	spec := vsphereSpec(memoryMiB)
	delete(spec, "providerID")
	u := &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": infraAPIVersion,
		"kind":       "VSphereMachineTemplate",
		"spec":       map[string]interface{}{"template": map[string]interface{}{"spec": spec}},
	}}
	u.SetName(name)
	u.SetNamespace(t.namespace)
	u.SetLabels(map[string]string{clusterv1.ClusterNameLabel: t.cluster})
	return u
}

// machineSet is the MachineDeployment's MachineSet whose template brings `version`.
func (t target) machineSet(name, version, bootstrapTemplate, infraTemplate string) *clusterv1.MachineSet {
	spec := t.machineSpec(version)
	spec.Bootstrap = clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
		APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfigTemplate", Name: bootstrapTemplate,
	}}
	spec.InfrastructureRef.Kind = "VSphereMachineTemplate"
	spec.InfrastructureRef.Name = infraTemplate
	spec.ProviderID = ""
	spec.FailureDomain = ""
	selector := map[string]string{clusterv1.ClusterNameLabel: t.cluster, clusterv1.MachineDeploymentNameLabel: "workers"}
	return &clusterv1.MachineSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: clusterv1.GroupVersion.String(), Kind: "MachineSet"},
		ObjectMeta: t.meta(name),
		Spec: clusterv1.MachineSetSpec{
			ClusterName: t.cluster,
			Replicas:    ptr.To[int32](3),
			Selector:    metav1.LabelSelector{MatchLabels: selector},
			Template: clusterv1.MachineTemplateSpec{
				ObjectMeta: clusterv1.ObjectMeta{Labels: selector},
				Spec:       spec,
			},
		},
	}
}

// extensionConfig registers the extension with Cluster API: its URL and the CA its serving
// certificate is verified against.
func extensionConfig(extensionURL string, caBundle []byte) *runtimev1.ExtensionConfig {
	return &runtimev1.ExtensionConfig{
		TypeMeta:   metav1.TypeMeta{APIVersion: runtimev1.GroupVersion.String(), Kind: "ExtensionConfig"},
		ObjectMeta: metav1.ObjectMeta{Name: "inplace"},
		Spec: runtimev1.ExtensionConfigSpec{
			ClientConfig: runtimev1.ClientConfig{URL: extensionURL, CABundle: caBundle},
		},
	}
}

// managementObjects are the Cluster API objects of the cases, for the test bed to store in
// the management cluster, where Cluster API's own CRDs validate them.
func (t target) managementObjects(config *runtimev1.ExtensionConfig) []interface{} {
	return []interface{}{
		config,
		t.kubeadmConfig(),
		t.controlPlaneKubeadmConfig(),
		t.kubeadmControlPlane(),
		t.kubeadmConfigTemplate("workers-v1"),
		t.machineSet("workers-7d9f8", fromVersion, "workers-v1", "workers-v1"),
	}
}

// The control plane's names: KubeadmControlPlane is who asks CanUpdateMachine.
const (
	controlPlaneName    = "c1-control-plane"
	controlPlaneMachine = "c1-control-plane-x8v2k"
)

// controlPlaneMeta is a control-plane object's metadata: the control-plane label instead
// of the MachineDeployment's.
func (t target) controlPlaneMeta(name string) metav1.ObjectMeta {
	meta := t.meta(name)
	delete(meta.Labels, clusterv1.MachineDeploymentNameLabel)
	meta.Labels[clusterv1.MachineControlPlaneLabel] = ""
	return meta
}

// controlPlaneMachineAt is a control-plane Machine of the KubeadmControlPlane at `version`.
func (t target) controlPlaneMachineAt(version string) *clusterv1.Machine {
	m := t.machine(version)
	m.ObjectMeta = t.controlPlaneMeta(controlPlaneMachine)
	m.Spec.Bootstrap.ConfigRef.Name = controlPlaneMachine
	m.Spec.Bootstrap.DataSecretName = ptr.To(controlPlaneMachine)
	m.Spec.InfrastructureRef.Name = controlPlaneMachine
	m.Spec.ProviderID = "vsphere://4231c1a0-0c1d-4e2f-8a9b-0c1d2e3f4a5b"
	return m
}

// controlPlaneKubeadmConfig is the KubeadmConfig of a control-plane Machine that joined the
// first one.
func (t target) controlPlaneKubeadmConfig() *bootstrapv1.KubeadmConfig {
	config := t.kubeadmConfig()
	config.ObjectMeta = t.controlPlaneMeta(controlPlaneMachine)
	config.Spec.JoinConfiguration.ControlPlane = &bootstrapv1.JoinControlPlane{}
	return config
}

func (t target) kubeadmControlPlane() *controlplanev1.KubeadmControlPlane {
	spec := kubeadmConfigSpec()
	spec.JoinConfiguration.ControlPlane = &bootstrapv1.JoinControlPlane{}
	return &controlplanev1.KubeadmControlPlane{
		TypeMeta:   metav1.TypeMeta{APIVersion: controlplanev1.GroupVersion.String(), Kind: "KubeadmControlPlane"},
		ObjectMeta: metav1.ObjectMeta{Name: controlPlaneName, Namespace: t.namespace, Labels: map[string]string{clusterv1.ClusterNameLabel: t.cluster}},
		Spec: controlplanev1.KubeadmControlPlaneSpec{
			Replicas: ptr.To[int32](3),
			Version:  fromVersion,
			MachineTemplate: controlplanev1.KubeadmControlPlaneMachineTemplate{
				Spec: controlplanev1.KubeadmControlPlaneMachineTemplateSpec{
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "VSphereMachineTemplate", Name: controlPlaneName,
					},
				},
			},
			KubeadmConfigSpec: spec,
		},
	}
}
