package serve

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// A router whose config names a tuner_state keeps what its online tuner
// learned there, and a restart resumes it; a restart whose config's
// weights changed starts from them instead, and says so; a file that
// cannot be read is replaced, the router started.
func TestTunerStateSurvivesARestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tuner.json")
	router := func(weights policy.Values) (*Server, *tune.Online, *bytes.Buffer) {
		t.Helper()
		return tunedRouter(t, path, weights)
	}
	// stop runs the router until it is stopped, as gorgo serve's run ends.
	stop := func(s *Server) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		cancel()
		if err := <-done; err != nil && err != context.Canceled {
			t.Fatal(err)
		}
	}

	first, o1, log := router(nil)
	if !strings.Contains(log.String(), "no tuner state kept yet") {
		t.Errorf("a first start's log: %s", log)
	}
	// What it learned: an incumbent away from the start.
	learned := o1.State()
	for _, k := range []string{"decode", "itl"} { // the default policy's tuned weights
		learned.Incumbent[k] *= 1.5
	}
	if err := o1.Restore(learned); err != nil {
		t.Fatal(err)
	}
	stop(first)
	// What it learns from the requests drained after Run returned is
	// written at Shutdown (a review: it was lost).
	learned = o1.State()
	for _, k := range []string{"decode", "itl"} {
		learned.Incumbent[k] *= 1.1
	}
	if err := o1.Restore(learned); err != nil {
		t.Fatal(err)
	}
	if err := first.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, err := readTunerState(path)
	if want := first.tuner.state(); err != nil || !got.Equal(want) || !slices.Equal(got.Fleet, []string{"a"}) {
		t.Fatalf("the state written: %+v (%v), want %+v, with the fleet's replica", got, err, want)
	}

	second, o2, log := router(nil)
	if !maps.Equal(o2.Incumbent(), o1.Incumbent()) || !strings.Contains(log.String(), "resumes") {
		t.Errorf("after a restart the tuner routes with %v, want %v; log: %s", o2.Incumbent(), o1.Incumbent(), log)
	}
	// The admin API shows where the state is kept and how the start went.
	if got := adminTuner(t, second); !strings.Contains(got, `"state_file": {`) || !strings.Contains(got, `"start": "resumed"`) || !strings.Contains(got, path) {
		t.Errorf("/admin/tuner after a resumed start: %s", got)
	}
	// A reload cannot move the file: the tuner keeps writing where it
	// read (a restart moves it).
	next := second.Config()
	next.TunerState = filepath.Join(filepath.Dir(path), "elsewhere.json")
	if err := second.Apply(next); err != nil || second.Config().TunerState != path || !strings.Contains(log.String(), "needs_restart=tuner_state") {
		t.Errorf("a reload moving tuner_state: %v, now %q; log: %s", err, second.Config().TunerState, log)
	}
	stop(second)

	// The config's weights changed, a tuned one's or another's: they win,
	// and the file is kept until the tuner learns anything (a user's test:
	// one start with a wrong flag wiped what was learned).
	for _, key := range []string{"decode", "rtt"} {
		changed := policy.Values{key: learned.Start[key] * 2}
		third, o3, log := router(changed)
		if o3.Incumbent()[key] != changed[key] || !strings.Contains(log.String(), "not resumed") {
			t.Errorf("with the config's %s changed to %v the tuner routes with %v; log: %s", key, changed[key], o3.Incumbent(), log)
		}
		if got := adminTuner(t, third); !strings.Contains(got, `"start": "not resumed: `) {
			t.Errorf("/admin/tuner after a start that did not resume: %s", got)
		}
		stop(third)
		if err := third.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got, err := readTunerState(path); err != nil || got.Start[key] == changed[key] || !got.Moved() {
			t.Errorf("with %s changed and nothing learned, the file holds %+v (%v), want the learned state kept", key, got, err)
		}
		again, o4, _ := router(changed)
		st := o4.State()
		st.Incumbent["itl"] *= 1.2 // it learns
		if err := o4.Restore(st); err != nil {
			t.Fatal(err)
		}
		stop(again)
		if err := again.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got, err := readTunerState(path); err != nil || got.Start[key] != changed[key] {
			t.Errorf("with %s changed and something learned, the file holds %+v (%v), want the new start's", key, got, err)
		}
	}
	// A file that cannot be read: the router starts, and replaces it.
	if err := os.WriteFile(path, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	fourth, _, log := router(nil)
	if !strings.Contains(log.String(), "cannot be read") {
		t.Errorf("a broken state's log: %s", log)
	}
	stop(fourth)
	if _, err := readTunerState(path); err != nil {
		t.Errorf("the broken state was not replaced: %v", err)
	}
}

