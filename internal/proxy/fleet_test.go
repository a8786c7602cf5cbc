package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/discover"
	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/replay"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// workload is light conversations, one request every 10 ms for about n
// seconds: 40 sessions whose prompts grow by a block a turn, a few output
// tokens each (cheap enough for a loaded machine; the proxy's bookkeeping
// is what is tested).
func workload(t *testing.T, seconds int) []trace.Request {
	t.Helper()
	n := seconds * 100
	reqs := make([]trace.Request, n)
	for i := range reqs {
		session, turn := i%40, 1+i/40
		blocks := min(turn, 4)
		ids := make([]uint64, blocks)
		for k := range ids {
			ids[k] = uint64(session)<<16 | uint64(k)
		}
		reqs[i] = trace.Request{Time: time.Duration(i) * 10 * time.Millisecond, Session: fmt.Sprint("s", session), Turn: turn,
			InputTokens: blocks * trace.BlockTokens, OutputTokens: 3, HashIDs: ids}
	}
	return reqs
}

// replayInBackground replays reqs through the proxy; the result comes on
// the channel.
func replayInBackground(t *testing.T, url string, reqs []trace.Request) <-chan *replay.Result {
	t.Helper()
	out := make(chan *replay.Result, 1)
	go func() {
		res, err := replay.Run(context.Background(), replay.Config{Target: url, Requests: reqs, MaxInflight: 32})
		if err != nil {
			t.Error(err)
		}
		out <- res
	}()
	return out
}

