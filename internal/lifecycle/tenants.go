package lifecycle

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/tenant"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// Tenants. A front end names a request's tenant (Incoming.Tenant) and
// passes what it asks for (Incoming.Ask); classify turns them into its
// class for flow control (tenant, priority, TTFT SLO, tokens), its TPOT
// SLO for the decision, and a charge to its tenant's budgets (its prompt
// and the answer the router expects of it), whose state
// goes back to the client in OpenAI's x-ratelimit-* headers (on answers
// and refusals alike). The charge is settled with the request's output
// when it ends.

// Tenants returns the tenants the requests are classed by now (nil: none).
func (c *Core) Tenants() *tenant.Set { return c.tenants.Load() }

// SetTenants makes ts the tenants from the next request on (a reload's):
// a budget the tenants before had too is the same budget, resized
// (tenant.Set.Carry: what it spent stays spent, and the requests
// admitted before settle with it), their names become the metrics'
// labels, and flow control weighs their shares anew. Requests under way
// keep the class they had. Whether flow control runs is fixed at start:
// ts must hold a TTFT SLO if and only if the tenants before did, or the
// fleet has its own.
func (c *Core) SetTenants(ts *tenant.Set, now time.Time) {
	var names []string
	var weights map[string]float64
	if ts != nil {
		ts.Carry(c.tenants.Load(), now)
		names, weights = ts.Names(), ts.Weights()
	}
	c.tenants.Store(ts)
	c.cfg.Metrics.SetTenants(names)
	if a := c.adm; a != nil {
		a.mu.Lock()
		a.gate.SetWeights(weights)
		a.mu.Unlock()
	}
}

// classify sets the request's class and charges its tenant's budgets, or
// says why it is refused: a 400 for an ask out of bounds, a 429 over
// budget.
func (r *Request) classify(in *Incoming, now time.Time) *wire.Error {
	c := r.core
	expected := c.cfg.Router.ExpectedOutput(&r.Route) * r.Route.Sequences() // every sequence's
	r.class = admit.Class{Priority: admit.Standard, Tokens: r.Route.PromptTokens + expected}
	ts := c.tenants.Load()
	if ts == nil {
		return nil
	}
	t := ts.Lookup(in.Tenant)
	r.tenant = t
	r.class.Priority = t.Priority() // a request refused for its ask is counted in its tenant's band
	class, tpot, err := t.Class(in.Ask, r.class.Tokens)
	if err != nil {
		return wire.Errorf(statusBadRequest, "%v", err)
	}
	if class.SLO <= 0 && c.adm != nil && c.cfg.Admission.SLO <= 0 {
		// Flow control is on for another tenant's SLO, and the router
		// has none for the others: a request without one is held to the
		// loosest its tenant may ask for (how long a request may wait in
		// the queue), so that it waits behind the bands above it, is
		// sheltered or shed below standard, and takes its fair share,
		// instead of going straight to the engines' queues.
		class.SLO, r.sloHold = t.MaxTTFTSLO, true
	}
	r.class = class
	r.Route.TPOTSLOMS = float64(tpot) / 1e6
	r.Route.WaitingCap = c.cfg.Admission.WaitingCap(class)
	// The budget is charged the answers' limit where the request gives
	// one, as OpenAI charges max_tokens: charged the router's estimate,
	// a burst of requests could each run to max_tokens before the first
	// of them ends and its usage is settled.
	charge := expected
	if m := r.Route.MaxOutputTokens; m > 0 {
		charge = max(expected, min(m, math.MaxInt32)*r.Route.Sequences())
	}
	grant, refusal := t.Admit(now, r.Route.PromptTokens, charge)
	r.header = in.Header
	if in.Header != nil {
		t.Headers(now, in.Header.Set)
	}
	if refusal != nil {
		e := wire.Errorf(statusTooMany, "%s", refusal.Message)
		e.Code = "rate_limit_exceeded" // OpenAI's, for a client that tells its 429s apart
		switch {
		case !refusal.Never:
			e.RetryAfter = strconv.Itoa(max(1, int(math.Ceil(refusal.RetryAfter.Seconds()))))
		case in.Header != nil:
			// Larger than the whole budget. OpenAI's SDKs retry a 429
			// unless told not to.
			in.Header.Set("X-Should-Retry", "false")
		}
		c.cfg.Metrics.tenantRefused(t.Name, class.Priority, "budget")
		return e
	}
	r.grant = grant
	return nil
}

// refund gives the request's charge back to its tenant's budgets (it was
// not served), and says so in the answer's budget headers, not yet sent
// (2026-12-07, a user's test: a 503 charged nothing showed the budget
// less the request).
func (r *Request) refund(now time.Time) {
	r.grant.Refund(now)
	if r.tenant != nil && r.header != nil {
		r.tenant.Headers(now, r.header.Set)
	}
}

// settleBudget charges the tenant what the request used: its prompt's
// estimate and the tokens it was answered with.
func (r *Request) settleBudget(at time.Time) {
	if r.tenant != nil {
		r.grant.Settle(at, r.Route.PromptTokens+r.outputTokens())
	}
}