// tuner_state without an online tuner, or where its file cannot be
// written, is refused at start, not found out at the first save.
func TestTunerStateRefused(t *testing.T) {
	reps := []fleet.ReplicaConfig{{ID: "a", URL: "http://127.0.0.1:1", Region: "ra"}}
	untuned := Config{TunerState: filepath.Join(t.TempDir(), "tuner.json"), Config: fleet.Config{Replicas: reps}}
	if _, err := New(untuned, Options{}); err == nil || !strings.Contains(err.Error(), "not tuned online") {
		t.Errorf("tuner_state with no tuner: %v", err)
	}
	off := false
	untuned.Tune = &off
	if _, err := New(untuned, Options{}); err == nil || !strings.Contains(err.Error(), "runs untuned") {
		t.Errorf("tuner_state with tune: false: %v", err)
	}
	o, err := tune.NewOnline(tune.OnlineConfig{Base: policy.DefaultName})
	if err != nil {
		t.Fatal(err)
	}
	nowhere := Config{TunerState: filepath.Join(t.TempDir(), "missing", "tuner.json"), Config: fleet.Config{Replicas: reps}}
	if _, err := New(nowhere, Options{Policy: o}); err == nil || !strings.Contains(err.Error(), "cannot write") {
		t.Errorf("tuner_state in a directory that does not exist: %v", err)
	}
	// A directory (a user's test: the router started, and failed every
	// write).
	dir := Config{TunerState: t.TempDir(), Config: fleet.Config{Replicas: reps}}
	if _, err := New(dir, Options{Policy: o}); err == nil || !strings.Contains(err.Error(), "is not a file") {
		t.Errorf("tuner_state a directory: %v", err)
	}
}

