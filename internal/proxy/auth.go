package proxy

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/httpapi"
)

// AuthConfig is client authentication: API keys, and what reaches the
// replicas in Authorization.
type AuthConfig struct {
	// KeysFile names a file of client API keys, one per line: "KEY" or
	// "NAME KEY" (the name is what logs and per-key limits use; keys are
	// never logged). Every request to the OpenAI API must then carry
	// "Authorization: Bearer KEY" (compared in constant time); /health
	// and /metrics stay open. Empty: no client authentication.
	KeysFile string `yaml:"keys_file"`
	// Upstream is what reaches a replica in Authorization: "pass" (the
	// client's header), "drop" (none), or "replica" (the replica's own
	// key, from its api_key_env). Default: "drop" with keys_file (the
	// clients' keys are the proxy's, not the engines'), else "pass".
	Upstream string `yaml:"upstream"`
}

// Upstream Authorization policies.
const (
	upstreamPass    = "pass"
	upstreamDrop    = "drop"
	upstreamReplica = "replica"
)

func (a AuthConfig) defaults() AuthConfig {
	if a.Upstream == "" {
		a.Upstream = upstreamPass
		if a.KeysFile != "" {
			a.Upstream = upstreamDrop
		}
	}
	return a
}

func (a AuthConfig) validate() error {
	switch a.Upstream {
	case upstreamPass, upstreamDrop, upstreamReplica:
		return nil
	}
	return fmt.Errorf("config: auth.upstream must be pass, drop or replica, got %q", a.Upstream)
}

// keys reads the client API keys (none without keys_file).
func (a AuthConfig) keys() ([]httpapi.Token, error) {
	if a.KeysFile == "" {
		return nil, nil
	}
	return httpapi.ReadTokens(a.KeysFile, "auth.keys_file")
}

// RateLimitConfig limits the rate of requests to the OpenAI API.
type RateLimitConfig struct {
	// RequestsPerSecond is the sustained rate (0: no limit), Burst how
	// many may come at once (default: the rate, at least 1). Past it a
	// request is answered 429 with Retry-After at once.
	RequestsPerSecond float64 `yaml:"requests_per_second"`
	Burst             int     `yaml:"burst"`
	// PerKey gives every client key its own limit (with auth.keys_file);
	// otherwise one limit holds for all clients together.
	PerKey bool `yaml:"per_key"`
}

func (l RateLimitConfig) validate() error {
	if l.RequestsPerSecond < 0 || math.IsNaN(l.RequestsPerSecond) || math.IsInf(l.RequestsPerSecond, 0) || l.Burst < 0 {
		return fmt.Errorf("config: rate_limit: requests_per_second and burst must be finite and not negative")
	}
	return nil
}

// limiters hands out the rate limiters, one per key or one for all.
type limiters struct {
	cfg RateLimitConfig
	mu  sync.Mutex
	by  map[string]*rate.Limiter
}

func newLimiters(cfg RateLimitConfig) *limiters {
	return &limiters{cfg: cfg, by: map[string]*rate.Limiter{}}
}

// reserve takes a token for key; it returns how long to wait instead when
// there is none now (and takes nothing).
func (l *limiters) reserve(key string) (time.Duration, bool) {
	if l.cfg.RequestsPerSecond <= 0 {
		return 0, true
	}
	if !l.cfg.PerKey {
		key = ""
	}
	l.mu.Lock()
	lim := l.by[key]
	if lim == nil {
		burst := l.cfg.Burst
		if burst == 0 {
			burst = max(1, int(math.Ceil(l.cfg.RequestsPerSecond)))
		}
		lim = rate.NewLimiter(rate.Limit(l.cfg.RequestsPerSecond), burst)
		l.by[key] = lim
	}
	l.mu.Unlock()
	res := lim.Reserve()
	if d := res.Delay(); d > 0 {
		res.Cancel()
		return d, false
	}
	return 0, true
}

type keyName struct{}

// clientKey is the name of the API key a request carried ("" without
// client authentication).
func clientKey(r *http.Request) string {
	n, _ := r.Context().Value(keyName{}).(string)
	return n
}

// guard puts client authentication and the rate limit in front of an
// OpenAI API handler.
func (s *Server) guard(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if keys := *s.keys.Load(); len(keys) > 0 {
			name := httpapi.Match(r, keys)
			if name == "" {
				w.Header().Set("WWW-Authenticate", `Bearer realm="gorgo"`)
				httpapi.Error(w, http.StatusUnauthorized, "a valid API key is required (Authorization: Bearer KEY)")
				return
			}
			r = r.WithContext(context.WithValue(r.Context(), keyName{}, name))
		}
		if wait, ok := s.limits.Load().reserve(clientKey(r)); !ok {
			s.m.refused.WithLabelValues("rate_limit").Inc()
			w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(wait.Seconds())))))
			httpapi.Error(w, http.StatusTooManyRequests, "rate limit exceeded: try again in %v", wait.Round(time.Millisecond))
			return
		}
		h(w, r)
	}
}

// upstreamAuth sets what reaches replica u in Authorization.
func (s *Server) upstreamAuth(h http.Header, u *fleet.Upstream) {
	switch s.cfg.Load().Auth.Upstream {
	case upstreamDrop:
		delete(h, "Authorization")
	case upstreamReplica:
		if u.APIKey() == "" {
			delete(h, "Authorization")
		} else {
			h["Authorization"] = []string{"Bearer " + u.APIKey()}
		}
	}
}
