package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/gorgo-llm/gorgo/internal/enginemetrics"
	"github.com/gorgo-llm/gorgo/internal/lifecycle"
	"github.com/gorgo-llm/gorgo/internal/models"
)

// A replica can hang with its health checks passing: vLLM's /health asks
// only whether its engine process lives, and an engine stuck on its GPU,
// or a server whose handlers hang, answers it. Such a replica looks idle
// to decisions (its requests never end; an unstreamed one leaves the
// backlog at its forecast first token) and swallows requests until
// first_byte_timeout, 5 min; a client that gives up first charges it
// nothing. (2026-12-06, a user's test: 23% of requests lost at 8 per
// second over 40 s.)
//
// checkStall, at each successful probe, ejects a replica that has
// stopped serving: an attempt has waited stall_timeout past twice its
// forecast first token (Predict's, with its margin: a long prompt's
// prefill, a deep queue) for its answer to begin (a stream's first event,
// a whole answer); the replica made no progress meanwhile (no answer of
// it began, no byte of a successful answer of it was read, no router of
// the mesh heard of a first token or a finished answer there; a
// /tokenize answered is none: a paused or hung engine's server answers
// it); and its
// engine's gauges, where a recent scrape shows them, did not move in that
// time either. An engine at work moves them with its steps (vLLM's with
// every one: its KV cache's use, its token counters; SGLang's when its
// scheduler logs, every 40 decode steps and every prefill: its tokens in
// use; its token counters move only when a request ends), so gauges that
// stand still while requests wait are an engine that does nothing. An
// unstreamed request's answer comes whole at its end, so one waiting long
// is a long answer as likely as a hang: it counts only where the gauges
// stood still. A replica without engine metrics is thus judged by its
// streams alone.
//
// An engine paused through the router (SGLang's /pause_generation, vLLM's
// /pause, until /continue_generation or /resume, here or through another
// router of the mesh; or until an answer of it begins, a second or more
// after: resumed behind the routers' backs), asleep, or under a trainer's
// operation (new weights' load, sleep), holds its requests as asked: no
// stall. One paused at the engine itself, behind the routers' backs, for
// longer than stall_timeout past the forecast with requests waiting, is
// taken for one. Both front ends register their attempts (Watch): the
// proxy's are cut on an ejection; gorgo epp's gateway holds its own, which
// an ejection cannot reach, but the replica is picked no more.
//
// The ejection is the outlier ejection's (capped by max_ejection_percent,
// its time growing with each): its waiting attempts are cut and tried
// elsewhere, as nothing has reached their clients. A replica is not
// ejected for a stall while no other available replica serves the models
// its waiting attempts ask for: a cut request would have nowhere to go,
// and new ones would be refused where the replica might yet serve them.

// waiter is an attempt waiting for its answer to begin: its wait counts
// towards a stall from due (twice its forecast first token); unstreamed,
// its answer comes whole, at its end; model is the model it asks for,
// which another replica must serve for its replica to be ejected.
type waiter struct {
	due        time.Time
	unstreamed bool
	model      string
}

// progress is what the fleet knows of a replica's engine; Upstream.mu
// guards it.
type progress struct {
	// The engine's gauges as last scraped (gauges, at scraped), and when
	// they last moved (or were first seen).
	gauges         gauges
	scraped, moved time.Time
	known          bool
	// A trainer's operation on the engine under way, and a pause made
	// through the router (since heldAt, until its continue or resume):
	// the engine holds its requests, as it was asked to.
	operations int
	held       bool
	heldAt     time.Time
}

// gauges are the figures of an engine's /metrics that move as it works.
type gauges struct {
	running, waiting, kvUsed                      int
	kvUsage, hitRate, queries, prompt, gen, genTP float64
}

func gaugesOf(em *enginemetrics.Metrics) gauges {
	return gauges{em.Running, em.Waiting, em.KVUsedTokens, em.KVUsage, em.CacheHitRate, em.PrefixQueriesTotal,
		em.PromptTokensTotal, em.GenerationTokensTotal, em.GenThroughput}
}

