package k8s

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	eppconfig "sigs.k8s.io/gateway-api-inference-extension/apix/config/v1alpha1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/brokerd/brokerd/server/config"
)

const namespace = "brokerd"

// PodMonitor is the part of monitoring.coreos.com/v1 PodMonitor the base
// uses. It is not in k8s.io/api; decoding strictly into it still rejects a
// field the manifest misspells or one this struct does not know.
type PodMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
			Scheme   string `json:"scheme"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// object is one decoded manifest: its kind and name, the typed value and the
// document it came from.
type object struct {
	kind, name, namespace string
	value                 any
	doc                   []byte
}

// newTyped returns an empty value of the Go type for apiVersion/kind.
func newTyped(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}, nil
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "monitoring.coreos.com/v1 PodMonitor":
		return &PodMonitor{}, nil
	case "rbac.authorization.k8s.io/v1 Role":
		return &rbacv1.Role{}, nil
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return &rbacv1.RoleBinding{}, nil
	case infv1.GroupVersion.String() + " InferencePool":
		return &infv1.InferencePool{}, nil
	case eppconfig.GroupVersion.String() + " EndpointPickerConfig":
		// Not an object of the API server: the picker's file, in a
		// ConfigMap. Its plugins' parameters are checked too.
		return &eppFile{}, nil
	}
	return nil, fmt.Errorf("no Go type for %s %s: add it to newTyped", apiVersion, kind)
}

// decodeStrict decodes one YAML document into its k8s.io/api type; an unknown
// or misspelt field, or a duplicate key, is an error.
func decodeStrict(doc []byte) (object, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return object{}, err
	}
	v, err := newTyped(tm.APIVersion, tm.Kind)
	if err != nil {
		return object{}, err
	}
	if err := yaml.UnmarshalStrict(doc, v); err != nil {
		return object{}, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	if c, ok := v.(*eppFile); ok {
		if err := c.checkParameters(); err != nil {
			return object{}, fmt.Errorf("%s: %w", tm.Kind, err)
		}
		return object{kind: tm.Kind, value: v, doc: doc}, nil
	}
	meta := reflect.ValueOf(v).Elem().FieldByName("ObjectMeta").Interface().(metav1.ObjectMeta)
	return object{kind: tm.Kind, name: meta.Name, namespace: meta.Namespace, value: v, doc: doc}, nil
}

// decodeAll splits a multi-document YAML stream and decodes every document.
func decodeAll(stream []byte) ([]object, error) {
	var objs []object
	for i, doc := range bytes.Split(stream, []byte("\n---\n")) {
		if len(bytes.TrimSpace(doc)) == 0 || isOnlyComments(doc) {
			continue
		}
		doc = bytes.TrimSpace(doc)
		o, err := decodeStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		objs = append(objs, o)
	}
	return objs, nil
}

func isOnlyComments(doc []byte) bool {
	for _, l := range strings.Split(string(doc), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") && l != "---" {
			return false
		}
	}
	return true
}

// render builds a kustomization in process, as kubectl apply -k would.
func render(t *testing.T, dir string) []object {
	t.Helper()
	objs, err := renderErr(dir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func renderErr(dir string) ([]object, error) {
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	out, err := resMap.AsYaml()
	if err != nil {
		return nil, err
	}
	return decodeAll(out)
}

// TestManifestsDecodeStrictly decodes every plain manifest file under k8s/
// (kustomization files and config are not Kubernetes objects).
func TestManifestsDecodeStrictly(t *testing.T) {
	var files []string
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.IsDir(), !strings.HasSuffix(path, ".yaml"), filepath.Base(path) == "kustomization.yaml",
			filepath.Base(path) == "brokerd.yaml":
			return nil
		}
		files = append(files, path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("found only %d manifests under deploy/k8s: %v", len(files), files)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decodeAll(b)
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) == 0 {
				t.Fatal("no objects")
			}
		})
	}
}

// TestStrictDecodingRejectsMisspeltFields proves the decoding above can fail:
// a misspelt field in a real manifest, a field PodMonitor does not have, and
// a misspelt field that only a kustomize patch brings in.
func TestStrictDecodingRejectsMisspeltFields(t *testing.T) {
	ds, err := os.ReadFile("base/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pm, err := os.ReadFile("base/podmonitor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, doc, old, new, want string
	}{
		{"daemonset probe", string(ds), "readinessProbe:", "readynessProbe:", "readynessProbe"},
		{"daemonset hostPath type", string(ds), "type: DirectoryOrCreate", "typ: DirectoryOrCreate", "typ"},
		{"podmonitor endpoint", string(pm), "- port: metrics", "- prot: metrics", "prot"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := decodeAll([]byte(tt.doc)); err != nil {
				t.Fatalf("the unmodified manifest fails: %v", err)
			}
			bad := strings.Replace(tt.doc, tt.old, tt.new, 1)
			if bad == tt.doc {
				t.Fatalf("%q not found in the manifest", tt.old)
			}
			_, err := decodeAll([]byte(bad))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("decoding with %q: error %v, want one naming %q", tt.new, err, tt.want)
			}
		})
	}
	t.Run("overlay patch", func(t *testing.T) {
		dir := t.TempDir()
		base := relPath(t, dir, "overlays/cpu")
		kust := "resources:\n  - " + base + "\npatches:\n  - path: patch.yaml\n"
		patch := "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: brokerd-cpu\n  namespace: brokerd\nspec:\n  template:\n    spec:\n      terminationGracePeriodSecs: 10\n"
		for name, body := range map[string]string{"kustomization.yaml": kust, "patch.yaml": patch} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		_, err = renderErr(dir)
		if err == nil || !strings.Contains(err.Error(), "terminationGracePeriodSecs") {
			t.Errorf("rendering a misspelt patch: error %v, want one naming terminationGracePeriodSecs", err)
		}
	})
}

// overlayWant is what each overlay's DaemonSet must have.
type overlayWant struct {
	nodeSelector map[string]string
	toleration   string // key of the accelerator taint tolerated; "" for none
	accelerator  corev1.ResourceName
	env          map[string]string
	args         []string
}

var overlays = map[string]overlayWant{
	"cpu": {},
	"gpu": {
		nodeSelector: map[string]string{"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
		toleration:   "nvidia.com/gpu",
		accelerator:  "nvidia.com/gpu",
		env:          map[string]string{"BROKERD_PJRT_PLUGINS": "cuda=/opt/pjrt/site-packages/jax_plugins/xla_cuda12/xla_cuda_plugin.so"},
		args:         []string{"--nvml-library=/usr/local/nvidia/lib64/libnvidia-ml.so.1"},
	},
	"tpu": {
		nodeSelector: map[string]string{"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "2x2"},
		toleration:   "google.com/tpu",
		accelerator:  "google.com/tpu",
		env: map[string]string{
			"TPU_LIBRARY_PATH":     "/opt/pjrt/site-packages/libtpu/libtpu.so",
			"BROKERD_PJRT_PLUGINS": "tpu=/opt/pjrt/site-packages/libtpu/libtpu.so",
		},
	},
}

func find[T any](objs []object, kind string) []T {
	var out []T
	for _, o := range objs {
		if o.kind == kind {
			out = append(out, *o.value.(*T))
		}
	}
	return out
}

func TestOverlays(t *testing.T) {
	entrypoint := dockerEntrypoint(t)
	rendered := map[string][]object{}
	for name, want := range overlays {
		t.Run(name, func(t *testing.T) {
			objs := render(t, filepath.Join("overlays", name))
			rendered[name] = objs
			for _, o := range objs {
				if o.kind != "Namespace" && o.namespace != namespace {
					t.Errorf("%s %s is in namespace %q, want %q", o.kind, o.name, o.namespace, namespace)
				}
			}
			dss := find[appsv1.DaemonSet](objs, "DaemonSet")
			if len(dss) != 1 {
				t.Fatalf("%d DaemonSets, want 1", len(dss))
			}
			ds := dss[0]
			if ds.Name != "brokerd-"+name {
				t.Errorf("DaemonSet name %q, want brokerd-%s", ds.Name, name)
			}
			checkDaemonSet(t, name, ds, want)
			pod := ds.Spec.Template

			cms := find[corev1.ConfigMap](objs, "ConfigMap")
			if len(cms) != 1 {
				t.Fatalf("%d ConfigMaps, want 1", len(cms))
			}
			cfg := checkCommandLine(t, entrypoint, pod.Spec, cms[0])
			grace := 2*time.Duration(cfg.ShutdownGrace) + 5*time.Second
			if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= grace {
				t.Errorf("terminationGracePeriodSeconds %v is not above twice shutdown-grace plus 5s (%s)", g, grace)
			}

			svcs := find[corev1.Service](objs, "Service")
			var local *corev1.Service
			for i, s := range svcs {
				if s.Name == "brokerd" {
					local = &svcs[i]
				}
				if !isSubset(s.Spec.Selector, pod.Labels) {
					t.Errorf("Service %s selector %v does not select the pods %v", s.Name, s.Spec.Selector, pod.Labels)
				}
				for _, p := range s.Spec.Ports {
					if containerPort(pod.Spec.Containers[0], p.TargetPort.String()) == 0 {
						t.Errorf("Service %s targets port %s, which the container does not name", s.Name, p.TargetPort.String())
					}
				}
			}
			if local == nil || local.Spec.InternalTrafficPolicy == nil || *local.Spec.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyLocal {
				t.Errorf("no Service brokerd with internalTrafficPolicy Local: %+v", local)
			}

			pms := find[PodMonitor](objs, "PodMonitor")
			if len(pms) != 1 {
				t.Fatalf("%d PodMonitors, want 1", len(pms))
			}
			pm := pms[0]
			if !isSubset(pm.Spec.Selector.MatchLabels, pod.Labels) {
				t.Errorf("PodMonitor selector %v does not select the pods %v", pm.Spec.Selector.MatchLabels, pod.Labels)
			}
			for _, ep := range pm.Spec.PodMetricsEndpoints {
				port := containerPort(pod.Spec.Containers[0], ep.Port)
				if port == 0 || ep.Path != "/metrics" {
					t.Errorf("PodMonitor endpoint %+v: no container port %q, or not /metrics", ep, ep.Port)
				}
				if !strings.HasSuffix(cfg.MetricsListen, ":"+strconv.Itoa(int(port))) {
					t.Errorf("PodMonitor scrapes port %d but brokerd's metrics listen on %s", port, cfg.MetricsListen)
				}
			}
		})
	}

	// All overlays may be applied to one cluster: whatever they share (the
	// namespace, Service, ConfigMap, ...) must be identical, or one apply
	// would undo another.
	t.Run("shared objects agree", func(t *testing.T) {
		seen := map[string][]byte{}
		from := map[string]string{}
		for _, name := range []string{"cpu", "gpu", "tpu"} {
			for _, o := range rendered[name] {
				key := o.kind + "/" + o.name
				if prev, ok := seen[key]; ok && !bytes.Equal(prev, o.doc) {
					t.Errorf("%s differs between overlays %s and %s:\n%s\n---\n%s", key, from[key], name, prev, o.doc)
				}
				seen[key], from[key] = o.doc, name
			}
		}
	})
}

func checkDaemonSet(t *testing.T, name string, ds appsv1.DaemonSet, want overlayWant) {
	t.Helper()
	pod := ds.Spec.Template
	if ds.Spec.Selector == nil || ds.Spec.Selector.MatchLabels["app.kubernetes.io/component"] != name ||
		!isSubset(ds.Spec.Selector.MatchLabels, pod.Labels) {
		t.Errorf("selector %v: want app.kubernetes.io/component=%s and a subset of the pod labels %v", ds.Spec.Selector, name, pod.Labels)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	for _, cc := range append(slices.Clone(pod.Spec.InitContainers), c) {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, lim := cc.Resources.Requests[r], cc.Resources.Limits[r]
			if req.IsZero() || lim.IsZero() || lim.Cmp(req) < 0 {
				t.Errorf("container %s: %s request %s, limit %s: want both, limit >= request", cc.Name, r, req.String(), lim.String())
			}
		}
	}

	// Probes: native gRPC on the plaintext health port brokerd serves.
	healthPort := containerPort(c, "health")
	if healthPort == 0 || !slices.Contains(c.Args, fmt.Sprintf("--health-listen=0.0.0.0:%d", healthPort)) {
		t.Errorf("health port %d is not what --health-listen serves: args %v", healthPort, c.Args)
	}
	for pname, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
		if p == nil || p.GRPC == nil || p.GRPC.Port != healthPort {
			t.Errorf("%s probe %+v: want a gRPC probe on port %d", pname, p, healthPort)
		}
	}
	if p := c.ReadinessProbe; p != nil && p.GRPC != nil && (p.GRPC.Service == nil || *p.GRPC.Service != "broker.v1.BrokerService") {
		t.Errorf("readiness probe service %v, want broker.v1.BrokerService", p.GRPC.Service)
	}

	// The socket directory is the host's, so pods on the node find it.
	var hostDir *corev1.HostPathVolumeSource
	for _, v := range pod.Spec.Volumes {
		if v.Name == "socket-dir" {
			hostDir = v.HostPath
		}
	}
	if hostDir == nil || hostDir.Path != "/run/brokerd" || hostDir.Type == nil || *hostDir.Type != corev1.HostPathDirectoryOrCreate {
		t.Errorf("socket-dir volume %+v: want hostPath /run/brokerd, DirectoryOrCreate", hostDir)
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "socket-dir" && m.MountPath == "/run/brokerd" }) {
		t.Errorf("socket-dir not mounted at /run/brokerd: %+v", c.VolumeMounts)
	}
	if sc := pod.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("pod security context %+v: want runAsNonRoot and a non-zero runAsUser", sc)
	}

	// Node selection and devices, per overlay.
	if !reflect.DeepEqual(pod.Spec.NodeSelector, want.nodeSelector) && (len(pod.Spec.NodeSelector) != 0 || len(want.nodeSelector) != 0) {
		t.Errorf("nodeSelector %v, want %v", pod.Spec.NodeSelector, want.nodeSelector)
	}
	var tolerated []string
	for _, tol := range pod.Spec.Tolerations {
		tolerated = append(tolerated, tol.Key)
		if tol.Key == want.toleration && (tol.Operator != corev1.TolerationOpExists || tol.Effect != corev1.TaintEffectNoSchedule) {
			t.Errorf("toleration %+v: want Exists, NoSchedule", tol)
		}
	}
	if want.toleration == "" && len(tolerated) != 0 || want.toleration != "" && !reflect.DeepEqual(tolerated, []string{want.toleration}) {
		t.Errorf("tolerations for %v, want only %q", tolerated, want.toleration)
	}
	for _, r := range []corev1.ResourceName{"nvidia.com/gpu", "google.com/tpu"} {
		lim := c.Resources.Limits[r]
		switch {
		case r == want.accelerator && lim.Cmp(resource.MustParse("1")) < 0:
			t.Errorf("limit %s = %s, want at least 1", r, lim.String())
		case r != want.accelerator && !lim.IsZero():
			t.Errorf("limit %s = %s on the %s overlay", r, lim.String(), name)
		}
	}
	if name == "cpu" {
		// Accelerator nodes belong to the other DaemonSets.
		aff := pod.Spec.Affinity
		var absent []string
		if aff != nil && aff.NodeAffinity != nil && aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
			for _, term := range aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
				for _, e := range term.MatchExpressions {
					if e.Operator == corev1.NodeSelectorOpDoesNotExist {
						absent = append(absent, e.Key)
					}
				}
			}
		}
		slices.Sort(absent)
		if !reflect.DeepEqual(absent, []string{"cloud.google.com/gke-accelerator", "cloud.google.com/gke-tpu-accelerator"}) {
			t.Errorf("cpu overlay requires absent labels %v, want the GPU and TPU node labels", absent)
		}
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	for k, v := range want.env {
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
	}
	for _, a := range want.args {
		if !slices.Contains(c.Args, a) {
			t.Errorf("args %v lack %s", c.Args, a)
		}
	}
}

// checkCommandLine loads brokerd's configuration exactly as the pod would
// start it: the image's entrypoint flags, the container's args, its env and
// the ConfigMap's brokerd.yaml at the path --config names.
func checkCommandLine(t *testing.T, entrypoint []string, spec corev1.PodSpec, cm corev1.ConfigMap) config.Config {
	t.Helper()
	c := spec.Containers[0]
	dir := t.TempDir()
	var mountPath string
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
			for _, m := range c.VolumeMounts {
				if m.Name == v.Name {
					mountPath = m.MountPath
				}
			}
		}
	}
	if mountPath == "" {
		t.Fatalf("ConfigMap %s is not mounted in the container", cm.Name)
	}
	for k, v := range cm.Data {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := append(slices.Clone(entrypoint[1:]), c.Args...)
	for i, a := range args {
		if p, ok := strings.CutPrefix(a, "--config="+mountPath+"/"); ok {
			args[i] = "--config=" + filepath.Join(dir, p)
		}
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	cfg, err := config.Load(args, func(k string) string { return env[k] }, 10001, io.Discard)
	if err != nil {
		t.Fatalf("brokerd would not start with %v: %v", args, err)
	}
	if cfg.Socket != "/run/brokerd/brokerd.sock" || cfg.StateDir != "/var/lib/brokerd" || cfg.HealthListen == "" || cfg.TLSCert == "" {
		t.Errorf("pod config: socket %q, state-dir %q, health-listen %q, tls-cert %q", cfg.Socket, cfg.StateDir, cfg.HealthListen, cfg.TLSCert)
	}
	return cfg
}

func containerPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

func isSubset(sub, super map[string]string) bool {
	if len(sub) == 0 {
		return false
	}
	for k, v := range sub {
		if super[k] != v {
			return false
		}
	}
	return true
}

// TestExampleClient checks the client Deployment reaches the broker: it
// mounts the same host directory and joins the socket's group.
func TestExampleClient(t *testing.T) {
	b, err := os.ReadFile("examples/client.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeAll(b)
	if err != nil {
		t.Fatal(err)
	}
	deps := find[appsv1.Deployment](objs, "Deployment")
	if len(deps) != 1 {
		t.Fatalf("%d Deployments, want 1", len(deps))
	}
	spec := deps[0].Spec.Template.Spec
	var host *corev1.HostPathVolumeSource
	for _, v := range spec.Volumes {
		host = v.HostPath
	}
	if host == nil || host.Path != "/run/brokerd" {
		t.Errorf("client volume %+v: want the hostPath /run/brokerd", host)
	}
	if sc := spec.SecurityContext; sc == nil || !slices.Contains(sc.SupplementalGroups, 10001) {
		t.Errorf("client security context %+v: want supplementalGroups with the brokerd gid 10001", sc)
	}
	env := spec.Containers[0].Env
	if !slices.ContainsFunc(env, func(e corev1.EnvVar) bool {
		return e.Name == "BROKERD_SOCKET" && e.Value == "/run/brokerd/brokerd.sock"
	}) {
		t.Errorf("client env %v: want BROKERD_SOCKET=/run/brokerd/brokerd.sock", env)
	}
}

// CloudBuild is the part of a Cloud Build config this repository uses,
// decoded strictly so a misspelt key fails.
type CloudBuild struct {
	Substitutions map[string]string `json:"substitutions"`
	Options       map[string]string `json:"options"`
	Timeout       string            `json:"timeout"`
	Steps         []struct {
		ID         string   `json:"id"`
		Name       string   `json:"name"`
		Entrypoint string   `json:"entrypoint"`
		Args       []string `json:"args"`
		Env        []string `json:"env"`
		WaitFor    []string `json:"waitFor"`
	} `json:"steps"`
}

// TestCloudBuild checks the pipeline's order and that its rollout really
// deploys the image it pushed: the deploy step's kustomization, with the
// substitutions made, is rendered over each overlay.
func TestCloudBuild(t *testing.T) {
	b, err := os.ReadFile("../cloudbuild.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cb CloudBuild
	if err := yaml.UnmarshalStrict(b, &cb); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range cb.Steps {
		ids = append(ids, s.ID)
	}
	if !reflect.DeepEqual(ids, []string{"test", "build", "push", "deploy"}) {
		t.Fatalf("steps %v, want test, build, push, deploy", ids)
	}
	for i, s := range cb.Steps[1:] {
		if !reflect.DeepEqual(s.WaitFor, []string{ids[i]}) {
			t.Errorf("step %s waits for %v, want [%s]", s.ID, s.WaitFor, ids[i])
		}
	}
	if got := strings.Join(append([]string{cb.Steps[0].Entrypoint}, cb.Steps[0].Args...), " "); got != "make test" {
		t.Errorf("test step runs %q, want make test", got)
	}
	build := strings.Join(cb.Steps[1].Args, " ")
	if !strings.Contains(build, "build -f deploy/Dockerfile") || !strings.Contains(build, "-t ${_REGISTRY}/${_IMAGE_NAME}:${SHORT_SHA}") {
		t.Errorf("build step %q", build)
	}
	if push := strings.Join(cb.Steps[2].Args, " "); push != "push ${_REGISTRY}/${_IMAGE_NAME}:${SHORT_SHA}" {
		t.Errorf("push step %q", push)
	}

	script := cb.Steps[3].Args[len(cb.Steps[3].Args)-1]
	start := strings.Index(script, "<<EOF\n")
	end := strings.Index(script, "\nEOF\n")
	if start < 0 || end < start {
		t.Fatalf("deploy step has no kustomization heredoc:\n%s", script)
	}
	kust := script[start+len("<<EOF\n") : end]
	for overlay, image := range map[string]string{"cpu": "brokerd", "gpu": "brokerd", "tpu": "brokerd-tpu"} {
		t.Run("rollout "+overlay, func(t *testing.T) {
			subs := map[string]string{"_OVERLAY": overlay, "_IMAGE_NAME": image, "_REGISTRY": "europe-docker.pkg.dev/p/r", "SHORT_SHA": "abc1234"}
			k := kust
			for name, v := range subs {
				k = strings.ReplaceAll(k, "${"+name+"}", v)
			}
			if strings.Contains(k, "${") {
				t.Fatalf("unsubstituted variable left:\n%s", k)
			}
			dir := t.TempDir()
			// Cloud Build runs it from the repository root; kustomize wants
			// the overlay relative to the kustomization.
			k = strings.ReplaceAll(k, "../deploy/k8s/overlays", relPath(t, dir, "overlays"))
			if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
				t.Fatal(err)
			}
			ds := find[appsv1.DaemonSet](render(t, dir), "DaemonSet")
			if len(ds) != 1 || ds[0].Name != "brokerd-"+overlay || !strings.Contains(script, "rollout status daemonset/brokerd-${_OVERLAY}") {
				t.Fatalf("DaemonSets %v: want brokerd-%s, the one rollout status waits for", ds, overlay)
			}
			want := "europe-docker.pkg.dev/p/r/" + image + ":abc1234"
			spec := ds[0].Spec.Template.Spec
			for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
				if c.Image != want {
					t.Errorf("container %s runs %s, want the pushed %s", c.Name, c.Image, want)
				}
			}
		})
	}
}

// relPath is target (relative to this package) as a path relative to dir:
// kustomize refuses absolute resource paths.
func relPath(t *testing.T, dir, target string) string {
	t.Helper()
	abs, err := filepath.Abs(target)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, abs)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// dockerEntrypoint is the image's ENTRYPOINT (exec form) from ../Dockerfile,
// whose own checks live in package deploy. This package is separate because
// kustomize links Go's plugin package, which makes the linker bind every
// symbol at start, and go-nvml (linked by brokerd's server package, which
// the dashboard test runs) leaves NVML's symbols to the driver library.
func dockerEntrypoint(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var ep []string
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "ENTRYPOINT "); ok {
			if err := json.Unmarshal([]byte(rest), &ep); err != nil {
				t.Fatalf("ENTRYPOINT is not the exec form: %v", err)
			}
		}
	}
	if len(ep) == 0 {
		t.Fatal("no ENTRYPOINT in ../Dockerfile")
	}
	return ep
}
