package admin

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/policy/policytest"
	"github.com/gorgo-llm/gorgo/internal/servetest"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// The admin API wants a token when one is configured; the client port
// never serves it.
func TestAdminAuth(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("# operators\nalice s3cret-s3cret-s3cret\nbob-is-long-enough-too\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs servetest.Log
	r := startReplica(t, 2*time.Millisecond, emulator.Faults{})
	cfg := testConfig{Admin: Config{TokenFile: tokens}, Log: slog.New(slog.NewTextHandler(&logs, nil))}
	s := startAdmin(t, cfg, r)
	admin := s.adminURL
	for _, h := range [][]string{nil, {"Authorization", "Bearer wrong-wrong-wrong-wrong"}, {"Authorization", "s3cret-s3cret-s3cret"}} {
		code, body := do(t, "GET", admin+"/admin/replicas", "", h...)
		if code != 401 || !strings.Contains(body, `"code":401`) {
			t.Errorf("header %v: %d %s, want a 401 in OpenAI's shape", h, code, body)
		}
	}
	if code, _ := do(t, "GET", admin+"/admin/replicas", "", "Authorization", "Bearer s3cret-s3cret-s3cret"); code != 200 {
		t.Errorf("alice's token: %d", code)
	}
	if code, _ := do(t, "POST", admin+"/admin/replicas/a/drain", "", "Authorization", "Bearer bob-is-long-enough-too"); code != 200 {
		t.Errorf("the unnamed token: %d", code)
	}
	if !strings.Contains(logs.String(), "op=drain") || !strings.Contains(logs.String(), "who="+tokens+":3") {
		t.Errorf("the log does not say who drained: %s", logs.String())
	}
	if code, _ := do(t, "GET", s.client+"/admin/replicas", "", "Authorization", "Bearer s3cret-s3cret-s3cret"); code != 404 {
		t.Errorf("client port /admin/replicas: %d, want 404", code)
	}
	// A known path with the wrong method: a 405 in OpenAI's shape.
	if code, body := do(t, "DELETE", admin+"/admin/weights", "", "Authorization", "Bearer s3cret-s3cret-s3cret"); code != 405 || !strings.Contains(body, "GET, PUT") {
		t.Errorf("DELETE /admin/weights: %d %s", code, body)
	}
	// A token on the environment instead.
	t.Setenv("GORGO_TEST_TOKEN", "from-the-environment")
	cfg.Admin = Config{TokenEnv: "GORGO_TEST_TOKEN", Listen: "0.0.0.0:0"}
	admin2 := startAdmin(t, cfg, r).adminURL
	if code, _ := do(t, "GET", admin2+"/admin/weights", "", "Authorization", "Bearer from-the-environment"); code != 200 {
		t.Errorf("env token: %d", code)
	}
	if code, _ := do(t, "GET", admin2+"/admin/weights", ""); code != 401 {
		t.Errorf("no token: %d", code)
	}
	// Refused: a non-loopback admin address without a token, a short token.
	for _, a := range []Config{{Listen: "0.0.0.0:9091"}, {Listen: "[::]:9091"}, {Listen: "10.1.2.3:9091"}} {
		cfg.Admin = a
		if _, err := newRouter(t, cfg, r); err == nil || !strings.Contains(err.Error(), "without a token") {
			t.Errorf("%s: %v", a.Listen, err)
		}
	}
	os.WriteFile(tokens, []byte("short\n"), 0o600)
	cfg.Admin = Config{TokenFile: tokens}
	if _, err := newRouter(t, cfg, r); err == nil {
		t.Error("a 5-character token accepted")
	}
}

// Weights set through the admin API apply to the next decision, and are
// validated.
func TestAdminWeightsAndTuner(t *testing.T) {
	// The default policy shows and takes its decode weights.
	admin := startAdmin(t, testConfig{}, startReplica(t, 2*time.Millisecond, emulator.Faults{})).adminURL
	if code, body := do(t, "PUT", admin+"/admin/weights", `{"decode":0.7}`); code != 200 || !strings.Contains(body, `"policy": "gorgo-e2e"`) ||
		!strings.Contains(body, `"decode": 0.7`) || !strings.Contains(body, `"itl": 0.2`) {
		t.Errorf("set decode: %d %s", code, body)
	}
	admin = startAdmin(t, testConfig{Fleet: fleet.Config{Policy: "gorgo"}}, startReplica(t, 2*time.Millisecond, emulator.Faults{})).adminURL
	if code, body := do(t, "PUT", admin+"/admin/weights", `{"decode":0.7}`); code != 400 {
		t.Errorf("decode weight for gorgo: %d %s", code, body)
	}
	if code, body := do(t, "PUT", admin+"/admin/weights", `{"rtt":1.5}`); code != 200 || !strings.Contains(body, `"rtt": 1.5`) || !strings.Contains(body, `"queue": 0.5`) {
		t.Errorf("set: %d %s", code, body)
	}
	if code, _ := do(t, "PUT", admin+"/admin/weights", `{"rtt":-1}`); code != 400 {
		t.Errorf("negative weight: %d", code)
	}
	if _, body := do(t, "GET", admin+"/admin/weights", ""); !strings.Contains(body, `"rtt": 1.5`) {
		t.Errorf("get: %s", body)
	}
	if code, _ := do(t, "POST", admin+"/admin/tuner/pause", ""); code != 404 {
		t.Errorf("pausing a policy that does not tune: %d", code)
	}
	big := strings.NewReader(strings.Repeat("x", 9<<20)) // over max_body_bytes (8 MiB)
	resp, err := http.Post(admin+"/admin/decide", "application/json", big)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Errorf("oversized decide: %d, want 413", resp.StatusCode)
	}
}

