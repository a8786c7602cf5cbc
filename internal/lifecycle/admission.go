package lifecycle

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/tenant"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// admission is the Core's gate under a TTFT SLO: requests predicted to
// miss it wait here (or are refused) instead of in an engine's queue. The
// queue is released by a goroutine that wakes when a request gets its
// first token or ends (the fleet's backlog fell), and every tick to
// refuse the requests that can no longer make their deadline.
type admission struct {
	mu     sync.Mutex
	gate   *admit.Gate[*Request]
	kick   chan struct{}
	closed bool // shutting down: nothing more is held
}

// verdicts a held request receives.
type verdict struct {
	ok      bool // dispatched (or failed to: see Request.decideErr)
	err     *wire.Error
	aborted bool // its client aborted it (Core.Abort)
}

// errAborted is admit's error for a held request its client aborted.
var errAborted = errors.New("aborted by its client while it waited")

// admissionTick is how often the queue is gone through without a kick.
const admissionTick = 100 * time.Millisecond

// RunAdmission releases held requests until ctx ends. Call it once when
// the config has an SLO.
func (c *Core) RunAdmission(ctx context.Context) {
	a := c.adm
	if a == nil {
		return
	}
	t := time.NewTicker(admissionTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			a.mu.Lock()
			a.closed = true
			a.gate.Flush(func(r *Request) { r.held <- verdict{err: c.shutdownErr()} })
			a.mu.Unlock()
			return
		case <-a.kick:
		case <-t.C:
		}
		c.release()
	}
}

func (c *Core) shutdownErr() *wire.Error {
	e := wire.Errorf(statusUnavailable, "the router is shutting down")
	e.RetryAfter = "1"
	return e
}

// kickAdmission asks for the queue to be gone through: the fleet changed.
func (c *Core) kickAdmission() {
	if c.adm == nil {
		return
	}
	select {
	case c.adm.kick <- struct{}{}:
	default:
	}
}

func (c *Core) release() {
	a := c.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gate.Len() == 0 {
		return
	}
	now := c.Now(time.Now())
	a.gate.Release(now, func(r *Request) (admit.Prediction, bool) { return c.predict(now, r) },
		func(r *Request) {
			r.dispatch(now, time.Now())
			r.ready = true
			r.held <- verdict{ok: true}
		},
		c.refuseHeld)
	c.cfg.Metrics.queued(a.gate.Len())
}

// refuseHeld answers a held request refused by flow control.
func (c *Core) refuseHeld(r *Request, why admit.Reason) {
	c.cfg.Metrics.admitted(string(why))
	c.cfg.Metrics.tenantRefused(r.class.Tenant, r.class.Priority, string(why))
	if why == admit.ReasonEvicted {
		r.held <- verdict{err: c.refusal(r, admit.Prediction{}, why)}
		return
	}
	r.held <- verdict{err: c.sloError(r, admit.Prediction{}, "the request waited in the admission queue and can no longer meet")}
}

// refusal is the 429 for a request flow control refused for why.
func (c *Core) refusal(r *Request, p admit.Prediction, why admit.Reason) *wire.Error {
	var e *wire.Error
	switch why {
	case admit.ReasonShed:
		e = wire.Errorf(statusTooMany, "the fleet is saturated and the request is sheddable (priority %s)", admit.PriorityName(r.class.Priority))
	case admit.ReasonFull:
		e = wire.Errorf(statusTooMany, "the admission queue is full of requests of priority %s or above: the fleet is overloaded", admit.PriorityName(r.class.Priority))
	case admit.ReasonEvicted:
		e = wire.Errorf(statusTooMany, "the request waited in the admission queue and was pushed out by requests of a higher priority: the fleet is overloaded")
	case admit.ReasonUnattainable:
		// Not the fleet's load: the request itself. A 400, which
		// clients do not retry (a 429 and its Retry-After they would,
		// for ever).
		return wire.Errorf(statusBadRequest, "the request cannot meet the TTFT SLO of %v even on an idle replica: its own round trip and prefill of %d prompt tokens take about %v; send a shorter prompt, or ask for a looser SLO (%s, within the tenant's bounds)",
			c.cfg.Admission.SLOOf(r.class), r.Route.PromptTokens, p.Floor.Round(time.Millisecond), tenant.TTFTSLOHeader)
	default:
		return c.sloError(r, p, "the request is predicted to miss")
	}
	e.RetryAfter = "1"
	return e
}

func (c *Core) predict(now time.Duration, r *Request) (admit.Prediction, bool) {
	f, err := c.cfg.Router.Predict(now, &r.Route)
	return admit.Prediction{Best: f.Best, Floor: f.Floor, Waiting: f.Waiting}, err == nil
}

func (c *Core) sloError(r *Request, p admit.Prediction, why string) *wire.Error {
	slo := c.cfg.Admission.SLOOf(r.class)
	e := wire.Errorf(statusTooMany, "%s the TTFT SLO of %v: the fleet is overloaded", why, slo)
	e.RetryAfter = strconv.Itoa(admit.RetryAfter(p, slo))
	return e
}

// admit applies admission under the TTFT SLO (a no-op without one): the
// request goes now, waits in the router-side queue until it is predicted
// to make the SLO (then it has been dispatched and next returns its
// replica), or is refused with a 429 and Retry-After. ctx is the client's:
// a client that leaves while its request waits gets ctx's error back and
// the request leaves the queue; abandon it then.
func (r *Request) admit(ctx context.Context) (*wire.Error, error) {
	c := r.core
	if c.adm == nil {
		return nil, nil
	}
	a := c.adm
	now := c.Now(time.Now())
	p, ok := c.predict(now, r)
	if !ok {
		return nil, nil // no replica: Next says so
	}
	a.mu.Lock()
	switch v, why := a.gate.Arrive(r, r.class, now, p, c.refuseHeld); v {
	case admit.Go:
		a.mu.Unlock()
		c.cfg.Metrics.admitted("go")
		c.cfg.Metrics.tenantVerdict(r.class.Tenant, r.class.Priority, "go")
		return nil, nil
	case admit.Reject:
		a.mu.Unlock()
		c.cfg.Metrics.admitted("rejected")
		c.cfg.Metrics.tenantRefused(r.class.Tenant, r.class.Priority, string(why))
		return c.refusal(r, p, why), nil
	}
	if a.closed { // nobody would release it
		a.gate.Drop(func(q *Request) bool { return q == r })
		a.mu.Unlock()
		return c.shutdownErr(), nil
	}
	if r.held == nil {
		r.held = make(chan verdict, 1)
	}
	r.traceHold()
	c.cfg.Metrics.queued(a.gate.Len())
	a.mu.Unlock()
	c.kickAdmission() // requests of its band wait: it goes when it may
	c.cfg.Metrics.admitted("held")
	c.cfg.Metrics.tenantVerdict(r.class.Tenant, r.class.Priority, "held")
	held := time.Now()
	select {
	case v := <-r.held:
		c.cfg.Metrics.tenantWaited(r.class.Tenant, r.class.Priority, time.Since(held))
		if v.aborted {
			return nil, errAborted
		}
		return v.err, nil
	case <-ctx.Done():
	}
	a.mu.Lock()
	dropped := a.gate.Drop(func(q *Request) bool { return q == r })
	c.cfg.Metrics.queued(a.gate.Len())
	a.mu.Unlock()
	if !dropped { // released or aborted meanwhile: its verdict is in the channel
		<-r.held
	}
	return nil, ctx.Err()
}
