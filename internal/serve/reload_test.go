package serve

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admin"
	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/servetest"
)

// writeConfig writes a config file of replicas id=url, polled every 20 ms.
func writeConfig(t *testing.T, path string, extra string, reps map[string]*replica) {
	t.Helper()
	writePolledConfig(t, path, "20ms", extra, reps)
}

// writePolledConfig writes a config file of replicas id=url, polled every
// poll.
func writePolledConfig(t *testing.T, path, poll, extra string, reps map[string]*replica) {
	t.Helper()
	var b strings.Builder
	b.WriteString("probe_interval: 1h\nconfig_poll: " + poll + "\nadmin: {listen: \"off\"}\n" + extra + "replicas:\n")
	for _, id := range []string{"a", "b", "c", "d"} {
		if r := reps[id]; r != nil {
			fmt.Fprintf(&b, "  - {id: %s, url: %q, region: r%s, profile: paper}\n", id, r.URL, id)
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

// startFromFile runs a router from a config file.
func startFromFile(t *testing.T, path string) (*testRouter, *servetest.Log) {
	t.Helper()
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	var logs servetest.Log
	return startRouter(t, cfg, Options{Path: path, Log: slog.New(slog.NewTextHandler(&logs, nil))}), &logs
}

// A config file that changes while a replay runs through the proxy: the
// replicas it keeps keep their state, the one it drops is drained then
// removed, the one it adds takes traffic; a broken file changes nothing.
func TestConfigReloadWhileServing(t *testing.T) {
	a, b, c := startReplica(t, 10*time.Millisecond, emulator.Faults{}), startReplica(t, 20*time.Millisecond, emulator.Faults{}),
		startReplica(t, 15*time.Millisecond, emulator.Faults{})
	path := filepath.Join(t.TempDir(), "serve.yaml")
	writeConfig(t, path, "policy: round-robin\n", map[string]*replica{"a": a, "b": b})
	s, logs := startFromFile(t, path)
	url := s.client
	reqs := workload(5)
	done := replayInBackground(t, url, reqs)
	eventually(t, "a third of the replay", func() bool { return a.Served()+b.Served() > int64(len(reqs)/3) })

	// Broken files change nothing: one that does not parse, one that does
	// not validate.
	keptA := replicaState(t, s, "a")
	for _, broken := range []string{"replicas: [\n", "replicas:\n  - {id: a, url: \"ftp://nope\"}\n"} {
		os.WriteFile(path, []byte(broken), 0o644)
		if err := s.Reload(); err == nil {
			t.Errorf("a broken config reloaded: %q", broken)
		}
		if !s.Fleet.Router().Has("a") || !s.Fleet.Router().Has("b") || s.Fleet.Router().Len() != 2 {
			t.Fatalf("a broken config changed the fleet: %+v", s.Fleet.Router().Replicas())
		}
	}
	if !strings.Contains(logs.String(), "the running config stays") {
		t.Errorf("no error logged for the broken file: %s", logs.String())
	}

	// b leaves, c joins, a stays; the listen address cannot change live.
	writeConfig(t, path, "policy: round-robin\nlisten: 127.0.0.1:1\n", map[string]*replica{"a": a, "c": c})
	eventually(t, "the changed file to be applied (by polling its time)", func() bool { return s.Fleet.Router().Has("c") })
	eventually(t, "traffic to the added replica", func() bool { return c.Served() > 0 })
	bound := b.Served() + int64(stateOr(s, "b").InFlight)
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
	if b.Served() > bound {
		t.Errorf("the removed replica took %d new requests", b.Served()-bound)
	}
	eventually(t, "b to leave", func() bool { return !s.Fleet.Router().Has("b") })
	if !strings.Contains(logs.String(), "needs_restart") || !strings.Contains(logs.String(), "listen (running") {
		t.Errorf("the log does not say the listen address needs a restart: %s", logs.String())
	}
	if s.Config().Proxy.Listen == "127.0.0.1:1" {
		t.Error("the running listen address changed")
	}
}

// A reload cannot open the admin API: the listener address needs a restart
// and keeps running where it is, so a file that drops the tokens (while the
// running listener is not on loopback) is refused.
func TestReloadKeepsTheAdminLocked(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(tokens, []byte("alice s3cret-s3cret-s3cret\n"), 0o600)
	r := startReplica(t, 2*time.Millisecond, emulator.Faults{})
	s := startRouter(t, Config{Admin: admin.Config{Listen: "0.0.0.0:9091", TokenFile: tokens}}, Options{}, r)
	replicas := s.Config().Replicas
	for _, next := range []admin.Config{{Listen: "127.0.0.1:9091"}, {}, {Listen: admin.Off}} {
		next := Config{Admin: next}
		next.Replicas = replicas
		if err := s.Apply(next); err == nil {
			t.Errorf("admin %+v: a reload that drops the tokens of a public listener was applied", next)
		}
		if code, _ := do(t, "DELETE", s.admin+"/admin/replicas/a", ""); code != 401 {
			t.Fatalf("admin %+v: unauthenticated DELETE answered %d", next, code)
		}
	}
}

// config_poll turned off by a reload (negative: never) stops the polling
// (found in review: the loop spun), and a reload that sets it again (a
// SIGHUP) starts it at once, at the new interval.
func TestPollingTurnedOffAndOn(t *testing.T) {
	a, b, c := startReplica(t, 2*time.Millisecond, emulator.Faults{}), startReplica(t, 2*time.Millisecond, emulator.Faults{}),
		startReplica(t, 2*time.Millisecond, emulator.Faults{})
	path := filepath.Join(t.TempDir(), "serve.yaml")
	writeConfig(t, path, "", map[string]*replica{"a": a})
	s, _ := startFromFile(t, path)
	writePolledConfig(t, path, "-1s", "", map[string]*replica{"a": a}) // polled: turns it off
	eventually(t, "config_poll off", func() bool { return s.Config().ConfigPoll < 0 })
	writePolledConfig(t, path, "20ms", "", map[string]*replica{"a": a, "b": b})
	time.Sleep(300 * time.Millisecond) // fifteen of the old intervals
	if s.Fleet.Router().Has("b") {
		t.Fatal("the file was read again with polling off")
	}
	if err := s.Reload(); err != nil { // SIGHUP
		t.Fatal(err)
	}
	if !s.Fleet.Router().Has("b") || s.Config().ConfigPoll != 20*time.Millisecond {
		t.Fatalf("the reload did not apply the file: b %v, config_poll %v", s.Fleet.Router().Has("b"), s.Config().ConfigPoll)
	}
	writeConfig(t, path, "", map[string]*replica{"a": a, "b": b, "c": c})
	eventually(t, "c to join through the poll", func() bool { return s.Fleet.Router().Has("c") })
}

// A front end built outside the Server (gorgo epp's picker) hears each
// config applied, with its running values (2026-12-06: the picker read
// engine_operations and tenant_header at start only).
func TestOnApplyHearsEachConfig(t *testing.T) {
	r := startReplica(t, 2*time.Millisecond, emulator.Faults{})
	s := startRouter(t, Config{}, Options{}, r)
	var heard []string
	s.OnApply(func(c Config) { heard = append(heard, c.Proxy.EngineOperations) })
	next := s.Config()
	next.Proxy.EngineOperations = "refuse"
	if err := s.Apply(next); err != nil {
		t.Fatal(err)
	}
	next.Proxy.EngineOperations = "allow"
	if err := s.Apply(next); err != nil {
		t.Fatal(err)
	}
	if strings.Join(heard, " ") != "allow refuse allow" {
		t.Errorf("heard %q, want the running config, then each config applied", heard)
	}
}

// A reload whose restart-only parts would not start (a tracing sampling
// ratio of 2, which the running router keeps as it is) is refused, as the
// start would refuse the file (2026-12-06: the admin's, the front end's
// and tracing's restart-only settings were put back before any check).
func TestReloadRefusesWhatAStartWould(t *testing.T) {
	r := startReplica(t, 2*time.Millisecond, emulator.Faults{})
	s := startRouter(t, Config{}, Options{}, r)
	next := s.Config()
	ratio := 2.0
	next.Tracing.Endpoint, next.Tracing.SamplingRatio = "http://127.0.0.1:4318", &ratio
	if _, err := New(next, Options{}); err == nil {
		t.Fatal("New accepts the file")
	}
	if err := s.Apply(next); err == nil || !strings.Contains(err.Error(), "sampling_ratio") {
		t.Errorf("a reload the start would refuse: %v", err)
	}
}
