package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gorgo-llm/gorgo/internal/serve"
)

// Every object of the Kubernetes manifests decodes strictly into its API
// type (an unknown or misspelt field fails), the config in the ConfigMap is
// a valid gorgo serve config, and the objects fit together.
func TestKubernetesManifestsDecodeStrictly(t *testing.T) {
	data, err := os.ReadFile("k8s/gorgo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var (
		cms      []corev1.ConfigMap
		svcs     []corev1.Service
		secrets  []corev1.Secret
		deploys  []appsv1.Deployment
		monitors []monitoringv1.PodMonitor
	)
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var head struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		var err error
		switch head.APIVersion + " " + head.Kind {
		case "v1 ConfigMap":
			var o corev1.ConfigMap
			err = yaml.UnmarshalStrict([]byte(doc), &o)
			cms = append(cms, o)
		case "v1 Service":
			var o corev1.Service
			err = yaml.UnmarshalStrict([]byte(doc), &o)
			svcs = append(svcs, o)
		case "v1 Secret":
			var o corev1.Secret
			err = yaml.UnmarshalStrict([]byte(doc), &o)
			secrets = append(secrets, o)
		case "apps/v1 Deployment":
			var o appsv1.Deployment
			err = yaml.UnmarshalStrict([]byte(doc), &o)
			deploys = append(deploys, o)
		case "monitoring.coreos.com/v1 PodMonitor":
			var o monitoringv1.PodMonitor
			err = yaml.UnmarshalStrict([]byte(doc), &o)
			monitors = append(monitors, o)
		default:
			t.Fatalf("document %d: unexpected %s %s", i, head.APIVersion, head.Kind)
		}
		if err != nil {
			t.Fatalf("document %d (%s): %v", i, head.Kind, err)
		}
	}
	if len(cms) != 1 || len(deploys) != 2 || len(monitors) != 1 || len(svcs) != 3 || len(secrets) != 1 {
		t.Fatalf("objects: %d ConfigMaps, %d Deployments, %d PodMonitors, %d Services, %d Secrets", len(cms), len(deploys), len(monitors), len(svcs), len(secrets))
	}
	// The config is gorgo's, and valid.
	cfg, err := serve.ParseConfig([]byte(cms[0].Data["serve.yaml"]), "ConfigMap gorgo")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(cfg.Admin.TokenEnv, "a-token-long-enough-for-the-test")
	if err := cfg.Defaults().Validate(); err != nil {
		t.Fatal(err)
	}
	// The headless Service the config discovers through.
	var headless *corev1.Service
	for i := range svcs {
		if svcs[i].Spec.ClusterIP == corev1.ClusterIPNone {
			headless = &svcs[i]
		}
	}
	if headless == nil || len(cfg.Discover) == 0 || !strings.HasPrefix(cfg.Discover[0].DNS, headless.Name+".") {
		t.Errorf("the config does not discover through the headless Service")
	}
	// Several gorgo pods share state through the mesh: its URL is a
	// Service that selects the NATS Deployment's pods, on their client port.
	byName := map[string]*appsv1.Deployment{}
	for i := range deploys {
		byName[deploys[i].Name] = &deploys[i]
	}
	d, bus := byName["gorgo"], byName["gorgo-nats"]
	if d == nil || bus == nil {
		t.Fatalf("Deployments %v, want gorgo and gorgo-nats", byName)
	}
	// The tuner's state is kept where the container may write, its root
	// being read-only: a volume of its own.
	if cfg.TunerState != "" {
		writable := false
		for _, m := range d.Spec.Template.Spec.Containers[0].VolumeMounts {
			writable = writable || m.MountPath == filepath.Dir(cfg.TunerState) && !m.ReadOnly
		}
		if !writable {
			t.Errorf("tuner_state %s is not on a writable volume of the gorgo container", cfg.TunerState)
		}
	}
	if d.Spec.Replicas != nil && *d.Spec.Replicas > 1 && (cfg.Mesh == nil || cfg.Region == "") {
		t.Errorf("%d gorgo pods that do not share state (no mesh or no region)", *d.Spec.Replicas)
	}
	if cfg.Mesh != nil {
		if cfg.Mesh.Name != "" {
			t.Errorf("mesh name %q: every pod would have it; the default (region and pod name) is unique", cfg.Mesh.Name)
		}
		found := false
		for _, svc := range svcs {
			if cfg.Mesh.URL != "nats://"+svc.Name+":4222" {
				continue
			}
			found = svc.Spec.Selector["app.kubernetes.io/name"] == bus.Spec.Template.Labels["app.kubernetes.io/name"] &&
				svc.Spec.Ports[0].Port == 4222 && bus.Spec.Template.Spec.Containers[0].Ports[0].ContainerPort == 4222
		}
		if !found {
			t.Errorf("mesh url %s is not a Service on port 4222 selecting the NATS pods", cfg.Mesh.URL)
		}
	}
	// The gorgo Deployment mounts the ConfigMap, reads the Secret, and is
	// ready on /readyz (/health's twin) and alive on /livez of the port the
	// config listens on.
	c := d.Spec.Template.Spec.Containers[0]
	if v := d.Spec.Template.Spec.Volumes; len(v) == 0 || v[0].ConfigMap == nil || v[0].ConfigMap.Name != cms[0].Name {
		t.Errorf("volumes %+v", v)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe %+v", c.ReadinessProbe)
	}
	if c.Env[0].ValueFrom.SecretKeyRef.Name != secrets[0].Name || c.Env[0].Name != cfg.Admin.TokenEnv {
		t.Errorf("the admin token does not come from the Secret")
	}
	if !strings.HasSuffix(cfg.Proxy.Listen, ":8080") || c.Ports[0].ContainerPort != 8080 {
		t.Errorf("listen %s, container port %d", cfg.Proxy.Listen, c.Ports[0].ContainerPort)
	}
	if sel := d.Spec.Selector.MatchLabels; monitors[0].Spec.Selector.MatchLabels["app.kubernetes.io/name"] != sel["app.kubernetes.io/name"] {
		t.Errorf("the PodMonitor does not select the Deployment's pods")
	}
	if sc := d.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("the pod may run as root")
	}
	// Named ports exist, probes and the PodMonitor use them, the config
	// file is under the mounted path.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for what, port := range map[string]string{
		"readiness":  c.ReadinessProbe.HTTPGet.Port.String(),
		"podmonitor": deref(monitors[0].Spec.PodMetricsEndpoints[0].Port),
	} {
		if _, ok := ports[port]; !ok {
			t.Errorf("%s uses port %q, which the container does not name", what, port)
		}
	}
	// Alive is not ready: /livez answers while gorgo serves, where /readyz
	// fails while no replica is up (a restart would not mend that).
	if lp := c.LivenessProbe; lp == nil || lp.HTTPGet == nil || lp.HTTPGet.Path != "/livez" || lp.HTTPGet.Port.String() != c.ReadinessProbe.HTTPGet.Port.String() {
		t.Errorf("liveness probe %+v", c.LivenessProbe)
	}
	cfgArg := ""
	for i, a := range c.Args {
		if a == "--config" && i+1 < len(c.Args) {
			cfgArg = c.Args[i+1]
		}
	}
	mount := c.VolumeMounts[0].MountPath
	if cfgArg == "" || !strings.HasPrefix(cfgArg, mount+"/") || cms[0].Data[strings.TrimPrefix(cfgArg, mount+"/")] == "" {
		t.Errorf("--config %q is not a file of the ConfigMap mounted at %s", cfgArg, mount)
	}
}

// The image is built in two stages into a static binary on a distroless
// (or scratch) base, and runs as non-root.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var froms []string
	user := ""
	static := false
	for _, line := range bytes.Split(data, []byte("\n")) {
		f := strings.Fields(string(line))
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			froms = append(froms, f[1])
		case "USER":
			user = f[1]
		case "RUN":
			static = static || strings.Contains(string(line), "CGO_ENABLED=0")
		}
	}
	if len(froms) < 2 {
		t.Fatalf("not multi-stage: %v", froms)
	}
	last := froms[len(froms)-1]
	if !strings.Contains(last, "distroless/static") && last != "scratch" {
		t.Errorf("final base %s", last)
	}
	if !static {
		t.Error("the binary is not built static (CGO_ENABLED=0)")
	}
	if user == "" || strings.HasPrefix(user, "root") || strings.HasPrefix(user, "0") {
		t.Errorf("runs as %q", user)
	}
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
