package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/admin"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// tunerSaveEvery is how often the tuner's state is written if it changed.
var tunerSaveEvery = 10 * time.Second

// maxTunerStateBytes bounds the state file read: a few hundred bytes are
// written.
const maxTunerStateBytes = 1 << 20

// tunerState keeps an online tuner's state in a file (tuner_state).
type tunerState struct {
	tuner    *tune.Online
	replicas func() []string // the fleet's, sorted (tune.State.Fleet)
	path     string
	log      *slog.Logger
	saved    tune.State // as last written or read
	// keeping: the file holds a state not resumed, kept until the tuner
	// learns anything (its start or incumbent differ from saved's).
	keeping bool
	failing bool // the last write failed (logged once, until one succeeds)
	writes  *prometheus.CounterVec

	mu   sync.Mutex
	file admin.TunerFile // what /admin/tuner shows; guarded by mu
}

// File reports the state file as /admin/tuner shows it.
func (t *tunerState) File() admin.TunerFile {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.file
}

// resumeTuner resumes the policy's tuner from the state in path, if there
// is one it may resume (tune.Online.Restore), and returns what keeps its
// state there from now, with the fleet's replicas (tune.State.Fleet). A
// state that cannot be read is logged and replaced: the router starts
// whatever the file holds. One that cannot be resumed is logged and left
// alone until the tuner learns anything (a start with a wrong flag must
// not wipe what was learned). A policy not tuned online has no state to
// keep, and a path that is no file cannot hold one: errors, as the config
// asks for it.
func resumeTuner(p policy.Policy, path string, replicas func() []string, reg prometheus.Registerer, log *slog.Logger) (*tunerState, error) {
	o, ok := p.(*tune.Online)
	if !ok {
		return nil, fmt.Errorf("config: tuner_state: policy %s is not tuned online (tune: false, or --tune=false): there is no state to keep", p.Name())
	}
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("config: tuner_state: %s is not a file", path)
	}
	if err := writableDir(path); err != nil {
		return nil, fmt.Errorf("config: tuner_state: %w", err)
	}
	t := &tunerState{tuner: o, replicas: replicas, path: path, log: log, file: admin.TunerFile{Path: path},
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_tuner_state_writes_total",
			Help: "Writes of the online tuner's state to its file (tuner_state), by result (written, failed: what it learns is not kept until one succeeds)."}, []string{"result"})}
	t.writes.WithLabelValues("written")
	t.writes.WithLabelValues("failed")
	if err := reg.Register(t.writes); err != nil {
		return nil, err
	}
	st, err := readTunerState(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		t.file.Start = "none kept yet"
		log.Info("no tuner state kept yet: the tuner starts afresh", "tuner_state", path, "weights", policy.Format(o.Base(), o.Incumbent()))
	case err != nil:
		t.file.Start = "unreadable: replaced"
		log.Warn("the tuner's state cannot be read: the tuner starts afresh, and the file will be replaced", "tuner_state", path, "error", err)
	default:
		if err := o.Restore(st); err != nil {
			t.saved, t.keeping = t.state(), true
			paused := ""
			if st.Paused {
				paused = ", and it was paused" // the new tuner tunes
			}
			t.file.Start = fmt.Sprintf("not resumed%s: %v (kept until the tuner learns anything)", paused, err)
			log.Warn("the tuner's state is not resumed"+paused+": the tuner starts afresh, and the file is kept until it learns anything",
				"tuner_state", path, "why", err, "weights", policy.Format(o.Base(), o.Incumbent()))
			break
		}
		t.saved, t.file.Start = st, "resumed"
		log.Info("the tuner resumes from its state", "tuner_state", path, "weights", policy.Format(o.Base(), o.Incumbent()), "moved", st.Moved(), "step", o.Sigma())
		if st.Paused {
			log.Warn("the tuner was paused through the admin API, and stays paused: the incumbent routes every request until POST /admin/tuner/resume", "tuner_state", path)
		}
	}
	return t, nil
}

// state is the tuner's state with the fleet's replicas added to those it
// knows (a resumed state's replicas not come up yet stay named: a review
// saw a second restart's late replica throw the state away).
func (t *tunerState) state() tune.State {
	st := t.tuner.State()
	st.Fleet = slices.Compact(slices.Sorted(slices.Values(append(st.Fleet, t.replicas()...))))
	return st
}

// writableDir reports whether a file can be made in path's directory.
func writableDir(path string) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".gorgo-check-*")
	if err != nil {
		return fmt.Errorf("cannot write beside %s: %w", path, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// readTunerState reads a state written by save.
func readTunerState(path string) (tune.State, error) {
	f, err := os.Open(path)
	if err != nil {
		return tune.State{}, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxTunerStateBytes+1))
	if err != nil {
		return tune.State{}, err
	}
	if len(data) > maxTunerStateBytes {
		return tune.State{}, fmt.Errorf("larger than %d bytes", maxTunerStateBytes)
	}
	var st tune.State
	if err := json.Unmarshal(data, &st); err != nil {
		return tune.State{}, err
	}
	return st, nil
}

// keep writes the tuner's state when it changed, every tunerSaveEvery,
// and once more when ctx ends (Server.Shutdown writes it last, once the
// front ends drained their requests).
func (t *tunerState) keep(ctx context.Context) {
	tick := time.NewTicker(tunerSaveEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			t.save()
			return
		case <-tick.C:
			t.save()
		}
	}
}

// save writes the tuner's state if it changed since last written, or the
// last write failed, or the file is gone: to a file beside the state's,
// then renamed over it, so that a crash leaves the old state or the new,
// never half of one. A failure is logged once, until a write succeeds
// again.
func (t *tunerState) save() {
	st := t.state()
	if t.keeping && maps.Equal(st.Start, t.saved.Start) && maps.Equal(st.Incumbent, t.saved.Incumbent) && !st.Paused {
		return // nothing learned yet (the fleet, a step size may have changed), and not paused (a review: that pause was lost)
	}
	t.keeping = false
	if st.Equal(t.saved) && !t.failing && exists(t.path) {
		return // written, and still there (a user's test: a file removed was never written again)
	}
	if err := writeTunerState(t.path, st); err != nil {
		err = fmt.Errorf("writing %s: %w", t.path, err) // not the temporary file's name alone
		t.writes.WithLabelValues("failed").Inc()
		t.mu.Lock()
		t.file.Error = err.Error()
		t.mu.Unlock()
		if !t.failing {
			t.failing = true
			t.log.Error("the tuner's state cannot be written: what it learns is not kept until a write succeeds", "tuner_state", t.path, "error", err)
		}
		return
	}
	if t.failing {
		t.log.Info("the tuner's state is written again", "tuner_state", t.path)
	}
	t.saved, t.failing = st, false
	t.writes.WithLabelValues("written").Inc()
	t.mu.Lock()
	t.file.Written, t.file.Error = time.Now(), ""
	t.mu.Unlock()
}

// exists reports whether path names a file.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func writeTunerState(path string, st tune.State) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(append(data, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	// The rename, too, on the disk (where the directory can be synced).
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
