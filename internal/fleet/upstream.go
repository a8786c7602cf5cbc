package fleet

import (
	"context"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/gorgo-llm/gorgo/internal/models"
)

// Upstream is one replica as the fleet reaches it: its config, the source
// that brought it, its credentials, its outlier state, and its probe and
// scrape loops. The router holds what is observed of it.
type Upstream struct {
	cfg    ReplicaConfig
	source string
	apiKey string

	mu      sync.Mutex
	health  health
	stop    context.CancelFunc // ends its probe and scrape loops
	stopped bool
	// released is the memory a client had its SGLang engine free
	// (/release_memory_occupation) and not take back yet; under mu.
	released map[string]bool
	// out says the replica is ejected, or its ejection is over and no
	// probe has brought it back yet (set at an ejection under the fleet's
	// ejectMu): the share of the fleet out, for max_ejection_percent.
	out atomic.Bool

	// served is what the config says the replica serves (nil: its GET
	// /v1/models is read); refresh asks for the list to be read again.
	served        *models.Set
	refresh       chan struct{}
	scrapeFailing atomic.Bool
	// sleepless: it does not say whether it sleeps (no GET /is_sleeping:
	// SGLang, vLLM outside its development mode), and is not asked again.
	sleepless     atomic.Bool
	asking        atomic.Bool // a probe's question of its sleep is out
	modelsFailing atomic.Bool
	// foreignRun counts the scrapes in a row that showed requests from
	// elsewhere (negative: that showed none), up to foreignScrapes;
	// foreignSaid is whether the router said so.
	foreignRun  atomic.Int32
	foreignSaid atomic.Bool
	// progressed is when the replica last made progress (Unix ns;
	// Progressed).
	progressed atomic.Int64
	// attemptLog limits the log lines of its failed attempts; capLog those
	// of ejections held back by max_ejection_percent.
	attemptLog, capLog rate.Sometimes
}

func newUpstream(rc ReplicaConfig, source string) (*Upstream, error) {
	key, err := rc.apiKey()
	if err != nil {
		return nil, err
	}
	served, err := rc.served()
	if err != nil {
		return nil, err
	}
	return &Upstream{cfg: rc, source: source, apiKey: key, served: served, refresh: make(chan struct{}, 1),
		attemptLog: rate.Sometimes{First: 3, Interval: 10 * time.Second}, capLog: rate.Sometimes{First: 1, Interval: 10 * time.Second}}, nil
}

// ID is the replica's id.
func (u *Upstream) ID() string { return u.cfg.ID }

// URL is the replica's base URL.
func (u *Upstream) URL() string { return u.cfg.URL }

// Config is the replica's config.
func (u *Upstream) Config() ReplicaConfig { return u.cfg }

// Source names the source that brought the replica (config, admin,
// dns:NAME).
func (u *Upstream) Source() string { return u.source }

// APIKey is the replica's own API key ("" if it has none).
func (u *Upstream) APIKey() string { return u.apiKey }

// Endpoint returns the replica's address as host:port (from its URL, the
// scheme's port when none is given), for front ends that name endpoints
// rather than forward to them.
func (u *Upstream) Endpoint() (string, bool) {
	parsed, err := url.Parse(u.cfg.URL)
	if err != nil || parsed.Host == "" {
		return "", false
	}
	host, port := parsed.Hostname(), parsed.Port()
	if port == "" {
		port = "80"
		if parsed.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(host, port), true
}

// LogAttempt runs log for a failed attempt at most every 10 s (the first
// three at once).
func (u *Upstream) LogAttempt(log func()) { u.attemptLog.Do(log) }

// Health is the replica's outlier state: failures in a row, times ejected
// (reset once it stays up), and when the current ejection ends (zero if
// it is not ejected).
func (u *Upstream) Health() (failures, ejections int, ejectedUntil time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if time.Now().Before(u.health.until) {
		ejectedUntil = u.health.until
	}
	return u.health.failures, u.health.ejections, ejectedUntil
}

// stopLoops ends the upstream's loops, and keeps loops from starting after.
func (u *Upstream) stopLoops() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.stopped = true
	if u.stop != nil {
		u.stop()
	}
}

// isOut reports whether h says the replica is out: ejected, and not yet
// back (see Upstream.out).
func (h *health) isOut() bool { return !h.until.IsZero() && h.upSince.IsZero() }
