package k8s

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	eppconfig "sigs.k8s.io/gateway-api-inference-extension/apix/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/brokerd/brokerd/scheduler"
)

// eppFile is the endpoint picker's configuration file, decoded strictly
// into the extension's own type (sigs.k8s.io/gateway-api-inference-extension
// v1.5.0, the last release that carries the picker and its configuration
// API), with the parameters of the plugins it uses decoded strictly too.
type eppFile struct {
	eppconfig.EndpointPickerConfig `json:",inline"`

	source    *metricsSourceParams
	extractor *metricsExtractorParams
}

// The parameters of the picker's metrics plugins, as v1.5.0 reads them
// (pkg/epp/framework/plugins/datalayer/source/metrics: metricsDatasourceParams;
// .../extractor/metrics: modelServerExtractorParams, engineConfigParams). The
// picker's own structs are unexported, so they are mirrored field for field.
type metricsSourceParams struct {
	Scheme             string `json:"scheme"`
	Path               string `json:"path"`
	InsecureSkipVerify bool   `json:"insecureSkipVerify"`
}

type metricsExtractorParams struct {
	EngineLabelKey string               `json:"engineLabelKey"`
	DefaultEngine  string               `json:"defaultEngine"`
	EngineConfigs  []engineConfigParams `json:"engineConfigs"`
}

type engineConfigParams struct {
	Name                    string `json:"name"`
	QueuedRequestsSpec      string `json:"queuedRequestsSpec"`
	RunningRequestsSpec     string `json:"runningRequestsSpec"`
	KVUsageSpec             string `json:"kvUsageSpec"`
	LoRASpec                string `json:"loraSpec"`
	CacheInfoSpec           string `json:"cacheInfoSpec"`
	CacheBlockSizeLabelName string `json:"cacheBlockSizeLabelName,omitempty"`
	CacheNumBlocksLabelName string `json:"cacheNumBlocksLabelName,omitempty"`
	CacheBlockSizeSpec      string `json:"cacheBlockSizeSpec,omitempty"`
	CacheNumBlocksSpec      string `json:"cacheNumBlocksSpec,omitempty"`
}

// eppPluginTypes are the v1.5.0 picker's plugin types this configuration
// may use; the scorers take no parameters here.
var eppPluginTypes = []string{"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "metrics-data-source", "core-metrics-extractor"}

// checkParameters decodes the metrics plugins' parameters strictly and checks
// the references between plugins, profiles and engines.
func (c *eppFile) checkParameters() error {
	names := map[string]bool{}
	for _, p := range c.Plugins {
		if !slices.Contains(eppPluginTypes, p.Type) {
			return fmt.Errorf("plugin type %q: not one this configuration knows (%v)", p.Type, eppPluginTypes)
		}
		name := p.Name
		if name == "" {
			name = p.Type
		}
		names[name] = true
		var dst any
		switch p.Type {
		case "metrics-data-source":
			c.source = &metricsSourceParams{}
			dst = c.source
		case "core-metrics-extractor":
			c.extractor = &metricsExtractorParams{}
			dst = c.extractor
		default:
			if len(p.Parameters) != 0 && string(p.Parameters) != "null" {
				return fmt.Errorf("plugin %s: parameters %s, want none", name, p.Parameters)
			}
			continue
		}
		if err := yaml.UnmarshalStrict(p.Parameters, dst); err != nil {
			return fmt.Errorf("plugin %s parameters: %w", name, err)
		}
	}
	for _, prof := range c.SchedulingProfiles {
		for _, ref := range prof.Plugins {
			if !names[ref.PluginRef] {
				return fmt.Errorf("profile %s: plugin %q is not defined", prof.Name, ref.PluginRef)
			}
		}
	}
	if e := c.extractor; e != nil && !slices.ContainsFunc(e.EngineConfigs, func(ec engineConfigParams) bool { return ec.Name == e.DefaultEngine }) {
		return fmt.Errorf("defaultEngine %q has no engineConfigs entry", e.DefaultEngine)
	}
	return nil
}

// metricSpec is a picker metric specification: name{label="value",...}.
type metricSpec struct {
	name   string
	labels map[string]string
}

var specRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$`)

// parseSpec reads a specification as the picker does (PromQL's instant
// vector selector, label values quoted or not; equality matchers only).
func parseSpec(s string) (metricSpec, error) {
	m := specRE.FindStringSubmatch(s)
	if m == nil {
		return metricSpec{}, fmt.Errorf("%q is not NAME{LABEL=VALUE,...}", s)
	}
	spec := metricSpec{name: m[1], labels: map[string]string{}}
	if m[2] == "" {
		return spec, nil
	}
	for _, kv := range strings.Split(m[2], ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.HasPrefix(v, "~") {
			return metricSpec{}, fmt.Errorf("%q: matcher %q is not LABEL=VALUE", s, kv)
		}
		spec.labels[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"`)
	}
	return spec, nil
}

