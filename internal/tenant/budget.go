package tenant

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"
)

// A bucket is a budget per minute: it refills at size per minute up to
// size, and may go below zero (a request that used more than it was
// charged when it arrived) or be given back what was charged too much.
// golang.org/x/time/rate cannot give back a reservation once its time has
// passed, which settling a request's usage needs.
type bucket struct {
	mu    sync.Mutex
	size  float64
	level float64
	at    time.Time
}

func newBucket(perMinute int) *bucket {
	return &bucket{size: float64(perMinute), level: float64(perMinute)}
}

// refill brings the level to now; a time before the last one changes
// nothing (callers' clocks race: the bucket never refills a stretch
// twice). Call with mu held.
func (b *bucket) refill(now time.Time) {
	if b.at.IsZero() {
		b.at = now
		return
	}
	if now.Before(b.at) {
		return
	}
	b.level = min(b.size, b.level+now.Sub(b.at).Minutes()*b.size)
	b.at = now
}

// take charges n at now if the level covers it, else reports how long
// until it would.
func (b *bucket) take(now time.Time, n float64) (time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	if b.level >= n {
		b.level -= n
		return 0, true
	}
	return time.Duration((n - b.level) / b.size * float64(time.Minute)), false
}

// charge adds n to what was taken (less than zero: gives it back).
func (b *bucket) charge(now time.Time, n float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	b.level = min(b.size, b.level-n)
}

// state is what is left at now (not below zero) and how long until the
// bucket is full again.
func (b *bucket) state(now time.Time) (left int, reset time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	return int(math.Max(b.level, 0)), time.Duration((b.size - b.level) / b.size * float64(time.Minute))
}

// Grant is a request's charge to its tenant's budgets: Settle corrects it
// when the request ends.
type Grant struct {
	t       *Tenant
	charged int
}

// Refusal is a request over its tenant's budget: a 429 with Retry-After.
type Refusal struct {
	Message string
	// RetryAfter is how long until the request could go; Never says it
	// never can, being larger than the whole budget.
	RetryAfter time.Duration
	Never      bool
}

// Admit charges one request and its tokens to the tenant's budgets at now,
// or refuses it, charging nothing: its prompt's estimate and the answer
// it is expected to need (expected), at most the whole budget, settled
// with what it used when it ends (Grant.Settle). Charging the answer up
// front, as OpenAI charges max_tokens, keeps a burst of requests from
// spending many times the budget before the first of them ends; a
// request is refused for good only when its prompt alone is larger than
// the budget.
func (t *Tenant) Admit(now time.Time, prompt, expected int) (Grant, *Refusal) {
	tokens := prompt + max(expected, 0)
	g := Grant{t: t}
	if t.reqs != nil {
		if wait, ok := t.reqs.take(now, 1); !ok {
			return g, &Refusal{Message: fmt.Sprintf("tenant %s is over its budget of %d requests per minute: try again in %v", t.Name, t.RequestsPerMinute, roundUp(wait)), RetryAfter: wait}
		}
	}
	if t.tokens != nil {
		if prompt > t.TokensPerMinute {
			t.reqs.giveBack(now)
			return g, &Refusal{Message: fmt.Sprintf("this request of about %d prompt tokens is more than tenant %s's budget of %d tokens per minute", prompt, t.Name, t.TokensPerMinute), Never: true}
		}
		tokens = min(tokens, t.TokensPerMinute)
		if wait, ok := t.tokens.take(now, float64(tokens)); !ok {
			t.reqs.giveBack(now)
			return g, &Refusal{Message: fmt.Sprintf("tenant %s is over its budget of %d tokens per minute: try again in %v", t.Name, t.TokensPerMinute, roundUp(wait)), RetryAfter: wait}
		}
		g.charged = tokens
	}
	if t.reqs != nil || t.tokens != nil {
		t.told(1, float64(g.charged))
	}
	return g, nil
}

// told passes a charge made here (negative: given back) to share, if set.
func (t *Tenant) told(requests, tokens float64) {
	if t.share != nil && (requests != 0 || tokens != 0) {
		t.share(t.Name, requests, tokens)
	}
}

