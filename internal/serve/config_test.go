package serve

import (
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admin"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/mesh"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/policy/policytest"
	"github.com/gorgo-llm/gorgo/internal/proxy"
	"github.com/gorgo-llm/gorgo/internal/tenant"
)

func TestExampleConfigsLoad(t *testing.T) {
	cfg, err := LoadConfig("../../examples/serve.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Replicas) != 3 || cfg.Params["gorgo"]["queue"] != 0.5 || cfg.Params["gorgo-e2e"]["decode"] != 0.2 || cfg.ProbeInterval != 5*time.Second || cfg.Admin.Listen != "127.0.0.1:9091" {
		t.Errorf("config %+v", cfg)
	}
	// Its comment offers any policy in place of its own (--policy): each
	// one validates with the rest of the file, gorgo-online (a tuner)
	// with tune on.
	for _, name := range append([]string{"gorgo-online"}, policy.LiveNames()...) {
		c := cfg
		c.Policy = name
		if err := c.Validate(); err != nil {
			t.Errorf("examples/serve.yaml with policy %s: %v", name, err)
		}
	}
	on := true
	c := cfg
	c.Policy, c.Tune = "gorgo-online", &on
	if err := c.Validate(); err != nil {
		t.Errorf("gorgo-online with tune: true: %v", err)
	}
	if cfg, err = LoadConfig("../../examples/serve-k8s.yaml"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GORGO_ADMIN_TOKEN", "a-token-long-enough")
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.Admin.Tokens(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Discover) != 2 || cfg.Discover[0].Port != 8000 || cfg.Discover[1].SRV == "" || cfg.Discover[1].Interval != 10*time.Second {
		t.Errorf("discover %+v", cfg.Discover)
	}
	if cfg, err = LoadConfig("../../examples/serve-mesh.yaml"); err != nil {
		t.Fatal(err)
	}
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Region != "us-ashburn" || cfg.Mesh == nil || cfg.Mesh.Embed != "127.0.0.1:4222" || cfg.Policy != "gorgo-e2e" {
		t.Errorf("mesh config %+v %+v", cfg, cfg.Mesh)
	}
	bad := cfg
	bad.Region, bad.Mesh = "", &mesh.Config{URL: "nats://x:4222"}
	if err := bad.Validate(); err == nil {
		t.Error("a mesh router with no name nor region accepted")
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []Config{
		{Admin: admin.Config{Listen: admin.Off}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}, Policy: "clairvoyant"}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}, Policy: "fastest"}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}}, Admin: admin.Config{Listen: "0.0.0.0:9091"}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}}, Admin: admin.Config{Listen: ":9091"}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "ftp://x"}}}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{ID: "a", URL: "http://x"}, {ID: "a", URL: "http://y"}}}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x", Profile: "tpu"}}}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}, RTTAlpha: 3}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}, MaxAttempts: -1}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}, OutputEstimate: "per-session"}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}, ImageTokens: -1}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}, ImageTokens: 1 << 20}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}, AudioTokensPerSecond: -1}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}, AudioTokensPerSecond: 5000}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}, VideoTokens: -1}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}, VideoTokens: 1 << 20}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}}, Proxy: proxy.Config{EngineOperations: "admin"}},
		{Config: fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}}, Proxy: proxy.Config{ShutdownTimeout: -time.Second}},
	}
	for i, c := range cases {
		if err := c.Defaults().Validate(); err == nil {
			t.Errorf("case %d accepted", i)
		}
	}
}

// Any config file is either refused with an error or defaulted into one
// that validates (or is refused by Validate): never a panic.
func FuzzConfig(f *testing.F) {
	for _, seed := range []string{
		"", "listen: 127.0.0.1:8080\nreplicas:\n  - {id: a, url: \"http://x:1\", profile: paper}\n",
		"admin: {listen: \"0.0.0.0:9\", token_env: X}\ndiscover:\n  - {dns: a.b, port: 80, interval: 1s}\n",
		"replicas: [{url: \"ftp://x\"}]\n", "weights: {rtt: -1}\n", "max_body_bytes: -5\nejection_time: 1h\n",
		"discover: [{srv: \"_http._tcp.x\", port: 1}]\n", "policy: clairvoyant\n", "bogus: 1\n", "[1, 2]\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data, "fuzz")
		if err != nil {
			return
		}
		d := c.Defaults()
		_ = d.Validate()
	})
}