// eventually polls cond for up to 20 s (generous: the machine may be busy).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func do(t *testing.T, method, url, body string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func replicaState(t *testing.T, s *Server, id string) router.ReplicaState {
	t.Helper()
	st, err := s.Router().Replica(id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// served returns how many completions requests have reached the replica.
func (r *replica) served() int64 { return r.count.Load() }

// Replicas added, drained, undrained and removed through the admin API
// while a replay runs: no request fails, the new replica takes traffic
// without waiting for a periodic probe, the drained one takes none, the
// removed one leaves once idle.
func TestFleetChangesWhileServing(t *testing.T) {
	a, b, c := startReplica(t, 10*time.Millisecond, emulator.Faults{}), startReplica(t, 20*time.Millisecond, emulator.Faults{}),
		startReplica(t, 15*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, Config{ProbeInterval: time.Hour, Policy: "round-robin"}, a, b)
	admin := adminURL(t, s)
	reqs := workload(t, 6)
	done := replayInBackground(t, url, reqs)

	eventually(t, "a fifth of the replay", func() bool { return a.served()+b.served() > int64(len(reqs)/5) })
	if code, body := do(t, "POST", admin+"/admin/replicas", fmt.Sprintf(`{"id":"c","url":%q,"region":"rc","profile":"paper"}`, c.url)); code != 201 {
		t.Fatalf("add: %d %s", code, body)
	}
	// The periodic probe is an hour away: only the probe at the add can
	// make it routable.
	eventually(t, "traffic to the added replica", func() bool { return c.served() > 0 })

	if code, body := do(t, "POST", admin+"/admin/replicas/a/drain", ""); code != 200 || !strings.Contains(body, `"state": "draining"`) {
		t.Fatalf("drain: %d %s", code, body)
	}
	bound := a.served() + int64(replicaState(t, s, "a").InFlight) // what was already on its way
	eventually(t, "half of the replay", func() bool { return a.served()+b.served()+c.served() > int64(len(reqs)/2) })
	if got := a.served(); got > bound {
		t.Errorf("the drained replica took %d new requests", got-bound)
	}
	if code, _ := do(t, "POST", admin+"/admin/replicas/a/undrain", ""); code != 200 {
		t.Fatalf("undrain: %d", code)
	}
	if code, _ := do(t, "DELETE", admin+"/admin/replicas/b", ""); code != 200 {
		t.Fatalf("delete: %d", code)
	}
	afterRemove := b.served() + int64(max(0, stateOr(s, "b").InFlight))
	res := <-done
	if res == nil {
		t.Fatal("no replay result")
	}
	failed := 0
	for _, r := range res.Records {
		if r.Failed {
			failed++
			if failed < 4 {
				t.Errorf("request %d failed: %s", r.Index, r.Error)
			}
		}
	}
	if failed > 0 || len(res.Records) != len(reqs) {
		t.Fatalf("%d of %d requests failed", failed, len(res.Records))
	}
	if b.served() > afterRemove {
		t.Errorf("the removed replica took %d new requests", b.served()-afterRemove)
	}
	eventually(t, "the removed replica to leave", func() bool { return !s.Router().Has("b") })
	if code, _ := do(t, "POST", admin+"/admin/replicas/b/drain", ""); code != 404 {
		t.Errorf("drain of a removed replica: %d, want 404", code)
	}
}

func stateOr(s *Server, id string) router.ReplicaState {
	st, _ := s.Router().Replica(id)
	return st
}

// A membership change leaves the other replicas' state alone: their RTT
// estimates and prefix-index shares are exactly as they were.
func TestFleetChangesKeepOthersState(t *testing.T) {
	a, b := startReplica(t, 10*time.Millisecond, emulator.Faults{}), startReplica(t, 20*time.Millisecond, emulator.Faults{})
	s, url := startProxy(t, Config{ProbeInterval: time.Hour, Policy: "round-robin"}, a, b)
	admin := adminURL(t, s)
	for i := range 6 {
		if res := chat(t, url, fmt.Sprintf("conversation %d: %s", i, strings.Repeat("words ", 300)), 2); res.status != 200 {
			t.Fatalf("%+v", res)
		}
	}
	before := []router.ReplicaState{replicaState(t, s, "a"), replicaState(t, s, "b")}
	if before[0].IndexBlocks == 0 || before[1].IndexBlocks == 0 || before[0].RTT == 0 {
		t.Fatalf("nothing to keep: %+v", before)
	}
	c := startReplica(t, 5*time.Millisecond, emulator.Faults{})
	for _, op := range []struct{ method, path, body string }{
		{"POST", "/admin/replicas", fmt.Sprintf(`{"id":"c","url":%q}`, c.url)},
		{"POST", "/admin/replicas/c/drain", ""},
		{"POST", "/admin/replicas/c/undrain", ""},
		{"DELETE", "/admin/replicas/c", ""},
	} {
		if code, body := do(t, op.method, admin+op.path, op.body); code >= 300 {
			t.Fatalf("%s %s: %d %s", op.method, op.path, code, body)
		}
		after := []router.ReplicaState{replicaState(t, s, "a"), replicaState(t, s, "b")}
		for i := range before {
			if after[i].RTT != before[i].RTT || after[i].IndexBlocks != before[i].IndexBlocks || after[i].RTTSamples != before[i].RTTSamples {
				t.Errorf("%s %s changed %s: %+v -> %+v", op.method, op.path, before[i].ID, before[i], after[i])
			}
		}
	}
	if code, _ := do(t, "POST", admin+"/admin/replicas", fmt.Sprintf(`{"id":"a","url":%q}`, c.url)); code != 409 {
		t.Errorf("adding an existing id: %d, want 409", code)
	}
	if code, _ := do(t, "POST", admin+"/admin/replicas", `{"id":"d","url":"ftp://x"}`); code != 400 {
		t.Errorf("adding a bad URL: %d, want 400", code)
	}
	if code, _ := do(t, "POST", admin+"/admin/replicas", `{"id":"d","url":"http://x","zone":"z"}`); code != 400 {
		t.Errorf("an unknown field: %d, want 400", code)
	}
}

// The admin API wants a token when one is configured; the client port
// never serves it.
func TestAdminAuth(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("# operators\nalice s3cret-s3cret-s3cret\nbob-is-long-enough-too\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	r := startReplica(t, 2*time.Millisecond, emulator.Faults{})
	cfg := Config{Admin: AdminConfig{TokenFile: tokens}, Replicas: []ReplicaConfig{{ID: "a", URL: r.url}}}
	s, err := New(cfg, nil, prometheus.NewRegistry(), "", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	admin := adminURL(t, s)
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
	ts := httptestServer(t, s.Handler())
	if code, _ := do(t, "GET", ts+"/admin/replicas", "", "Authorization", "Bearer s3cret-s3cret-s3cret"); code != 404 {
		t.Errorf("client port /admin/replicas: %d, want 404", code)
	}
	// A token on the environment instead.
	t.Setenv("GORGO_TEST_TOKEN", "from-the-environment")
	cfg.Admin = AdminConfig{TokenEnv: "GORGO_TEST_TOKEN", Listen: "0.0.0.0:0"}
	s2, err := New(cfg, nil, prometheus.NewRegistry(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	admin2 := adminURL(t, s2)
	if code, _ := do(t, "GET", admin2+"/admin/weights", "", "Authorization", "Bearer from-the-environment"); code != 200 {
		t.Errorf("env token: %d", code)
	}
	if code, _ := do(t, "GET", admin2+"/admin/weights", ""); code != 401 {
		t.Errorf("no token: %d", code)
	}
	// Refused: a non-loopback admin address without a token, a short token.
	for _, a := range []AdminConfig{{Listen: "0.0.0.0:9091"}, {Listen: "[::]:9091"}, {Listen: "10.1.2.3:9091"}} {
		cfg.Admin = a
		if _, err := New(cfg, nil, prometheus.NewRegistry(), "", nil); err == nil || !strings.Contains(err.Error(), "without a token") {
			t.Errorf("%s: %v", a.Listen, err)
		}
	}
	os.WriteFile(tokens, []byte("short\n"), 0o600)
	cfg.Admin = AdminConfig{TokenFile: tokens}
	if _, err := New(cfg, nil, prometheus.NewRegistry(), "", nil); err == nil {
		t.Error("a 5-character token accepted")
	}
}

func httptestServer(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return "http://" + ln.Addr().String()
}

// Weights set through the admin API apply to the next decision, and are
// validated.
func TestAdminWeightsAndTuner(t *testing.T) {
	// The default policy shows and takes its decode weights.
	s, _ := startProxy(t, Config{}, startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	admin := adminURL(t, s)
	if code, body := do(t, "PUT", admin+"/admin/weights", `{"decode":0.7}`); code != 200 || !strings.Contains(body, `"policy": "gorgo-e2e"`) ||
		!strings.Contains(body, `"decode": 0.7`) || !strings.Contains(body, `"itl": 0.2`) {
		t.Errorf("set decode: %d %s", code, body)
	}
	s, _ = startProxy(t, Config{Policy: "gorgo"}, startReplica(t, 2*time.Millisecond, emulator.Faults{}))
	admin = adminURL(t, s)
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

// writeConfig writes a config file of replicas id=url.
func writeConfig(t *testing.T, path string, extra string, reps map[string]*replica) {
	t.Helper()
	var b strings.Builder
	b.WriteString("probe_interval: 1h\nconfig_poll: 20ms\nadmin: {listen: \"off\"}\n" + extra + "replicas:\n")
	for _, id := range []string{"a", "b", "c", "d"} {
		if r := reps[id]; r != nil {
			fmt.Fprintf(&b, "  - {id: %s, url: %q, region: r%s, profile: paper}\n", id, r.url, id)
		}
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// A rename, as editors and config-map updates do; the time moves on
	// so that the modification time changes on coarse file systems.
	later := time.Now().Add(time.Duration(len(b.String())) * time.Millisecond)
	os.Chtimes(tmp, later, later)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startFromFile runs a proxy from a config file.
func startFromFile(t *testing.T, path string) (*Server, string, *syncBuffer) {
	t.Helper()
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	s, err := New(cfg, nil, prometheus.NewRegistry(), path, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.ProbeOnce(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- s.Run(ctx) }()
	url := httptestServer(t, s.Handler())
	t.Cleanup(func() {
		cancel()
		<-runDone
	})
	return s, url, &logs
}

// A config file that changes while a replay runs through the proxy: the
// replicas it keeps keep their state, the one it drops is drained then
// removed, the one it adds takes traffic; a broken file changes nothing.
func TestConfigReloadWhileServing(t *testing.T) {
	a, b, c := startReplica(t, 10*time.Millisecond, emulator.Faults{}), startReplica(t, 20*time.Millisecond, emulator.Faults{}),
		startReplica(t, 15*time.Millisecond, emulator.Faults{})
	path := filepath.Join(t.TempDir(), "serve.yaml")
	writeConfig(t, path, "policy: round-robin\n", map[string]*replica{"a": a, "b": b})
	s, url, logs := startFromFile(t, path)
	reqs := workload(t, 5)
	done := replayInBackground(t, url, reqs)
	eventually(t, "a third of the replay", func() bool { return a.served()+b.served() > int64(len(reqs)/3) })

	// Broken files change nothing: one that does not parse, one that does
	// not validate.
	keptA := replicaState(t, s, "a")
	for _, broken := range []string{"replicas: [\n", "replicas:\n  - {id: a, url: \"ftp://nope\"}\n"} {
		os.WriteFile(path, []byte(broken), 0o644)
		if err := s.Reload(); err == nil {
			t.Errorf("a broken config reloaded: %q", broken)
		}
		if !s.Router().Has("a") || !s.Router().Has("b") || s.Router().Len() != 2 {
			t.Fatalf("a broken config changed the fleet: %+v", s.Router().Replicas())
		}
	}
	if !strings.Contains(logs.String(), "the running config stays") {
		t.Errorf("no error logged for the broken file: %s", logs.String())
	}

	// b leaves, c joins, a stays; the listen address cannot change live.
	writeConfig(t, path, "policy: round-robin\nlisten: 127.0.0.1:1\n", map[string]*replica{"a": a, "c": c})
	eventually(t, "the changed file to be applied (by polling its time)", func() bool { return s.Router().Has("c") })
	eventually(t, "traffic to the added replica", func() bool { return c.served() > 0 })
	bound := b.served() + int64(stateOr(s, "b").InFlight)
	st := replicaState(t, s, "a")
	if st.RTT != keptA.RTT || st.RTTSamples != keptA.RTTSamples || st.State != router.Active {
		t.Errorf("a's state was not kept: %+v -> %+v", keptA, st)
	}
	res := <-done
	failed := 0
	for _, r := range res.Records {
		if r.Failed {
			failed++
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d requests failed across reloads", failed, len(res.Records))
	}
	if b.served() > bound {
		t.Errorf("the removed replica took %d new requests", b.served()-bound)
	}
	eventually(t, "b to leave", func() bool { return !s.Router().Has("b") })
	if !strings.Contains(logs.String(), "needs_restart") || !strings.Contains(logs.String(), "listen (running") {
		t.Errorf("the log does not say the listen address needs a restart: %s", logs.String())
	}
	if s.Config().Listen == "127.0.0.1:1" {
		t.Error("the running listen address changed")
	}
}

// fakeDNS answers SRV lookups from a set the test changes.
type fakeDNS struct {
	mu    sync.Mutex
	ports []int
}

func (f *fakeDNS) set(ports ...int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ports = ports
}

func (f *fakeDNS) LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error) {
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (f *fakeDNS) LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*net.SRV
	for _, p := range f.ports {
		out = append(out, &net.SRV{Target: "127.0.0.1.", Port: uint16(p)})
	}
	return name, out, nil
}

func port(t *testing.T, r *replica) int {
	t.Helper()
	_, p, _ := net.SplitHostPort(strings.TrimPrefix(r.url, "http://"))
	var n int
	fmt.Sscan(p, &n)
	return n
}

// Replicas of a DNS group follow its records while a replay runs.
func TestDNSDiscoveryWhileServing(t *testing.T) {
	a, b, c := startReplica(t, 10*time.Millisecond, emulator.Faults{}), startReplica(t, 20*time.Millisecond, emulator.Faults{}),
		startReplica(t, 15*time.Millisecond, emulator.Faults{})
	dns := &fakeDNS{}
	dns.set(port(t, a), port(t, b))
	cfg := Config{ProbeInterval: time.Hour, Policy: "round-robin",
		Discover: []discover.Group{{SRV: "_http._tcp.engines.test", Region: "us", Profile: "paper", Interval: 20 * time.Millisecond}}}
	s, err := New(cfg, nil, prometheus.NewRegistry(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetResolver(dns)
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- s.Run(ctx) }()
	defer func() {
		cancel()
		<-runDone
	}()
	id := func(r *replica) string { return fmt.Sprintf("_http._tcp.engines.test@127.0.0.1:%d", port(t, r)) }
	eventually(t, "the group's replicas", func() bool {
		return s.Router().Len() == 2 && stateOr(s, id(a)).Available() && stateOr(s, id(b)).Available()
	})
	url := httptestServer(t, s.Handler())
	reqs := workload(t, 5)
	done := replayInBackground(t, url, reqs)
	eventually(t, "a third of the replay", func() bool { return a.served()+b.served() > int64(len(reqs)/3) })
	dns.set(port(t, a), port(t, c)) // b scaled down, c up
	eventually(t, "c to join", func() bool { return c.served() > 0 })
	eventually(t, "b to leave", func() bool { return !s.Router().Has(id(b)) })
	res := <-done
	for _, r := range res.Records {
		if r.Failed {
			t.Fatalf("request %d failed: %s", r.Index, r.Error)
		}
	}
	if st := stateOr(s, id(c)); st.Region != "us" {
		t.Errorf("discovered replica %+v", st)
	}
	_ = b
}