// Watch registers an attempt of r waiting for its answer to begin, to be
// cut (with ErrEjected as its cause) if u is ejected meanwhile, or judged
// a stall (checkStall). The returned function unregisters it, saying
// whether the replica answered: a successful answer of its engine began
// (not a /tokenize, which a paused or hung engine's server answers):
// progress. The front ends, gorgo serve's and the endpoint picker's,
// call it as each attempt is sent.
func (u *Upstream) Watch(cancel *context.CancelCauseFunc, r *lifecycle.Request) (done func(answered bool)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.health.waiting == nil {
		u.health.waiting = map[*context.CancelCauseFunc]waiter{}
	}
	u.health.waiting[cancel] = waiter{due: time.Now().Add(2 * r.Forecast()), unstreamed: !r.Stream(), model: r.Model()}
	return func(answered bool) {
		now := time.Now()
		u.mu.Lock()
		delete(u.health.waiting, cancel)
		if p := &u.health.progress; answered && p.held && now.Sub(p.heldAt) > time.Second {
			p.held = false // resumed behind the routers' backs
		}
		u.mu.Unlock()
		if answered {
			u.Progressed(now)
		}
	}
}

// Progressed records that the replica made progress at at: bytes of a
// successful answer of it were read, or another router of the mesh heard
// of a first token or a finished answer there.
func (u *Upstream) Progressed(at time.Time) {
	if ns := at.UnixNano(); ns > u.progressed.Load() {
		u.progressed.Store(ns) // a race may keep the earlier of two: a nanosecond's matter
	}
}

// operating marks a trainer's operation on u's engine under way until the
// returned function is called; its end is progress.
func (u *Upstream) operating() (end func()) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.health.operations++
	return func() {
		u.mu.Lock()
		u.health.operations--
		u.mu.Unlock()
		u.Progressed(time.Now())
	}
}

// setHeld records that replica id's engine was paused (or let go on)
// through the router.
func (f *Fleet) setHeld(id string, held bool) {
	if u := f.Upstream(id); u != nil {
		u.mu.Lock()
		u.health.held, u.health.heldAt = held, time.Now()
		u.mu.Unlock()
		u.Progressed(time.Now())
	}
}

// scraped records the engine's gauges read at now; a restart ends a
// pause (the engine forgot it).
func (u *Upstream) scraped(em *enginemetrics.Metrics, now time.Time, restarted bool) {
	g := gaugesOf(em)
	u.mu.Lock()
	defer u.mu.Unlock()
	p := &u.health.progress
	if !p.known || g != p.gauges {
		p.moved = now
	}
	p.gauges, p.scraped, p.known = g, now, true
	if restarted {
		p.held = false
	}
}

// checkStall ejects u if it has stopped serving (see above).
func (f *Fleet) checkStall(u *Upstream) {
	cfg := f.cfg.Load()
	limit := cfg.StallTimeout
	if limit <= 0 {
		return
	}
	now := time.Now()
	if now.Sub(time.Unix(0, u.progressed.Load())) < limit {
		return // it made progress lately
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	h := &u.health
	if now.Before(h.until) || h.operations > 0 || h.held {
		return // ejected already, or held as asked
	}
	// The gauges tell only if read lately (and a first reading is taken
	// for a move).
	p := &h.progress
	fresh := p.known && now.Sub(p.scraped) < limit
	if fresh && now.Sub(p.moved) < limit {
		return // the engine works
	}
	still := fresh // and they did not move: the engine stood still
	var oldest time.Time
	for _, w := range h.waiting {
		if (!w.unstreamed || still) && (oldest.IsZero() || w.due.Before(oldest)) {
			oldest = w.due
		}
	}
	if oldest.IsZero() || now.Sub(oldest) < limit {
		return
	}
	if st, err := f.rt.Replica(u.cfg.ID); err != nil || st.Asleep || !f.elsewhere(u.cfg.ID, h.waiting) {
		return
	}
	why := fmt.Sprintf("stalled: a request waited %v past twice its forecast first token for its answer to begin, and nothing else progressed", now.Sub(oldest).Round(time.Second))
	if still {
		why += "; its engine's gauges stood still"
	}
	f.eject(u, cfg, why, true)
}

// servesModel reports whether a replica serving set serves model (nil:
// unknown, taken to serve any, as decisions take it).
func servesModel(set *models.Set, model string) bool {
	if model == "" || set == nil {
		return true
	}
	_, ok := set.Lookup(model)
	return ok
}

// elsewhere reports whether every model the waiting attempts ask for is
// served by an available replica other than id.
func (f *Fleet) elsewhere(id string, waiting map[*context.CancelCauseFunc]waiter) bool {
	others := f.rt.Replicas()
	serves := func(model string) bool {
		for _, st := range others {
			if st.ID != id && st.Available() && servesModel(st.Models, model) {
				return true
			}
		}
		return false
	}
	for _, w := range waiting {
		if !serves(w.model) {
			return false
		}
	}
	return true
}