// Share has every charge made to the tenants' budgets here told to fn
// (requests and tokens; negative: given back), so that the other routers
// of a mesh charge their own (ChargeRemote): a tenant's budget is then the
// fleet's, not each router's. Call it before the set is in use.
func (s *Set) Share(fn func(tenant string, requests, tokens float64)) {
	for _, t := range s.by {
		t.share = fn
	}
}

// Carry makes the budgets of prev's tenants of the same names this set's,
// so that a reload neither refills a budget nor forgets what was charged
// to it, before, during or after the reload: each budget both sets have
// is the same one, resized to this set's size (what was spent stays spent:
// its level the new size less that), and a request admitted under prev
// settles with it (2026-12-07, a review: copied, a budget lost the charges
// made while the sets were swapped and the settlements of the requests
// admitted before). A budget new to a tenant starts full. Call it before
// the set is in use.
func (s *Set) Carry(prev *Set, now time.Time) {
	if prev == nil {
		return
	}
	for name, t := range s.by {
		if old := prev.by[name]; old != nil {
			t.reqs = old.reqs.resized(t.reqs, now)
			t.tokens = old.tokens.resized(t.tokens, now)
		}
	}
}

// resized returns b, resized to next's size at now, to be used in next's
// place; next itself where either is nil (a budget new, or gone).
func (b *bucket) resized(next *bucket, now time.Time) *bucket {
	if b == nil || next == nil {
		return next
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	b.level += next.size - b.size // what was spent stays spent
	b.size = next.size
	b.level = min(b.level, b.size)
	return b
}

// ChargeRemote charges what another router charged to tenant at now: its
// budgets may go below zero (the other router admitted on its own view),
// and the requests here wait until they refill. A tenant not configured
// here is ignored.
func (s *Set) ChargeRemote(now time.Time, tenant string, requests, tokens float64) {
	t := s.by[tenant]
	if t == nil || math.IsNaN(requests) || math.IsNaN(tokens) || math.IsInf(requests, 0) || math.IsInf(tokens, 0) {
		return
	}
	if t.reqs != nil && requests != 0 {
		t.reqs.charge(now, requests)
	}
	if t.tokens != nil && tokens != 0 {
		t.tokens.charge(now, tokens)
	}
}

// giveBack returns a request taken from a request budget (nil: none).
func (b *bucket) giveBack(now time.Time) {
	if b != nil {
		b.charge(now, -1)
	}
}

// Settle charges the tenant what the request used, tokens (its prompt and
// completion), in place of what Admit charged.
func (g Grant) Settle(now time.Time, tokens int) {
	if g.t == nil || g.t.tokens == nil {
		return
	}
	d := float64(tokens - g.charged)
	g.t.tokens.charge(now, d)
	g.t.told(0, d)
}

// Refund gives back all Admit charged: the request was not served.
func (g Grant) Refund(now time.Time) {
	if g.t == nil {
		return
	}
	if g.t.reqs != nil {
		g.t.reqs.giveBack(now)
		g.t.told(-1, 0)
	}
	g.Settle(now, 0)
}

// Headers gives the tenant's budgets at now as OpenAI's API does
// (x-ratelimit-limit-requests, -remaining-requests, -reset-requests, and
// the same for tokens), through set; nothing for a budget it does not
// have.
func (t *Tenant) Headers(now time.Time, set func(name, value string)) {
	if t.reqs != nil {
		left, reset := t.reqs.state(now)
		set("X-Ratelimit-Limit-Requests", strconv.Itoa(t.RequestsPerMinute))
		set("X-Ratelimit-Remaining-Requests", strconv.Itoa(left))
		set("X-Ratelimit-Reset-Requests", roundUp(reset).String())
	}
	if t.tokens != nil {
		left, reset := t.tokens.state(now)
		set("X-Ratelimit-Limit-Tokens", strconv.Itoa(t.TokensPerMinute))
		set("X-Ratelimit-Remaining-Tokens", strconv.Itoa(left))
		set("X-Ratelimit-Reset-Tokens", roundUp(reset).String())
	}
}

// roundUp rounds a wait up to the millisecond.
func roundUp(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}