// Explaining a decision moves nothing: round-robin keeps alternating.
func TestDecideIsADryRun(t *testing.T) {
	s := startAdmin(t, testConfig{Fleet: fleet.Config{Policy: "round-robin"}}, startReplica(t, 2*time.Millisecond, emulator.Faults{}), startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	admin, url := s.adminURL, s.client
	var got []string
	for i := range 4 {
		resp, err := http.Post(admin+"/admin/decide", "application/json", strings.NewReader(servetest.ChatBody("where?", 1, false)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got = append(got, chat(t, url, fmt.Sprintf("q%d", i), 1).Replica)
	}
	if strings.Join(got, "") != "abab" {
		t.Errorf("round-robin with explanations in between went %v, want a b a b", got)
	}
}

// A policy of one file (policytest) shows and takes its own parameter
// through /admin/weights, as the default policy does its weights.
func TestWeightsOfAPolicyOfOneFile(t *testing.T) {
	admin := startAdmin(t, testConfig{Fleet: fleet.Config{Policy: policytest.Name, Params: map[string]policy.Values{policytest.Name: {"gain": 2}}}},
		startReplica(t, 2*time.Millisecond, emulator.Faults{})).adminURL
	if code, body := do(t, "GET", admin+"/admin/weights", ""); code != 200 || !strings.Contains(body, `"gain": 2`) || !strings.Contains(body, `"policy": "test-gain"`) {
		t.Errorf("get: %d %s", code, body)
	}
	if code, body := do(t, "PUT", admin+"/admin/weights", `{"gain":0.5}`); code != 200 || !strings.Contains(body, `"gain": 0.5`) {
		t.Errorf("set: %d %s", code, body)
	}
	if code, body := do(t, "PUT", admin+"/admin/weights", `{"rtt":1}`); code != 400 || !strings.Contains(body, "valid: gain") {
		t.Errorf("a parameter it does not have: %d %s", code, body)
	}
	if code, body := do(t, "PUT", admin+"/admin/weights", `{"gain":-1}`); code != 400 {
		t.Errorf("a negative gain: %d %s", code, body)
	}
	if _, body := do(t, "GET", admin+"/metrics", ""); !strings.Contains(body, `gorgo_policy_weight{policy="test-gain",weight="gain"} 0.5`) {
		t.Error("the metric does not show the gain set")
	}
}

// The replicas API: add (201), drain, undrain, remove, with 409 for an id
// in the fleet, 400 for a bad URL or an unknown field, 404 for no such
// replica.
func TestReplicasAPI(t *testing.T) {
	s := startAdmin(t, testConfig{}, startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	c := startReplica(t, 2*time.Millisecond, emulator.Faults{})
	for _, op := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/admin/replicas", `{"id":"c","url":"` + c.URL + `","region":"rc"}`, 201},
		{"POST", "/admin/replicas", `{"id":"a","url":"` + c.URL + `"}`, 409},
		{"POST", "/admin/replicas", `{"id":"d","url":"ftp://x"}`, 400},
		{"POST", "/admin/replicas", `{"id":"d","url":"http://x","zone":"z"}`, 400},
		{"POST", "/admin/replicas", `{"url":"http://x"}`, 400},
		// A config file's entry, whole (2026-12-07, a user's test: models,
		// adapters and max_loras were unknown fields here).
		{"POST", "/admin/replicas", `{"id":"e","url":"http://127.0.0.1:1","models":["m1"],"adapters":["sql"],"max_loras":2,"profile":"paper"}`, 201},
		{"POST", "/admin/replicas", `{"id":"f","url":"http://127.0.0.1:1","max_loras":-1}`, 400},
		// Not a replica's key from the router's environment: it would go
		// to a URL the caller picks.
		{"POST", "/admin/replicas", `{"id":"g","url":"http://127.0.0.1:1","api_key_env":"HOME"}`, 400},
		{"DELETE", "/admin/replicas/e", "", 200},
		{"POST", "/admin/replicas/c/drain", "", 200},
		{"POST", "/admin/replicas/c/undrain", "", 200},
		{"DELETE", "/admin/replicas/c", "", 200},
		{"POST", "/admin/replicas/nobody/drain", "", 404},
		{"DELETE", "/admin/replicas/nobody", "", 404},
	} {
		if code, body := do(t, op.method, s.adminURL+op.path, op.body); code != op.want {
			t.Errorf("%s %s %s: %d %s, want %d", op.method, op.path, op.body, code, body, op.want)
		}
	}
	servetest.Eventually(t, "c to leave", func() bool { return !s.Router().Has("c") })
	if _, body := do(t, "GET", s.adminURL+"/admin/replicas", ""); !strings.Contains(body, `"source": "config"`) || strings.Contains(body, `"id": "c"`) {
		t.Errorf("replicas: %s", body)
	}
	// The endpoints a replica answered it has no route for.
	if err := s.Router().Lacks("a", "/generate", s.Now()); err != nil {
		t.Fatal(err)
	}
	if _, body := do(t, "GET", s.adminURL+"/admin/replicas", ""); !strings.Contains(body, `"lacking_endpoints": [`+"\n"+`        "/generate"`) {
		t.Errorf("replicas, a without /generate: %s", body)
	}
}

// /admin/tuner shows the online tuner over the default policy, as gorgo
// serve runs it: what it tunes from, its counts, and its fallbacks to the
// starting weights when the fleet changed under weights it had learned.
func TestTunerShowsFallbacks(t *testing.T) {
	o, err := tune.NewOnline(tune.OnlineConfig{Base: policy.DefaultName, Window: 256, Block: time.Minute, ES: tune.Config{Seed: 1}})
	if err != nil {
		t.Fatal(err)
	}
	admin := startAdmin(t, testConfig{Policy: o}, startReplica(t, 2*time.Millisecond, emulator.Faults{})).adminURL
	code, body := do(t, "GET", admin+"/admin/tuner", "")
	if code != 200 || !strings.Contains(body, `"base": "gorgo-e2e"`) || !strings.Contains(body, `"fallbacks": 0`) || !strings.Contains(body, `"decode": 0.2`) {
		t.Errorf("GET /admin/tuner: %d %s", code, body)
	}
	// The round under way, and no verdicts yet as an empty list.
	for _, want := range []string{`"objective": "p95-ttft"`, `"judges": "streamed answers"`, `"unjudged_decisions": 0`, `"window": 256`, `"incumbent": 0`, `"confirming": false`, `"history": []`} {
		if !strings.Contains(body, want) {
			t.Errorf("GET /admin/tuner lacks %s: %s", want, body)
		}
	}
	if code, body := do(t, "POST", admin+"/admin/tuner/pause", ""); code != 200 || !strings.Contains(body, `"paused": true`) {
		t.Errorf("pause: %d %s", code, body)
	}
	// Weights set while it tunes are its start from then on (2026-12-07, a
	// user's test: every PUT was a 409 with the default config, a
	// malformed body included, and the live view's weights did nothing).
	for _, bad := range []string{`{`, `{"decode":-1}`, `{"decode":"x"}`, `{"policy":"gorgo","decode":0.7}`} {
		if code, body := do(t, "PUT", admin+"/admin/weights", bad); code != 400 {
			t.Errorf("PUT %s while tuning: %d %s, want 400", bad, code, body)
		}
	}
	if code, body := do(t, "PUT", admin+"/admin/weights", `{"policy":"gorgo-online","decode":0.7}`); code != 200 || !strings.Contains(body, `"decode": 0.7`) || !strings.Contains(body, `"itl": 0.2`) || !strings.Contains(body, `"base": "gorgo-e2e"`) {
		t.Errorf("setting weights the tuner tunes: %d %s", code, body)
	}
	if _, body := do(t, "GET", admin+"/admin/tuner", ""); !strings.Contains(body, `"decode": 0.7`) || !strings.Contains(body, `"paused": true`) {
		t.Errorf("the tuner after weights were set: %s", body)
	}
	round := o.Round()
	if code, body := do(t, "PUT", admin+"/admin/weights", `{}`); code != 200 || !strings.Contains(body, `"decode": 0.7`) || o.Round().Candidate["decode"] != round.Candidate["decode"] {
		t.Errorf("PUT of no weights while tuning: %d %s; the round changed: %v, was %v", code, body, o.Round(), round)
	}
	_, body = do(t, "GET", admin+"/metrics", "")
	for _, want := range []string{"gorgo_tuner_judged_total 0", "gorgo_tuner_fallbacks_total 0", "gorgo_tuner_paused 1", "gorgo_tuner_step_size 0.5",
		"gorgo_output_estimate_tokens 256", "gorgo_output_estimate_depth 0", "gorgo_output_estimate_keys 0",
		`gorgo_policy_weight{policy="gorgo-online",weight="decode"} 0.7`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// The tuner's verdicts name the parameters they tried.
func TestTunerSteps(t *testing.T) {
	o, err := tune.NewOnline(tune.OnlineConfig{Base: policy.DefaultName, Window: 1, Hop: 1, ES: tune.Config{Seed: 1}})
	if err != nil {
		t.Fatal(err)
	}
	reps := []policy.Replica{{ID: "a"}, {ID: "b"}}
	var d policy.Decision
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range 4 {
		if err := o.Decide(&d, &policy.Request{PromptTokens: 10}, reps, rng); err != nil {
			t.Fatal(err)
		}
		o.Learn(d.Tag, policy.Outcome{TTFT: time.Duration(1+i) * time.Second, E2E: time.Second})
	}
	steps := tunerSteps(o, 1)
	if len(steps) != 1 || len(tunerSteps(o, 0)) != 2 {
		t.Fatalf("steps %+v, want the last of 2", steps)
	}
	s := steps[0]
	if _, ok := s.Candidate["itl"]; !ok || len(s.Candidate) != 2 || s.Score == nil || *s.Score != 4000 || s.IncumbentScore == nil || *s.IncumbentScore != 3000 || s.Accepted || s.Reason != "worse" {
		t.Errorf("step %+v: want decode and itl, 4 s against 3 s, rejected as worse", s)
	}
	// A window whose requests all failed has no objective: the verdict
	// still encodes, its scores null.
	for range 2 {
		if err := o.Decide(&d, &policy.Request{PromptTokens: 10}, reps, rng); err != nil {
			t.Fatal(err)
		}
		o.Learn(d.Tag, policy.Outcome{Failed: true})
	}
	b, err := json.Marshal(tunerSteps(o, 1))
	if err != nil || !strings.Contains(string(b), `"score":null`) {
		t.Errorf("a verdict without scores: %s, %v; want null scores", b, err)
	}
}

// Weights large enough that the costs overflow still explain a decision:
// the terms that are not finite are null (2026-12-06, a user's test:
// /admin/decide answered an empty 200, and the live view's stream closed
// until 50 new decisions had pushed the bad ones out).
func TestDecideWithWeightsThatOverflow(t *testing.T) {
	admin := startAdmin(t, testConfig{}, startReplica(t, 2*time.Millisecond, emulator.Faults{})).adminURL
	if code, body := do(t, "PUT", admin+"/admin/weights", `{"rtt":1e308,"queue":1e308,"decode":1e308,"itl":1e308}`); code != 200 {
		t.Fatalf("set: %d %s", code, body)
	}
	code, body := do(t, "POST", admin+"/admin/decide", servetest.ChatBody("where?", 1, false))
	var out map[string]any
	if err := json.Unmarshal([]byte(body), &out); code != 200 || err != nil || !strings.Contains(body, "null") {
		t.Errorf("decide: %d %q (%v)", code, body, err)
	}
}

// What GET /admin/weights shows (and gorgo tune writes) can be PUT back:
// its "policy" names the running one; another's is refused (2026-12-06: a
// 400 on the key itself).
func TestWeightsRoundTrip(t *testing.T) {
	admin := startAdmin(t, testConfig{}, startReplica(t, 2*time.Millisecond, emulator.Faults{})).adminURL
	code, body := do(t, "GET", admin+"/admin/weights", "")
	if code != 200 {
		t.Fatalf("get: %d %s", code, body)
	}
	if code, got := do(t, "PUT", admin+"/admin/weights", body); code != 200 {
		t.Errorf("the GET's own answer put back: %d %s", code, got)
	}
	if code, got := do(t, "PUT", admin+"/admin/weights", `{"policy":"gorgo-ms","rtt":1}`); code != 400 || !strings.Contains(got, "the router runs gorgo-e2e") {
		t.Errorf("another policy's weights: %d %s", code, got)
	}
	if code, got := do(t, "PUT", admin+"/admin/weights", `{"policy":"default","decode":0.3,"itl":null}`); code != 400 || !strings.Contains(got, "itl: want a number, got null") {
		t.Errorf("a null weight: %d %s", code, got)
	}
}
