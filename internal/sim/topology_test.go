package sim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPaperTopology(t *testing.T) {
	top, err := LoadTopology("paper")
	if err != nil {
		t.Fatal(err)
	}
	reps, err := top.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		id          string
		rtt, jitter time.Duration
	}{
		{"us-ashburn", 37 * time.Millisecond, 8 * time.Millisecond},
		{"eu-frankfurt", 279 * time.Millisecond, 80 * time.Millisecond},
		{"ap-seoul", 456 * time.Millisecond, 138 * time.Millisecond},
	}
	if len(reps) != len(want) {
		t.Fatalf("%d replicas", len(reps))
	}
	for i, w := range want {
		r := reps[i]
		if r.ID != w.id || r.RTT != w.rtt || r.Jitter != w.jitter || r.Profile.KVCapacityTokens != 983549 {
			t.Errorf("replica %d = %+v, want %+v", i, r, w)
		}
	}
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestTopologyYAML(t *testing.T) {
	path := writeFile(t, "fleet.yaml", `
router_region: east
rtt_matrix_ms:
  east: {west: 70}
  asia: {east: 180}
regions:
  - {name: east, rtt_ms: 2}
  - {name: west, jitter_ms: 5}
  - {name: asia}
replicas:
  - {region: east, profile: h100, count: 2}
  - {region: west, profile: paper, kv_capacity_tokens: 100000}
  - {name: big, region: asia, profile: paper, chunk_tokens: 8192}
`)
	top, err := LoadTopology(path)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := top.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(reps))
	for i, r := range reps {
		got[i] = r.ID + "@" + r.RTT.String() + "/" + r.Profile.Name
	}
	want := "east-1@2ms/qwen3.5-35b-h100 east-2@2ms/qwen3.5-35b-h100 west@70ms/qwen3.5-35b-l40sx2 big@180ms/qwen3.5-35b-l40sx2"
	if strings.Join(got, " ") != want {
		t.Errorf("replicas:\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	if reps[2].Profile.KVCapacityTokens != 100000 || reps[2].Jitter != 5*time.Millisecond || reps[3].Profile.ChunkTokens != 8192 {
		t.Errorf("overrides not applied: %+v %+v", reps[2], reps[3])
	}
	if top.Name != "fleet" {
		t.Errorf("name %q", top.Name)
	}
}

func TestTopologyRTTCSV(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rtt.csv"), []byte("Source,East US,Korea Central\nEast US,,185\nKorea Central,186,\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "t.yaml")
	if err := os.WriteFile(path, []byte("router_region: East US\nrtt_matrix_csv: rtt.csv\nregions: [{name: East US, rtt_ms: 1}, {name: Korea Central}]\nreplicas: [{region: Korea Central, profile: paper}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	top, err := LoadTopology(path)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := top.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	if reps[0].RTT != 185*time.Millisecond {
		t.Errorf("RTT %v, want 185ms", reps[0].RTT)
	}
}

func TestTopologyErrors(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{"router_region: a\nregions: [{name: a, rtt_ms: 1}]\nreplicas: [{region: a, profile: paper}]\nextra: 1\n", "line 4: unknown field extra"},
		{"regions: [{name: a, rtt_ms: 1}]\nreplicas: [{region: a, profile: paper}]\n", "router_region is not set"},
		{"router_region: a\nregions: [{name: a}]\nreplicas: [{region: a, profile: paper}]\n", "no round trip"},
		{"router_region: a\nregions: [{name: a, rtt_ms: 1}]\nreplicas: [{region: b, profile: paper}]\n", "unknown region"},
		{"router_region: a\nregions: [{name: a, rtt_ms: 1}]\nreplicas: [{region: a, profile: tpu}]\n", "unknown engine profile \"tpu\" (valid:"},
		{"router_region: a\nregions: [{name: a, rtt_ms: 1}]\n", "no replicas"},
		{"router_region: a\nregions: [{name: a, rtt_ms: 1}]\nreplicas: [{region: a, profile: paper}, {region: a, profile: paper}]\n", "used twice"},
		// A round trip past an hour is refused, not converted to a Duration
		// that wraps negative (runs of negative TTFTs that looked valid); so
		// is a count of replicas more than a router holds, before any is
		// built (300 million ran the machine out of memory), however it is
		// reached.
		{"router_region: a\nregions: [{name: a, rtt_ms: 1}, {name: far, rtt_ms: 1e300}]\nreplicas: [{region: far, profile: paper}]\n", "at most 3.6e+06 ms"},
		{"router_region: a\nregions: [{name: a, rtt_ms: 1}]\nreplicas: [{region: a, profile: paper, count: 300000000}]\n", "more than 4096 replicas"},
		{"router_region: a\nregions: [{name: a, rtt_ms: 1}]\nreplicas: [{name: x, region: a, profile: paper, count: 4000}, {name: y, region: a, profile: paper, count: 97}]\n", "more than 4096 replicas"},
		{"router_region: a\nregions: [{name: a, rtt_ms: 1}]\nreplicas: [{name: x, region: a, profile: paper}, {name: y, region: a, profile: paper, count: 9223372036854775807}]\n", "more than 4096 replicas"},
		// A speed of 0 given is an error, not the default (a researcher's test, 2026-12-06).
		{"router_region: a\nregions: [{name: a, rtt_ms: 1}]\nreplicas: [{region: a, profile: paper, speed: 0}]\n", "speed must be a positive number, got 0"},
		{"router_region: a\nregions: [{name: a, rtt_ms: 1}]\nreplicas: [{region: a, profile: paper}]\n---\nrouter_region: b\n", "a second document"},
	}
	for _, c := range cases {
		path := writeFile(t, "t.yaml", c.yaml)
		top, err := LoadTopology(path)
		if err == nil {
			_, err = top.Resolve()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want it to contain %q", c.yaml, err, c.want)
		}
	}
	if _, err := LoadTopology("moon"); err == nil || !strings.Contains(err.Error(), "valid: paper") {
		t.Errorf("unknown preset: %v", err)
	}
}

func TestExampleTopologiesResolve(t *testing.T) {
	paths, _ := filepath.Glob("../../examples/topologies/*.yaml")
	if len(paths) == 0 {
		t.Fatal("no example topologies found")
	}
	for _, p := range paths {
		top, err := LoadTopology(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if top.RTTMatrixCSV != "" {
			if _, err := os.Stat(top.RTTMatrixCSV); err != nil {
				t.Logf("%s: skipped, its RTT matrix is not here: %v", p, err)
				continue
			}
		}
		if _, err := top.Resolve(); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}