// A write that fails is logged once, until one succeeds again (a user's
// test: each write's temporary name made each failure a new message).
func TestTunerStateWriteFailureLoggedOnce(t *testing.T) {
	o, err := tune.NewOnline(tune.OnlineConfig{Base: policy.DefaultName})
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	dir := filepath.Join(t.TempDir(), "gone")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	st, err := resumeTuner(o, filepath.Join(dir, "tuner.json"), func() []string { return nil }, reg, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if f := st.File(); f.Start != "none kept yet" || !f.Written.IsZero() || f.Error != "" {
		t.Errorf("a first start's file: %+v", f)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		s := o.State()
		s.Incumbent["itl"] *= 1.1 + float64(i)/10 // something new to write each time
		if err := o.Restore(s); err != nil {
			t.Fatal(err)
		}
		st.save()
	}
	if n := strings.Count(log.String(), "cannot be written"); n != 1 {
		t.Errorf("3 failed writes logged %d times: %s", n, log.String())
	}
	// The admin API and the metrics show what the log said once.
	if f := st.File(); !strings.Contains(f.Error, "no such file") || !f.Written.IsZero() {
		t.Errorf("after failed writes the file shows %+v", f)
	}
	if got := testutil.ToFloat64(st.writes.WithLabelValues("failed")); got != 3 {
		t.Errorf("gorgo_tuner_state_writes_total{result=failed} %v, want 3", got)
	}
	if err := os.Mkdir(filepath.Dir(st.path), 0o755); err != nil {
		t.Fatal(err)
	}
	st.save()
	if !strings.Contains(log.String(), "written again") {
		t.Errorf("a write that succeeded again is not logged: %s", log.String())
	}
	if f := st.File(); f.Error != "" || f.Written.IsZero() {
		t.Errorf("after a write succeeded the file shows %+v", f)
	}
	if got := testutil.ToFloat64(st.writes.WithLabelValues("written")); got != 1 {
		t.Errorf("gorgo_tuner_state_writes_total{result=written} %v, want 1", got)
	}
	// The file removed while the router runs, nothing learned since, is
	// written again; and a failed write is tried again though the state is
	// the one last written (a user's test: neither was, and the error
	// stayed shown after the directory came back).
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	st.save()
	if f := st.File(); f.Error == "" || !strings.Contains(f.Error, st.path) {
		t.Errorf("the directory gone: the file shows %+v, want an error naming %s", f, st.path)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	st.save()
	if _, err := readTunerState(st.path); err != nil || st.File().Error != "" {
		t.Errorf("the directory back, the same state: %v, the file shows %+v", err, st.File())
	}
	if err := os.Remove(st.path); err != nil {
		t.Fatal(err)
	}
	st.save()
	if _, err := readTunerState(st.path); err != nil {
		t.Errorf("the file removed, the same state: not written again (%v)", err)
	}
}

// The fleet a state names is the replicas it was learned with: a resumed
// state's replicas not come up yet stay named (a review: rewritten with
// the replicas of the moment, a second restart before the late one came
// up threw the state away); and a file kept, its state not resumed, is
// kept while the fleet changes but nothing is learned (a review: the
// fleet's first DNS answer overwrote it).
func TestTunerStateFleet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tuner.json")
	newTuner := func(weights policy.Values) *tune.Online {
		o, err := tune.NewOnline(tune.OnlineConfig{Base: policy.DefaultName, BaseParams: weights, StartFromBase: weights != nil, ES: tune.Config{Seed: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	learned := newTuner(nil).State()
	learned.Incumbent["itl"] *= 1.5
	learned.Fleet = []string{"a", "b"}
	if err := writeTunerState(path, learned); err != nil {
		t.Fatal(err)
	}
	replicas := []string{"a"} // b not up yet
	log := slog.New(slog.DiscardHandler)
	ts, err := resumeTuner(newTuner(nil), path, func() []string { return replicas }, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	ts.save()
	if got, err := readTunerState(path); err != nil || !slices.Equal(got.Fleet, []string{"a", "b"}) {
		t.Errorf("resumed with b not up: the file's fleet %v (%v), want [a b]", got.Fleet, err)
	}

	// Not resumed (other weights): kept while only the fleet changes.
	ts, err = resumeTuner(newTuner(policy.Values{"decode": 0.4}), path, func() []string { return replicas }, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	replicas = []string{"a", "b", "c"}
	ts.save()
	if got, err := readTunerState(path); err != nil || got.Incumbent["itl"] != learned.Incumbent["itl"] {
		t.Errorf("a kept file after the fleet changed holds %+v (%v), want the learned state", got, err)
	}
}

// adminTuner returns the router's GET /admin/tuner answer.
func adminTuner(t *testing.T, s *Server) string {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Admin.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1:9091/admin/tuner", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/admin/tuner: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// A tuner an operator paused through the admin API stays paused after a
// restart, and the log says how to resume it.
func TestTunerStatePaused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tuner.json")
	var weights policy.Values // the config's
	start := func() (*Server, *tune.Online, *bytes.Buffer) {
		t.Helper()
		return tunedRouter(t, path, weights)
	}
	first, o, _ := start()
	o.Pause()
	if err := first.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, o, log := start()
	if !o.Paused() || !strings.Contains(log.String(), "stays paused") || !strings.Contains(log.String(), "/admin/tuner/resume") {
		t.Errorf("restarted after a pause: paused %v; log: %s", o.Paused(), log)
	}
	// Restarted with other weights: the operator's new weights win, and
	// the log says the state it does not resume was paused (a review: the
	// pause went unsaid).
	weights = policy.Values{"decode": 0.4}
	second, o, log := start()
	if o.Paused() || !strings.Contains(log.String(), "not resumed, and it was paused") {
		t.Errorf("restarted paused with other weights: paused %v; log: %s", o.Paused(), log)
	}
	// Paused while that file is kept: the pause is written (a review: it
	// was not, the file being kept until the tuner learned anything), and
	// the next start with the same weights stays paused.
	o.Pause()
	if err := second.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, o, _ = start(); !o.Paused() {
		t.Error("paused while a state not resumed was kept: the restart tunes")
	}
}

// tunedRouter starts a router keeping its tuner's state in path, with the
// default policy tuned from weights (nil: its defaults), as gorgo serve
// builds it, and returns it, its tuner and its log.
func tunedRouter(t *testing.T, path string, weights policy.Values) (*Server, *tune.Online, *bytes.Buffer) {
	t.Helper()
	o, err := tune.NewOnline(tune.OnlineConfig{Base: policy.DefaultName, BaseParams: weights, StartFromBase: weights != nil, ES: tune.Config{Seed: 1}})
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cfg := Config{TunerState: path, Config: fleet.Config{ProbeInterval: time.Hour, ScrapeInterval: time.Hour,
		Replicas: []fleet.ReplicaConfig{{ID: "a", URL: "http://127.0.0.1:1", Region: "ra"}}}}
	s, err := New(cfg, Options{Policy: o, Log: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return s, o, &log
}
