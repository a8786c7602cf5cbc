package fleet

import (
	"context"
	"errors"
	"time"

	"github.com/gorgo-llm/gorgo/internal/router"
)

// Outlier ejection, as Envoy does it: a replica whose requests fail
// failure_threshold times in a row, or half or more of its last
// failureWindow requests (at least that many seen), or whose probes fail
// failure_threshold times in a row, is ejected for
// ejection_time × the number of times it was ejected (capped at
// max_ejection_time). Probes do not bring it back before that time is up;
// after it, the next successful probe does. A replica that stays up for
// max_ejection_time has its count of ejections reset.
//
// As Envoy's max_ejection_percent, the ejections caused by requests stop
// while max_ejection_percent of the fleet's replicas (at least one) are
// ejected, whatever ejected them: a wave of failures that is no replica's
// fault (a poison request retried across the fleet, an overload that times
// every replica out) cannot take the whole fleet out. A replica whose
// probes fail is down, and is ejected whatever the share.
//
// Attempts waiting for a replica's first byte are cut when it is ejected
// (Upstream.Watch) and tried elsewhere at once: nothing has reached their
// clients yet.

// failureWindow is how many recent outcomes the failure rate is taken over.
const failureWindow = 20

// ErrEjected is the cause of an attempt cut because its replica was
// ejected.
var ErrEjected = errors.New("the replica was marked down")

// health is a replica's outlier state; Upstream.mu guards it.
type health struct {
	failures  int                 // requests, in a row
	probeFail int                 // probes, in a row
	recent    [failureWindow]bool // ring of outcomes, true = failed
	seen, at  int                 // outcomes in the ring, next slot
	ejections int
	until     time.Time // ejected until
	upSince   time.Time // back up since (zero while down)
	// waiting are the attempts waiting for their answer to begin, and
	// what checkStall knows of the replica's engine (stall.go).
	waiting map[*context.CancelCauseFunc]waiter
	progress
}

func (h *health) record(failed bool) {
	h.recent[h.at] = failed
	h.at = (h.at + 1) % failureWindow
	h.seen = min(h.seen+1, failureWindow)
	if failed {
		h.failures++
	} else {
		h.failures = 0
	}
}

func (h *health) failureRate() float64 {
	if h.seen < failureWindow {
		return 0
	}
	n := 0
	for _, f := range h.recent {
		if f {
			n++
		}
	}
	return float64(n) / failureWindow
}

// Failure records a request that failed through replica id's fault, and
// ejects the replica when it is an outlier (lifecycle.Health).
func (f *Fleet) Failure(id string) { f.outcome(id, true, false) }

// Success records a request the replica served (lifecycle.Health).
func (f *Fleet) Success(id string) { f.outcome(id, false, false) }

// probeFailed records a failed probe; not of a replica a client put to
// sleep (a sleeping engine may fail its health check: it is not broken).
func (f *Fleet) probeFailed(id string) {
	if st, err := f.rt.Replica(id); err == nil && st.Asleep {
		return
	}
	f.outcome(id, true, true)
}

func (f *Fleet) outcome(id string, failed, probe bool) {
	u := f.Upstream(id)
	if u == nil {
		return
	}
	cfg := f.cfg.Load()
	u.mu.Lock()
	defer u.mu.Unlock()
	h := &u.health
	if probe {
		h.probeFail++
	} else {
		h.record(failed)
	}
	if !failed || time.Now().Before(h.until) {
		return // already ejected
	}
	why := ""
	switch {
	case h.probeFail >= cfg.FailureThreshold:
		why = "probes failing in a row"
	case h.failures >= cfg.FailureThreshold:
		why = "requests failing in a row"
	case h.failureRate() >= 0.5:
		why = "failure rate"
	default:
		return
	}
	f.eject(u, cfg, why, h.probeFail < cfg.FailureThreshold)
}

// eject marks u down for its ejection time and cuts the attempts waiting
// for its first byte; capped, not while max_ejection_percent of the fleet
// is ejected. Call with u.mu held.
func (f *Fleet) eject(u *Upstream, cfg *Config, why string, capped bool) {
	id, h := u.cfg.ID, &u.health
	// The share is judged and the ejection made under ejectMu, so that
	// failures on several replicas at once cannot all pass the cap.
	f.ejectMu.Lock()
	defer f.ejectMu.Unlock()
	now := time.Now()
	if capped {
		if n, ejected := f.ejectedShare(); ejected >= maxEjected(n, cfg.MaxEjectionPercent) {
			u.capLog.Do(func() {
				f.log.Warn("replica not ejected: max_ejection_percent of the fleet is ejected already", "replica", id, "why", why,
					"ejected", ejected, "replicas", n, "max_ejection_percent", cfg.MaxEjectionPercent)
			})
			return
		}
	}
	if !h.upSince.IsZero() && now.Sub(h.upSince) >= cfg.MaxEjectionTime {
		h.ejections = 0 // up long enough: a fresh start
	}
	h.ejections++
	d := min(time.Duration(h.ejections)*cfg.EjectionTime, cfg.MaxEjectionTime)
	h.until, h.upSince = now.Add(d), time.Time{}
	u.out.Store(true)
	h.seen, h.at = 0, 0
	// Under u.mu, so that a racing probe's success cannot undo it.
	f.rt.SetHealthy(id, false)
	f.m.healthy.WithLabelValues(id).Set(0)
	f.m.ejections.WithLabelValues(id).Inc()
	for cancel := range h.waiting {
		(*cancel)(ErrEjected)
	}
	f.log.Warn("replica ejected", "replica", id, "why", why, "for", d, "ejections", h.ejections)
}

// ejectedShare counts the fleet's replicas that take requests (not
// draining or leaving: a rolling update's old replicas must not widen the
// share) and those of them out: ejected, or not yet brought back by a
// probe since. Call with ejectMu held.
func (f *Fleet) ejectedShare() (replicas, ejected int) {
	for id, u := range f.upstreams() {
		if st, err := f.rt.Replica(id); err != nil || st.State != router.Active || st.Asleep {
			continue // asleep, it serves nothing, failing or not
		}
		replicas++
		if u.out.Load() {
			ejected++
		}
	}
	return replicas, ejected
}

// maxEjected is how many of n replicas requests may have ejected at once:
// percent of them, rounded down, at least one.
func maxEjected(n, percent int) int {
	return max(1, n*percent/100)
}

// probed records a successful probe: it brings the replica back unless it
// is still ejected.
func (f *Fleet) probed(u *Upstream) {
	u.mu.Lock()
	defer u.mu.Unlock()
	h := &u.health
	h.probeFail = 0
	now := time.Now()
	if now.Before(h.until) {
		return
	}
	if h.upSince.IsZero() {
		h.upSince = now
		if !h.until.IsZero() { // back from an ejection: a fresh start
			h.failures = 0
			f.log.Info("replica back", "replica", u.cfg.ID, "ejections", h.ejections)
		}
	}
	u.out.Store(false)
	f.rt.SetHealthy(u.cfg.ID, true)
	f.m.healthy.WithLabelValues(u.cfg.ID).Set(1)
}
