package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/gorgo-llm/gorgo/internal/enginemetrics"
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
// the mesh heard of a first token or a finished answer there); and its
// engine's token counters, where a recent scrape shows them, did not move
// in that time either. An unstreamed request's answer comes whole at its
// end, so one waiting long is a long answer as likely as a hang: it
// counts only where the engine counts generated tokens with every step
// (vLLM; its prompt tokens only when a prefill completes, which the
// forecast's grace covers) and they stood still. A replica that answers
// nothing to requests and whose counters do not say so otherwise is thus
// judged by its streams; SGLang's /health has its scheduler generate a
// token, so a hung SGLang fails its probes.
//
// An engine paused through the router (SGLang's /pause_generation, vLLM's
// /pause, until /continue_generation or /resume, here or through another
// router of the mesh: it is held as asleep is), asleep, or under a
// trainer's operation (new weights' load, sleep), holds its requests as
// asked: no stall. One paused at the engine itself, behind the routers'
// backs, for longer than stall_timeout with requests waiting, is taken
// for one. The front end that registers attempts (Watch) is the proxy's:
// gorgo epp's gateway holds its attempts, and has no stall check.
//
// The ejection is the outlier ejection's (capped by max_ejection_percent,
// its time growing with each): its waiting attempts are cut and tried
// elsewhere, as nothing has reached their clients.

// waiter is an attempt waiting for its answer to begin, counted from due.
type waiter struct {
	due        time.Time
	unstreamed bool
}

// progress is what the fleet knows of a replica's engine; Upstream.mu
// guards it.
type progress struct {
	// The engine's token counters as last scraped (tokens, at scraped),
	// when they last moved (or were first seen), and whether they move
	// with every engine step.
	tokens             float64
	scraped, moved     time.Time
	stepCounted, known bool
	// A trainer's operation on the engine under way, and a pause made
	// through the router (until its continue or resume): the engine holds
	// its requests, as it was asked to.
	operations int
	held       bool
}

// Watch registers an attempt waiting for its answer to begin, to be cut
// (with ErrEjected as its cause) if u is ejected meanwhile; its wait
// counts towards a stall from grace on (see checkStall). The returned
// function unregisters it, saying whether the replica answered (a
// successful answer began: progress).
func (u *Upstream) Watch(cancel *context.CancelCauseFunc, unstreamed bool, grace time.Duration) (done func(answered bool)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.health.waiting == nil {
		u.health.waiting = map[*context.CancelCauseFunc]waiter{}
	}
	u.health.waiting[cancel] = waiter{due: time.Now().Add(grace), unstreamed: unstreamed}
	return func(answered bool) {
		u.mu.Lock()
		delete(u.health.waiting, cancel)
		u.mu.Unlock()
		if answered {
			u.Progressed(time.Now())
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
		u.health.held = held
		u.mu.Unlock()
		u.Progressed(time.Now())
	}
}

// scraped records the engine's token counters read at now; a restart
// ends a pause (the engine forgot it).
func (u *Upstream) scraped(em *enginemetrics.Metrics, now time.Time, restarted bool) {
	tokens := em.PromptTokensTotal + em.GenerationTokensTotal
	u.mu.Lock()
	defer u.mu.Unlock()
	p := &u.health.progress
	if !p.known || tokens != p.tokens {
		p.moved = now
	}
	p.tokens, p.scraped, p.known = tokens, now, true
	p.stepCounted = enginemetrics.StepCounted(em.Format)
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
	if st, err := f.rt.Replica(u.cfg.ID); err != nil || st.Asleep {
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
	// The counters tell only if read lately (and a first reading is
	// taken for a move).
	p := &h.progress
	fresh := p.known && now.Sub(p.scraped) < limit
	if fresh && now.Sub(p.moved) < limit {
		return // the engine works
	}
	still := fresh && p.stepCounted
	var oldest time.Time
	for _, w := range h.waiting {
		if (!w.unstreamed || still) && (oldest.IsZero() || w.due.Before(oldest)) {
			oldest = w.due
		}
	}
	if oldest.IsZero() || now.Sub(oldest) < limit {
		return
	}
	why := fmt.Sprintf("stalled: a request waited %v past twice its forecast first token for its answer to begin, and nothing else progressed", now.Sub(oldest).Round(time.Second))
	if still {
		why += "; its engine's token counters stood still"
	}
	f.eject(u, cfg, why, true)
}
