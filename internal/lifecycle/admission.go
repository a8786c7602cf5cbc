package lifecycle

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admit"
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
	ok  bool // dispatched (or failed to: see Request.decideErr)
	err *Error
}

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

func (c *Core) shutdownErr() *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: "ServiceUnavailableError", Message: "the router is shutting down", RetryAfter: "1"}
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
			r.dispatch(now)
			r.held <- verdict{ok: true}
		},
		func(r *Request) {
			c.Metrics.admitted("expired")
			r.held <- verdict{err: c.sloError(admit.Prediction{}, "the request waited in the admission queue and can no longer meet")}
		})
	c.Metrics.queued(a.gate.Len())
}

func (c *Core) predict(now time.Duration, r *Request) (admit.Prediction, bool) {
	best, floor, err := c.Router.Predict(now, &r.Route)
	return admit.Prediction{Best: best, Floor: floor}, err == nil
}

func (c *Core) sloError(p admit.Prediction, why string) *Error {
	slo := c.adm.gate.Config().SLO
	return &Error{Status: http.StatusTooManyRequests, Type: "RateLimitError",
		Message:    why + " the TTFT SLO of " + slo.String() + ": the fleet is overloaded",
		RetryAfter: strconv.Itoa(admit.RetryAfter(p, slo))}
}

// Admit applies admission under the TTFT SLO (a no-op without one): the
// request goes now, waits in the router-side queue until it is predicted
// to make the SLO (then it has been dispatched and Next returns its
// replica), or is refused with a 429 and Retry-After. ctx is the client's:
// a client that leaves while its request waits gets ctx's error back and
// the request leaves the queue; call Abandon then.
func (r *Request) Admit(ctx context.Context) (*Error, error) {
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
	switch a.gate.Arrive(r, now, p) {
	case admit.Go:
		a.mu.Unlock()
		c.Metrics.admitted("go")
		return nil, nil
	case admit.Reject:
		a.mu.Unlock()
		c.Metrics.admitted("rejected")
		return c.sloError(p, "the request is predicted to miss"), nil
	}
	if a.closed { // nobody would release it
		a.gate.Drop(func(q *Request) bool { return q == r })
		a.mu.Unlock()
		return c.shutdownErr(), nil
	}
	if r.held == nil {
		r.held = make(chan verdict, 1)
	}
	c.Metrics.queued(a.gate.Len())
	a.mu.Unlock()
	c.Metrics.admitted("held")
	select {
	case v := <-r.held:
		return v.err, nil
	case <-ctx.Done():
	}
	a.mu.Lock()
	dropped := a.gate.Drop(func(q *Request) bool { return q == r })
	c.Metrics.queued(a.gate.Len())
	a.mu.Unlock()
	if !dropped { // released meanwhile: its verdict is in the channel
		<-r.held
	}
	return nil, ctx.Err()
}

// dispatch makes the router's decision for a request admission releases,
// so that the next prediction sees it in the backlog; Next hands it on.
func (r *Request) dispatch(now time.Duration) {
	c := r.core
	start := time.Now()
	t, fb, err := c.Router.Dispatch(now, &r.Route, c.rng, r.fbBuf[:0])
	if c.Metrics != nil {
		c.Metrics.decision.Observe(time.Since(start).Seconds())
	}
	r.ready = true
	if err != nil {
		r.decideErr = err
		return
	}
	r.fallbacks = fb
	r.ticket, r.active, r.attempts = t, true, 1
}