// kvExec is a generator executor with a KV cache of 12 blocks, 3 held.
type kvExec struct{}

func (kvExec) Reserve(uint64, int) bool { return true }
func (kvExec) Release(uint64)           {}
func (kvExec) Step(_ context.Context, items []scheduler.StepItem) ([]scheduler.StepResult, error) {
	return make([]scheduler.StepResult, len(items)), nil
}
func (kvExec) CacheBlocks() (used, total int) { return 3, 12 }

// TestInferencePoolOverlay renders the inference overlay and checks it
// routes as the Gateway API Inference Extension expects: the InferencePool
// selects the GPU DaemonSet's pods and targets the port brokerd serves its
// HTTP APIs on; its endpoint picker is the Deployment and Service here,
// watching that pool, scraping brokerd's metrics port, with a configuration
// (strictly decoded into the extension's EndpointPickerConfig) whose three
// model-server-protocol metrics are gauges a brokerd serving the pool's
// model version exports, with the semantics the protocol asks.
func TestInferencePoolOverlay(t *testing.T) {
	entrypoint := dockerEntrypoint(t)
	objs := render(t, filepath.Join("overlays", "inference"))
	for _, o := range objs {
		if o.kind != "Namespace" && o.namespace != namespace {
			t.Errorf("%s %s is in namespace %q, want %q", o.kind, o.name, o.namespace, namespace)
		}
	}

	// The gpu overlay's DaemonSet, with the HTTP API and the model.
	dss := find[appsv1.DaemonSet](objs, "DaemonSet")
	if len(dss) != 1 || dss[0].Name != "brokerd-gpu" {
		t.Fatalf("DaemonSets %d, want brokerd-gpu alone", len(dss))
	}
	ds := dss[0]
	checkDaemonSet(t, "gpu", ds, overlays["gpu"])
	pod := ds.Spec.Template
	var brokerCM corev1.ConfigMap
	var eppCM *corev1.ConfigMap
	for _, cm := range find[corev1.ConfigMap](objs, "ConfigMap") {
		if strings.HasPrefix(cm.Name, "brokerd-config") {
			brokerCM = cm
		} else if strings.HasPrefix(cm.Name, "brokerd-epp") {
			eppCM = &cm
		}
	}
	cfg := checkCommandLine(t, entrypoint, pod.Spec, brokerCM)
	broker := pod.Spec.Containers[0]
	httpPort := containerPort(broker, "http")
	if _, port, _ := net.SplitHostPort(cfg.HTTPListen); httpPort == 0 || port != strconv.Itoa(int(httpPort)) {
		t.Errorf("http-listen %q, container port http %d", cfg.HTTPListen, httpPort)
	}
	if cfg.APIKeysFile == "" || !mountedFrom(pod.Spec, broker, filepath.Dir(cfg.APIKeysFile), func(v corev1.Volume) bool {
		return v.Secret != nil && v.Secret.SecretName == "brokerd-api-keys"
	}) {
		t.Errorf("api-keys-file %q is not in the brokerd-api-keys Secret's volume", cfg.APIKeysFile)
	}
	models := strings.Split(cfg.LoadModels, ",")
	if len(models) != 1 || models[0] == "" {
		t.Fatalf("load-models %q: the pool serves one model", cfg.LoadModels)
	}
	// The version of the pool's model, as the overlay's comment says.
	label := models[0] + "@1"

	// The pool: the GPU brokers, on their HTTP port, and the picker.
	pools := find[infv1.InferencePool](objs, "InferencePool")
	if len(pools) != 1 {
		t.Fatalf("%d InferencePools, want 1", len(pools))
	}
	pool := pools[0]
	sel := map[string]string{}
	for k, v := range pool.Spec.Selector.MatchLabels {
		sel[string(k)] = string(v)
	}
	if !isSubset(sel, pod.Labels) {
		t.Errorf("pool selector %v does not select the brokerd-gpu pods %v", sel, pod.Labels)
	}
	for _, other := range []string{"cpu", "tpu"} {
		for _, ods := range find[appsv1.DaemonSet](render(t, filepath.Join("overlays", other)), "DaemonSet") {
			if isSubset(sel, ods.Spec.Template.Labels) {
				t.Errorf("pool selector %v also selects the %s brokers", sel, other)
			}
		}
	}
	if len(pool.Spec.TargetPorts) != 1 || int32(pool.Spec.TargetPorts[0].Number) != httpPort {
		t.Errorf("pool target ports %v, want brokerd's HTTP port %d alone", pool.Spec.TargetPorts, httpPort)
	}
	if pool.Spec.AppProtocol != infv1.AppProtocolHTTP {
		t.Errorf("pool app protocol %q", pool.Spec.AppProtocol)
	}
	ref := pool.Spec.EndpointPickerRef
	if (ref.Kind != "" && ref.Kind != "Service") || ref.Port == nil || ref.FailureMode != infv1.EndpointPickerFailClose {
		t.Fatalf("endpoint picker ref %+v: want a Service, a port, FailClose", ref)
	}

	// The picker: its Service and Deployment.
	var eppSvc *corev1.Service
	for _, s := range find[corev1.Service](objs, "Service") {
		if s.Name == string(ref.Name) {
			eppSvc = &s
		}
	}
	deps := find[appsv1.Deployment](objs, "Deployment")
	if eppSvc == nil || len(deps) != 1 {
		t.Fatalf("no Service %q, or %d Deployments (want the picker's)", ref.Name, len(deps))
	}
	epp := deps[0]
	if !isSubset(eppSvc.Spec.Selector, epp.Spec.Template.Labels) {
		t.Errorf("Service %s selects %v, not the picker's pods %v", eppSvc.Name, eppSvc.Spec.Selector, epp.Spec.Template.Labels)
	}
	if isSubset(sel, epp.Spec.Template.Labels) || isSubset(eppSvc.Spec.Selector, pod.Labels) {
		t.Error("the pool selects the picker, or the picker's Service the brokers")
	}
	c := epp.Spec.Template.Spec.Containers[0]
	args := map[string]string{}
	for _, a := range c.Args {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		args[k] = v
	}
	var extProc int32
	for _, p := range eppSvc.Spec.Ports {
		if p.Port == int32(ref.Port.Number) {
			extProc = containerPort(c, p.TargetPort.String())
		}
	}
	if extProc == 0 || args["grpc-port"] != strconv.Itoa(int(extProc)) {
		t.Errorf("the pool's picker port %d reaches container port %d; the picker serves --grpc-port %q", ref.Port.Number, extProc, args["grpc-port"])
	}
	if args["pool-name"] != pool.Name || args["pool-namespace"] != namespace || args["pool-group"] != infv1.GroupName {
		t.Errorf("picker watches pool %q in %q (%q), want %s in %s (%s)", args["pool-name"], args["pool-namespace"], args["pool-group"], pool.Name, namespace, infv1.GroupName)
	}
	metricsPort := containerPort(broker, "metrics")
	if args["model-server-metrics-port"] != strconv.Itoa(int(metricsPort)) || !strings.HasSuffix(cfg.MetricsListen, ":"+args["model-server-metrics-port"]) {
		t.Errorf("picker scrapes port %q; brokerd's metrics listen on %s (container port %d)", args["model-server-metrics-port"], cfg.MetricsListen, metricsPort)
	}
	if p := c.ReadinessProbe; p == nil || p.GRPC == nil || strconv.Itoa(int(p.GRPC.Port)) != args["grpc-health-port"] {
		t.Errorf("picker readiness probe %+v, health port %q", c.ReadinessProbe, args["grpc-health-port"])
	}
	for _, cc := range []corev1.Container{c} {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if req, lim := cc.Resources.Requests[r], cc.Resources.Limits[r]; req.IsZero() || lim.IsZero() || lim.Cmp(req) < 0 {
				t.Errorf("picker %s request %s, limit %s", r, req.String(), lim.String())
			}
		}
	}
	if sa := epp.Spec.Template.Spec.ServiceAccountName; !slices.ContainsFunc(objs, func(o object) bool { return o.kind == "ServiceAccount" && o.name == sa }) {
		t.Errorf("picker service account %q is not in the overlay", sa)
	}

	// Its configuration, from the ConfigMap the Deployment mounts where
	// --config-file points.
	if eppCM == nil {
		t.Fatal("no brokerd-epp ConfigMap")
	}
	file := args["config-file"]
	if !mountedFrom(epp.Spec.Template.Spec, c, filepath.Dir(file), func(v corev1.Volume) bool {
		return v.ConfigMap != nil && v.ConfigMap.Name == eppCM.Name
	}) {
		t.Errorf("--config-file %s is not in the ConfigMap %s's volume", file, eppCM.Name)
	}
	text, ok := eppCM.Data[filepath.Base(file)]
	if !ok {
		t.Fatalf("ConfigMap %s has no %s", eppCM.Name, filepath.Base(file))
	}
	o, err := decodeStrict([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	conf := o.value.(*eppFile)
	if conf.source == nil || conf.source.Scheme != "http" || conf.source.Path != "/metrics" {
		t.Errorf("metrics source %+v: brokerd's /metrics are plain HTTP", conf.source)
	}
	if conf.extractor == nil {
		t.Fatal("no core-metrics-extractor")
	}
	var engine *struct{ queued, running, kv string }
	for _, ec := range conf.extractor.EngineConfigs {
		if ec.Name == conf.extractor.DefaultEngine {
			engine = &struct{ queued, running, kv string }{ec.QueuedRequestsSpec, ec.RunningRequestsSpec, ec.KVUsageSpec}
			if ec.LoRASpec != "" || ec.CacheInfoSpec != "" {
				t.Errorf("engine %s names LoRA or cache-info metrics brokerd does not export: %q, %q", ec.Name, ec.LoRASpec, ec.CacheInfoSpec)
			}
		}
	}
	if engine == nil || conf.extractor.DefaultEngine == "vllm" {
		t.Fatalf("default engine %q: want brokerd's own", conf.extractor.DefaultEngine)
	}

	// The metrics a brokerd serving the pool's model version exports: a
	// generator named as lifecycle names it, with 3 of 12 KV blocks held.
	reg := prometheus.NewRegistry()
	s := scheduler.New(scheduler.Options{Registerer: reg})
	defer s.Close()
	if err := s.AddGenReplica(label, scheduler.Device{ID: "gpu:0", Type: "gpu"}, scheduler.GenOptions{MaxRunning: 4, MaxStepTokens: 64}, kvExec{},
		scheduler.WithName(label)); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for what, tc := range map[string]struct {
		spec       string
		want       float64
		protocolOf string
	}{
		"queued":  {engine.queued, 0, "TotalQueuedRequests"},
		"running": {engine.running, 0, "TotalRunningRequests"},
		"kv":      {engine.kv, 0.25, "KVCacheUtilization (0 to 1)"},
	} {
		spec, err := parseSpec(tc.spec)
		if err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		if spec.labels["model"] != label {
			t.Errorf("%s spec %q: its model label is not the pool's model version %q", what, tc.spec, label)
		}
		var found *dto.Metric
		for _, mf := range mfs {
			if mf.GetName() != spec.name {
				continue
			}
			if mf.GetType() != dto.MetricType_GAUGE {
				t.Errorf("%s: %s is a %v, the protocol's %s a gauge", what, spec.name, mf.GetType(), tc.protocolOf)
			}
			for _, m := range mf.GetMetric() {
				match := true
				have := map[string]string{}
				for _, lp := range m.GetLabel() {
					have[lp.GetName()] = lp.GetValue()
				}
				for k, v := range spec.labels {
					match = match && have[k] == v
				}
				if match {
					found = m
				}
			}
		}
		if found == nil {
			t.Errorf("%s (%s): brokerd exports no series %q", what, tc.protocolOf, tc.spec)
			continue
		}
		if got := found.GetGauge().GetValue(); got != tc.want {
			t.Errorf("%s (%s): %s = %v, want %v", what, tc.protocolOf, tc.spec, got, tc.want)
		}
	}
}

// mountedFrom reports whether dir is a mount of c from a volume of spec
// that is.
func mountedFrom(spec corev1.PodSpec, c corev1.Container, dir string, is func(corev1.Volume) bool) bool {
	for _, m := range c.VolumeMounts {
		if filepath.Clean(m.MountPath) != filepath.Clean(dir) {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && is(v) {
				return true
			}
		}
	}
	return false
}

// TestInferenceManifestsRejectMisspeltFields: strict decoding into the
// extension's types catches a misspelt field of the InferencePool, of the
// picker's configuration, and of a metrics plugin's parameters.
func TestInferenceManifestsRejectMisspeltFields(t *testing.T) {
	pool, err := os.ReadFile("overlays/inference/inferencepool.yaml")
	if err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile("overlays/inference/epp-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		doc  []byte
		old  string
		new  string
		want string
	}{
		{"pool target ports", pool, "targetPorts:", "targetPort:", "targetPort"},
		{"pool picker ref", pool, "failureMode:", "failMode:", "failMode"},
		{"profiles", conf, "schedulingProfiles:", "schedulingProfile:", "schedulingProfile"},
		{"extractor parameter", conf, "kvUsageSpec:", "kvUsageSpecs:", "kvUsageSpecs"},
		{"source parameter", conf, "scheme: http", "schema: http", "schema"},
		{"unknown plugin", conf, "- type: queue-scorer", "- type: queue-scorers", "queue-scorers"},
		{"profile reference", conf, "- pluginRef: queue-scorer", "- pluginRef: queue-score", "queue-score"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := decodeAll(tt.doc); err != nil {
				t.Fatalf("the unmodified manifest fails: %v", err)
			}
			bad := bytes.Replace(tt.doc, []byte(tt.old), []byte(tt.new), 1)
			if bytes.Equal(bad, tt.doc) {
				t.Fatalf("%q not found", tt.old)
			}
			if _, err := decodeAll(bad); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("with %q: error %v, want one naming %q", tt.new, err, tt.want)
			}
		})
	}
}
