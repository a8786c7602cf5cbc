package fleet

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// Membership. Replicas come from sources: the config file (SourceConfig),
// the admin API (SourceAdmin), each DNS group (SourceDNS+name), and any
// other Source. A source says which replicas it wants, all of them at
// once, whenever that changes (Want); the replicas it brought are its own,
// and one reconciler makes every source's wish true:
//   - a replica wanted and not in the fleet is added (probed at once, and
//     routed to once a probe reached it);
//   - one whose URL changed starts afresh under its id (its requests in
//     flight finish against the old record);
//   - one whose other settings changed keeps what was observed of it;
//   - one leaving (drained for removal) that is wanted again stays;
//   - one of the source's no longer wanted is drained, then removed once
//     its requests in flight are done;
//   - an id another source brought stays that source's (and is logged).

// Sources of replicas.
const (
	SourceConfig = "config"
	SourceAdmin  = "admin"
	SourceDNS    = "dns:" // + the group's name
)

// Changes are what a reconciliation did.
type Changes struct {
	Added, Removed, Changed []string
}

// Empty reports whether nothing changed.
func (c Changes) Empty() bool { return len(c.Added)+len(c.Removed)+len(c.Changed) == 0 }

// Want makes the fleet's replicas from source those of want. The error
// joins what could not be applied (a replica that fails to validate, an id
// another source took); the rest is applied.
func (f *Fleet) Want(source string, want []ReplicaConfig) (Changes, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.want(source, want)
}

func (f *Fleet) want(source string, want []ReplicaConfig) (Changes, error) {
	var ch Changes
	var errs []error
	desired := make(map[string]ReplicaConfig, len(want))
	var order []string // desired's ids in the order of want
	for _, rc := range want {
		rc = rc.Defaults()
		if err := rc.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("replica %s: %w", rc.ID, err))
			continue
		}
		if _, dup := desired[rc.ID]; !dup {
			order = append(order, rc.ID)
		}
		desired[rc.ID] = rc
	}
	for id, u := range f.upstreams() {
		if _, ok := desired[id]; ok || u.source != source || !f.rt.Has(id) {
			continue
		}
		if st, err := f.rt.Replica(id); err == nil && st.State == router.Removing {
			continue // already leaving
		}
		f.leave(id)
		ch.Removed = append(ch.Removed, id)
	}
	// New replicas join in the order the source gives them (a config
	// file's order), after those already in the fleet: the router holds its
	// replicas in the order they joined, and round-robin takes them in it.
	// A router started from a file holds them as the file lists them, as
	// the simulator holds a topology's, so the two split a workload alike;
	// a reload that reorders the file moves no replica already there.
	for _, id := range order {
		rc := desired[id]
		u := f.Upstream(id)
		st, err := f.rt.Replica(id)
		if err != nil || u == nil {
			if err := f.add(rc, source); err != nil {
				errs = append(errs, err)
				delete(desired, id)
				continue
			}
			ch.Added = append(ch.Added, id)
			continue
		}
		if u.source != source {
			errs = append(errs, fmt.Errorf("replica %s: the id is %s's", id, u.source))
			delete(desired, id)
			continue
		}
		touched := false
		if st.State == router.Removing {
			f.rt.Undrain(id) // wanted again while it was leaving: it stays
			touched = true
		}
		switch {
		case u.cfg.Equal(rc):
		case u.cfg.URL != rc.URL:
			err = f.replace(rc, source)
			touched = true
		default:
			err = f.reconfigure(u, rc)
			touched = true
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if touched {
			ch.Changed = append(ch.Changed, id)
		}
	}
	f.wishes[source] = desired
	slices.Sort(ch.Added)
	slices.Sort(ch.Removed)
	slices.Sort(ch.Changed)
	err := errors.Join(errs...)
	if err != nil {
		f.log.Error("replicas not applied", "source", source, "error", err)
	}
	return ch, err
}