// tenantMetrics are the series by tenant and priority: configured tenants
// and named priorities only (others are "other").
type tenantMetrics struct {
	requests *prometheus.CounterVec
	refused  *prometheus.CounterVec
	wait     *prometheus.HistogramVec
	ttft     *prometheus.HistogramVec
	e2e      *prometheus.HistogramVec
	// mu is held for reading from a request's labels to its series'
	// update, and for writing while SetTenants changes the names and
	// deletes the series of the names gone: a request labelled with a
	// name cannot write its series after the name's series were deleted.
	mu sync.RWMutex
	// known are the tenants labelled by name (nil: no tenants): the
	// series carry these names, or "other".
	known map[string]bool
}

func newTenantMetrics(reg prometheus.Registerer) *tenantMetrics {
	labels := []string{"tenant", "priority"}
	m := &tenantMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_tenant_requests_total",
			Help: "Requests by tenant, priority and how flow control took them: go (at once), held (queued first), refused."}, append(labels, "verdict")),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_tenant_refused_total",
			Help: "Requests refused by tenant, priority and reason: budget, slo (predicted to miss it), expired (waited past it), shed (sheddable, the fleet saturated), queue_full, evicted (pushed out by a higher priority), bad_request."}, append(labels, "reason")),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gorgo_tenant_queue_wait_seconds",
			Help: "Time held requests waited in the router-side queue, by tenant and priority.", Buckets: latencyBuckets}, labels),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gorgo_tenant_ttft_seconds",
			Help: "TTFT of served requests by tenant and priority.", Buckets: latencyBuckets}, labels),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gorgo_tenant_e2e_seconds",
			Help: "E2E of served requests by tenant and priority.", Buckets: latencyBuckets}, labels),
	}
	reg.MustRegister(m.requests, m.refused, m.wait, m.ttft, m.e2e)
	return m
}

// SetTenants labels the series of these tenants by name; others are
// "other". The series of a tenant no longer named go (a tenant removed on
// a reload would otherwise keep its series until the router restarted);
// without tenants, all of them.
func (m *Metrics) SetTenants(names []string) {
	if m == nil {
		return
	}
	tm := m.tm
	tm.mu.Lock()
	defer tm.mu.Unlock()
	if names == nil { // no tenants: no series
		tm.known = nil
		tm.requests.Reset()
		tm.refused.Reset()
		tm.wait.Reset()
		tm.ttft.Reset()
		tm.e2e.Reset()
		return
	}
	known := make(map[string]bool, len(names))
	for _, n := range names {
		known[n] = true
	}
	for name := range tm.known {
		if known[name] {
			continue
		}
		gone := prometheus.Labels{"tenant": name}
		tm.requests.DeletePartialMatch(gone)
		tm.refused.DeletePartialMatch(gone)
		tm.wait.DeletePartialMatch(gone)
		tm.ttft.DeletePartialMatch(gone)
		tm.e2e.DeletePartialMatch(gone)
	}
	tm.known = known
}

// tenantLabels are a request's tenant and priority labels; ok is false
// without tenants (no series then). Call with tm.mu held for reading,
// until the series are written.
func (m *Metrics) tenantLabels(name string, prio int) (t, p string, ok bool) {
	known := m.tm.known
	if known == nil {
		return "", "", false
	}
	if !known[name] {
		name = tenant.Other
	}
	p, named := admit.NamedPriority(prio)
	if !named {
		p = tenant.Other
	}
	return name, p, true
}

func (m *Metrics) tenantVerdict(name string, prio int, verdict string) {
	if m == nil {
		return
	}
	m.tm.mu.RLock()
	defer m.tm.mu.RUnlock()
	if t, p, ok := m.tenantLabels(name, prio); ok {
		m.tm.requests.WithLabelValues(t, p, verdict).Inc()
	}
}

func (m *Metrics) tenantRefused(name string, prio int, reason string) {
	if m == nil {
		return
	}
	m.tm.mu.RLock()
	defer m.tm.mu.RUnlock()
	if t, p, ok := m.tenantLabels(name, prio); ok {
		m.tm.requests.WithLabelValues(t, p, "refused").Inc()
		m.tm.refused.WithLabelValues(t, p, reason).Inc()
	}
}

func (m *Metrics) tenantWaited(name string, prio int, d time.Duration) {
	if m == nil {
		return
	}
	m.tm.mu.RLock()
	defer m.tm.mu.RUnlock()
	if t, p, ok := m.tenantLabels(name, prio); ok {
		m.tm.wait.WithLabelValues(t, p).Observe(d.Seconds())
	}
}

func (m *Metrics) tenantServed(name string, prio int, ttft, e2e time.Duration) {
	if m == nil {
		return
	}
	m.tm.mu.RLock()
	defer m.tm.mu.RUnlock()
	t, p, ok := m.tenantLabels(name, prio)
	if !ok {
		return
	}
	if ttft != noTTFT {
		m.tm.ttft.WithLabelValues(t, p).Observe(ttft.Seconds())
	}
	m.tm.e2e.WithLabelValues(t, p).Observe(e2e.Seconds())
}
