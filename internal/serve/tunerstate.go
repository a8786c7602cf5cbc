package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

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
	tuner *tune.Online
	path  string
	log   *slog.Logger
	saved tune.State // as last written or read
	err   string     // the last write's error, logged once
}

// resumeTuner resumes the policy's tuner from the state in path, if there
// is one it may resume (tune.Online.Restore), and returns what keeps its
// state there from now. A state that cannot be read or resumed is logged
// and replaced: the router starts whatever the file holds. A policy not
// tuned online has no state to keep: an error, as the config asks for it.
func resumeTuner(p policy.Policy, path string, log *slog.Logger) (*tunerState, error) {
	o, ok := p.(*tune.Online)
	if !ok {
		return nil, fmt.Errorf("config: tuner_state: policy %s is not tuned online (tune: false, or --tune=false): there is no state to keep", p.Name())
	}
	if err := writableDir(path); err != nil {
		return nil, fmt.Errorf("config: tuner_state: %w", err)
	}
	t := &tunerState{tuner: o, path: path, log: log}
	st, err := readTunerState(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		log.Info("the tuner starts from the config's weights (no state kept yet)", "tuner_state", path)
	case err != nil:
		log.Warn("the tuner's state cannot be read: it starts from the config's weights, and the file will be replaced", "tuner_state", path, "error", err)
	default:
		if err := o.Restore(st); err != nil {
			log.Info("the tuner's state is not resumed: it starts from the config's weights", "tuner_state", path, "why", err)
			break
		}
		t.saved = st
		log.Info("the tuner resumes from its state", "tuner_state", path, "weights", policy.Format(o.Base(), o.Incumbent()), "moved", st.Moved())
	}
	return t, nil
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

// save writes the tuner's state if it changed since last written: to a
// file beside the state's, then renamed over it, so that a crash leaves
// the old state or the new, never half of one. A failure is logged once
// until it changes or a write succeeds.
func (t *tunerState) save() {
	st := t.tuner.State()
	if st.Equal(t.saved) {
		return
	}
	if err := writeTunerState(t.path, st); err != nil {
		if msg := err.Error(); msg != t.err {
			t.err = msg
			t.log.Error("the tuner's state cannot be written: a restart would start it from the config's weights", "tuner_state", t.path, "error", err)
		}
		return
	}
	t.saved, t.err = st, ""
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