// Add adds one replica to source's wish (the admin API's way in); it fails
// with router.ErrExists if the id is in the fleet, whoever brought it.
func (f *Fleet) Add(source string, rc ReplicaConfig) error {
	rc = rc.Defaults()
	if err := rc.Validate(); err != nil {
		return fmt.Errorf("replica %s: %w", rc.ID, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rt.Has(rc.ID) {
		return fmt.Errorf("replica %s: %w", rc.ID, router.ErrExists)
	}
	want := []ReplicaConfig{rc}
	for _, w := range f.wishes[source] {
		want = append(want, w)
	}
	_, err := f.want(source, want)
	return err
}

// Remove drains a replica and removes it once its requests in flight have
// finished, whichever source brought it; it leaves that source's wish too,
// until the source names it again (for the config file, any reload of a
// file that still lists it; for a DNS group, its next change).
func (f *Fleet) Remove(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.rt.Has(id) {
		return fmt.Errorf("replica %s: %w", id, router.ErrUnknown)
	}
	if u := f.Upstream(id); u != nil {
		delete(f.wishes[u.source], id)
	}
	return f.leave(id)
}

// add brings a replica into the fleet: it is probed at once (if the fleet
// runs) and routed to once a probe has reached it.
func (f *Fleet) add(rc ReplicaConfig, source string) error {
	u, err := newUpstream(rc, source)
	if err != nil {
		return err
	}
	if err := f.rt.Add(routerConfig(rc)); err != nil {
		return err
	}
	if old := f.Upstream(rc.ID); old != nil {
		old.stopLoops() // a replica of the same id that has left the router since
	}
	f.setUpstream(rc.ID, u)
	f.m.healthy.WithLabelValues(rc.ID).Set(0)
	f.startLoops(u, true)
	f.log.Info("replica added", "replica", rc.ID, "url", rc.URL, "region", rc.Region, "source", source)
	return nil
}

// replace swaps a replica for a new one of the same id (its URL changed):
// the old one's requests in flight finish where they are; the new one
// starts afresh.
func (f *Fleet) replace(rc ReplicaConfig, source string) error {
	if _, err := rc.apiKey(); err != nil { // before the old one goes
		return err
	}
	if u := f.Upstream(rc.ID); u != nil {
		u.stopLoops()
	}
	f.setUpstream(rc.ID, nil)
	if err := f.rt.Detach(rc.ID); err != nil && !errors.Is(err, router.ErrUnknown) {
		return err
	}
	return f.add(rc, source)
}

// reconfigure applies a replica's changed settings (not its URL), keeping
// what the router observed of it.
func (f *Fleet) reconfigure(old *Upstream, rc ReplicaConfig) error {
	u, err := newUpstream(rc, old.source)
	if err != nil {
		return err
	}
	if err := f.rt.Reconfigure(routerConfig(rc)); err != nil {
		return err
	}
	f.swap(old, u)
	return nil
}

// swap puts nu in old's place (the same replica, its config or its owner
// changed): old's loops stop, nu takes its health and starts its own.
func (f *Fleet) swap(old, nu *Upstream) {
	old.stopLoops()
	nu.health = old.takeHealth()
	nu.out.Store(nu.health.isOut())
	f.setUpstream(nu.cfg.ID, nu)
	f.startLoops(nu, true)
}

// leave drains a replica for removal: it leaves the router once its last
// request in flight finishes, and the fleet retires its upstream then.
func (f *Fleet) leave(id string) error {
	if err := f.rt.Remove(id); err != nil {
		if !errors.Is(err, router.ErrUnknown) {
			f.log.Error("replica not removed", "replica", id, "error", err)
		}
		return err
	}
	f.log.Info("replica removing", "replica", id)
	f.retireLocked(id)
	return nil
}

// retire drops the upstream of a replica the router has let go: its loops
// end and its series go.
func (f *Fleet) retire(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.retireLocked(id)
}

func (f *Fleet) retireLocked(id string) {
	u := f.Upstream(id)
	if u == nil || f.rt.Has(id) {
		return
	}
	u.stopLoops()
	f.setUpstream(id, nil)
	f.m.forget(id)
	f.core.Forget(id)
	f.log.Info("replica removed", "replica", id)
}

// setUpstream publishes the upstream map with id set to u (nil: without
// it). Call with f.mu held.
func (f *Fleet) setUpstream(id string, u *Upstream) {
	old := f.upstreams()
	next := make(map[string]*Upstream, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	if u == nil {
		delete(next, id)
	} else {
		next[id] = u
	}
	f.ups.Store(&next)
}

// takeHealth returns the upstream's outlier state, to carry over to its
// reconfigured successor (the attempts waiting on it stay its own).
func (u *Upstream) takeHealth() health {
	u.mu.Lock()
	defer u.mu.Unlock()
	h := u.health
	h.waiting = nil
	return h
}

func routerConfig(rc ReplicaConfig) router.ReplicaConfig {
	served, _ := rc.served() // validated
	return router.ReplicaConfig{ID: rc.ID, Region: rc.Region, KVCapacityTokens: rc.KVCapacityTokens,
		PrefillMSPerToken: rc.PrefillMSPerTok, QueueMSPerToken: rc.QueueMSPerTok, ITLBaseMS: rc.ITLMS, ITLSlopeMS: rc.ITLSlopeMS,
		Models: served, MaxLoRAs: rc.MaxLoRAs}
}

// fleetChangedLog writes each change of the fleet the router reports (a
// replica that joined the decisions or left them, a round trip that
// jumped and stayed) to the log, and what a tuner did about it: it starts
// its round afresh, and falls back to its starting weights if it had moved
// from them (2026-12-06, a user's test: a tuner's measurement was thrown
// away, or its weights put back, with no word in the log).
func fleetChangedLog(log *slog.Logger, pol policy.Policy) func(why string) {
	t, tuned := pol.(policy.Tuner)
	r, counts := pol.(interface{ Resets() (int, string) })
	var resets atomic.Int64
	return func(why string) {
		if !tuned {
			log.Info("fleet changed", "why", why)
			return
		}
		if counts {
			// The fallback's own reason: news of two changes at once may
			// reach the log in the other order than the tuner.
			if n, fell := r.Resets(); int64(n) > resets.Swap(int64(n)) {
				log.Warn("fleet changed: the tuner fell back to its starting weights and starts its round afresh", "why", fell, "weights", policy.Format(t.Base(), t.Incumbent()))
				return
			}
		}
		log.Info("fleet changed: the tuner starts its round afresh", "why", why, "weights", policy.Format(t.Base(), t.Incumbent()))
	}
}