// A policy's parameters are read from the key it registered or from
// params:, by asking the registry, for any policy (the one-file test
// policy included); a key no field or policy takes is an error.
func TestPolicyParamsInTheFile(t *testing.T) {
	cfg, err := ParseConfig([]byte("policy: test-gain\ngain_params: {gain: 2}\nparams: {default: {decode: 0.5}, gorgo: {rtt: 0.1}}\nweights: {queue: 0.2}\n"), "t")
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil && !strings.Contains(err.Error(), "no replicas") {
		t.Fatal(err)
	}
	p := cfg.Params
	if p[policytest.Name]["gain"] != 2 || p["gorgo-e2e"]["decode"] != 0.5 || p["gorgo"]["rtt"] != 0.1 || p["gorgo"]["queue"] != 0.2 {
		t.Errorf("params %v", p)
	}
	if o := cfg.PolicyOptions("gorgo"); o.Params["rtt"] != 0.1 {
		t.Errorf("gorgo's options %+v", o)
	}
	for text, want := range map[string]string{
		"listne: 127.0.0.1:1\n":         "field listne not found",
		"gain_params: {gain: x}\n":      "gain_params",
		"params: {fastest: {rtt: 1}}\n": "unknown policy",
		"params: {gorgo: {speed: 1}}\n": "no parameter \"speed\"",
		"e2e_weights: {decode: -1}\n":   "non-negative",
		"gain_params: [1, 2]\n":         "gain_params",
	} {
		c, err := ParseConfig([]byte("replicas: [{url: \"http://x:1\"}]\n"+text), "t")
		if err == nil {
			err = c.Defaults().Validate()
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", text, err, want)
		}
	}
}

// A config's type errors are one line in the config's terms, not yaml.v3's
// heading and Go's type names (2026-12-06, a user's test: "yaml: unmarshal
// errors:\n  line 14: field weight not found in type fleet.ReplicaConfig").
func TestConfigTypeErrorsAreOneLine(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"replicas:\n  - id: a\n    url: http://x\n    weight: 3\n", "config t.yaml: line 4: unknown field weight"},
		{"probe_interval: abc\n", "config t.yaml: line 1: `abc` is not a duration (e.g. 30s)"},
		{"admin: {bogus: 1}\n", "config t.yaml: line 1: unknown field bogus"},
		{"tune: maybe\n", "config t.yaml: line 1: `maybe` is not true or false"},
		{"max_attempts: [1]\n", "config t.yaml: line 1: a list is not an integer"},
		{"e2e_weights: {decode: x}\n", "config t.yaml: e2e_weights: line 1: `x` is not a number"},
		{"probe_interval: abc\nmax_attempts: x\n", "config t.yaml: line 1: `abc` is not a duration (e.g. 30s); line 2: `x` is not an integer"},
		// By the kind of the named type (a review: admit.Mode read as a mapping, uint64 as an integer).
		{"admission: [queue]\n", "config t.yaml: line 1: a list is not a string"},
		{"admission: {a: 1}\n", "config t.yaml: line 1: a mapping is not a string"},
		{"seed: -1\n", "config t.yaml: line 1: `-1` is not a non-negative integer"},
		{"max_attempts: |\n  one\n  two\n", "config t.yaml: line 1: `one two ` is not an integer"},
		{"max_attempts: a`b\n", "config t.yaml: line 1: `a`b` is not an integer"},
	} {
		_, err := ParseConfig([]byte(c.yaml), "t.yaml")
		if err == nil || err.Error() != c.want {
			t.Errorf("%q: %v, want %q", c.yaml, err, c.want)
		}
	}
}

// The engines' operations are allowed by default, as the engines serve
// them, but refused where tenants share the fleet (one client's sleep,
// abort of all or unload would be every team's: a user's test, 2026-12-07,
// put the fleet to sleep with the batch tenant's key); a config says
// otherwise.
func TestEngineOperationsDefault(t *testing.T) {
	base := fleet.Config{Replicas: []fleet.ReplicaConfig{{URL: "http://x"}}}
	shared := base
	shared.Tenants = map[string]tenant.Config{"chat": {}, "batch": {}}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Config: base}, proxy.OperationsAllow},
		{Config{Config: shared}, proxy.OperationsRefuse},
		{Config{Config: shared, Proxy: proxy.Config{EngineOperations: proxy.OperationsAllow}}, proxy.OperationsAllow},
		{Config{Config: base, Proxy: proxy.Config{EngineOperations: proxy.OperationsRefuse}}, proxy.OperationsRefuse},
	} {
		if got := c.cfg.Defaults().Proxy.EngineOperations; got != c.want {
			t.Errorf("tenants %v, engine_operations %q: %q, want %q", c.cfg.Tenants, c.cfg.Proxy.EngineOperations, got, c.want)
		}
	}
}

// An alias with several faults is refused on one line, its first (a
// user's test, 2026-12-07: a line each, and "models: models:").
func TestAliasErrorsAreOneLine(t *testing.T) {
	cfg, err := ParseConfig([]byte("replicas: [{url: \"http://x:1\"}]\nmodels: {chat: {a: -5}}\n"), "test")
	if err == nil {
		err = cfg.Defaults().Validate()
	}
	if err == nil || strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "models: models:") || !strings.Contains(err.Error(), `alias "chat"`) {
		t.Errorf("%v", err)
	}
}
