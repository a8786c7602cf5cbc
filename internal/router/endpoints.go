package router

import (
	"time"
)

// A fleet may mix engines whose APIs differ: SGLang serves its native
// /generate, vLLM does not; vLLM serves /pooling, /classify and the
// Anthropic /v1/messages, SGLang does not. A replica that answered a
// request that it has no such endpoint (its server's own 404 for an
// unknown path, not an engine's error) is passed over for that endpoint
// for a while, as a busy one is: each request sent there meanwhile would
// be a round trip lost before the next replica served it.

// LackingFor is how long a replica that answered that it has no endpoint
// is passed over for it. An engine's routes change only with a restart
// (an upgrade); past it the replica is asked again, at the cost of one
// round trip.
const LackingFor = 5 * time.Minute

// MaxLacking bounds the endpoints remembered per replica (a client that
// posts to made-up paths must not grow the router); past it the one due
// soonest is forgotten. MaxEndpoint bounds an endpoint's length.
const (
	MaxLacking  = 16
	MaxEndpoint = 256
)

// lacking is the endpoints a replica has answered it does not serve, each
// with when (ns of router time) it is asked again. Never modified once
// stored: Lacks replaces it.
type lacking map[string]int64

// lacks reports whether the replica answered, before now, that it has no
// endpoint (a path: "/generate"); "" is any endpoint, never lacked.
func (m *member) lacks(endpoint string, now time.Duration) bool {
	l := m.lacking.Load()
	return l != nil && l.has(endpoint, now)
}

func (l *lacking) has(endpoint string, now time.Duration) bool {
	until, ok := (*l)[endpoint]
	return ok && until > int64(now)
}

// Lacks records that replica id answered at now that it has no such
// endpoint (a path the request was sent to: its server's 404 for an
// unknown route). Decisions for requests to that endpoint
// (policy.Request.Endpoint) pass it over for LackingFor while any other
// replica can take them; it stays their last fallback. An endpoint longer
// than MaxEndpoint is not remembered.
func (r *Router) Lacks(id, endpoint string, now time.Duration) error {
	m, err := r.member(id)
	if err != nil || endpoint == "" || len(endpoint) > MaxEndpoint {
		return err
	}
	r.lacked.Store(true)
	for {
		old := m.lacking.Load()
		next := make(lacking, MaxLacking)
		if old != nil {
			for e, until := range *old {
				if until > int64(now) && e != endpoint {
					next[e] = until
				}
			}
		}
		for len(next) >= MaxLacking {
			soonest := ""
			for e, until := range next {
				if soonest == "" || until < next[soonest] {
					soonest = e
				}
			}
			delete(next, soonest)
		}
		next[endpoint] = int64(now + LackingFor)
		if m.lacking.CompareAndSwap(old, &next) {
			return nil
		}
	}
}
