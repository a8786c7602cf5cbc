package serve

import (
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admin"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/mesh"
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
