// Package admin is the operators' side of a gorgo router, on a listener of
// its own: the admin API over the fleet (replicas, weights, the tuner, dry
// runs of decisions) behind bearer tokens, the live view (/admin/ui/), Go's
// profiler, and /metrics.
package admin

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/httpapi"
)

// Config is the admin listener: /admin/* (the admin API) and /metrics,
// apart from client traffic.
type Config struct {
	// Listen is its address (default 127.0.0.1:9091; "off" for none). A
	// non-loopback address needs a token.
	Listen string `yaml:"listen"`
	// TokenFile names a file of bearer tokens, one per line, each "TOKEN"
	// or "NAME TOKEN" (the name is what the log says changed something);
	// blank lines and lines starting with # are skipped. TokenEnv names an
	// environment variable holding one token instead.
	TokenFile string `yaml:"token_file"`
	TokenEnv  string `yaml:"token_env"`
}

// Off as Config.Listen turns the admin listener off.
const Off = "off"

// Defaults returns c with its zero fields set to their defaults.
func (c Config) Defaults() Config {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:9091"
	}
	return c
}

// Validate refuses an admin listener that would be open to the network
// without a token.
func (c Config) Validate() error {
	if c.Listen == Off {
		return nil
	}
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return fmt.Errorf("config: admin.listen %q: %w", c.Listen, err)
	}
	if !loopback(host) && c.TokenFile == "" && c.TokenEnv == "" {
		return fmt.Errorf("config: admin.listen %s is not a loopback address: refusing to serve the admin API there without a token (set admin.token_file or admin.token_env)", c.Listen)
	}
	return nil
}

// loopbackHost reports whether a request's Host names a loopback address
// (with or without a port, a trailing dot), or is absent (HTTP/1.0 health
// checkers send none; a browser always does, and rebinding needs a name).
func loopbackHost(hostport string) bool {
	if hostport == "" {
		return true
	}
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	return loopback(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
}

func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Tokens reads the configured tokens.
func (c Config) Tokens() ([]httpapi.Token, error) {
	var out []httpapi.Token
	if c.TokenEnv != "" {
		v := strings.TrimSpace(os.Getenv(c.TokenEnv))
		if len(v) < httpapi.MinTokenLen {
			return nil, fmt.Errorf("config: admin.token_env: $%s is unset or shorter than %d characters", c.TokenEnv, httpapi.MinTokenLen)
		}
		out = append(out, httpapi.Token{Name: "$" + c.TokenEnv, Secret: v})
	}
	if c.TokenFile != "" {
		toks, err := httpapi.ReadTokens(c.TokenFile, "admin.token_file")
		if err != nil {
			return nil, err
		}
		out = append(out, toks...)
	}
	return out, nil
}

// Server serves the admin API and the live view of a fleet.
type Server struct {
	fleet  *fleet.Fleet
	view   *View
	cfg    atomic.Pointer[Config] // the running config
	log    *slog.Logger
	tokens atomic.Pointer[[]httpapi.Token]
	mux    *http.ServeMux
	quit   chan struct{} // closed when Run ends: long streams (the live view) end
	// tunerFile reports the file keeping the online tuner's state
	// (ShowTunerFile); nil: none.
	tunerFile atomic.Pointer[func() TunerFile]
}

// TunerFile is what /admin/tuner shows of the file that keeps the online
// tuner's state across restarts (gorgo serve's tuner_state).
type TunerFile struct {
	Path string `json:"path"`
	// Start is what the router's start made of the file: "resumed",
	// "none kept yet", "unreadable: replaced" or "not resumed: WHY (kept
	// until the tuner learns anything)".
	Start string `json:"start"`
	// Written is when a state was last written (zero: not yet).
	Written time.Time `json:"written,omitzero"`
	// Error is the last write's failure, until a write succeeds: what the
	// tuner learns meanwhile is not kept.
	Error string `json:"error,omitempty"`
}

// ShowTunerFile has /admin/tuner show the file keeping the tuner's state,
// as fn reports it (fn must be safe to call from any goroutine).
func (s *Server) ShowTunerFile(fn func() TunerFile) { s.tunerFile.Store(&fn) }

// New returns the admin server of a fleet: its live view (nil for none:
// give the same View to the fleet as its lifecycle.Tap), its config, the
// metrics it serves at /metrics, and the log of changes made through it
// (nil: discarded).
func New(f *fleet.Fleet, view *View, cfg Config, metrics prometheus.Gatherer, log *slog.Logger) (*Server, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	toks, err := cfg.Tokens()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{fleet: f, view: view, log: log, quit: make(chan struct{})}
	s.cfg.Store(&cfg)
	s.tokens.Store(&toks)
	s.routes(metrics)
	return s, nil
}

// Config returns the running config.
func (s *Server) Config() Config { return *s.cfg.Load() }

// Prepare judges next as the running config, for a reload: its listen
// address cannot change (restart says so, and next is judged with the
// running one: a reload cannot leave a public listener without tokens);
// apply makes its tokens the running ones.
func (s *Server) Prepare(next Config) (apply func(), restart []string, err error) {
	cur, next := s.Config(), next.Defaults()
	if cur.Listen != next.Listen {
		restart = append(restart, fmt.Sprintf("admin.listen (running %v, file %v)", cur.Listen, next.Listen))
		next.Listen = cur.Listen
	}
	if err := next.Validate(); err != nil {
		return nil, restart, err
	}
	toks, err := next.Tokens()
	if err != nil {
		return nil, restart, err
	}
	return func() {
		s.cfg.Store(&next)
		s.tokens.Store(&toks)
	}, restart, nil
}

// Run runs the live view's clock (a point of history a second) until ctx
// ends; then open live views end.
func (s *Server) Run(ctx context.Context) error {
	defer close(s.quit)
	if s.view != nil {
		s.view.run(ctx.Done(), s.fleet.Policy())
	} else {
		<-ctx.Done()
	}
	return nil
}

// Handler serves /admin/*, the profiler and /metrics, behind the bearer
// tokens if any are configured (the live view's page files need none: they
// hold no data). A web page the operator opens must not drive the API from
// the browser: requests a browser marks as cross-origin are refused unless
// they are reads (http.CrossOriginProtection), and a listener without
// tokens (a loopback one) answers only requests addressed to a loopback
// name, so that a name an attacker rebinds to 127.0.0.1 reads nothing.
func (s *Server) Handler() http.Handler {
	auth, assets := s.authenticated(s.mux), uiAssets()
	xorigin := http.NewCrossOriginProtection()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := xorigin.Check(r); err != nil {
			httpapi.Error(w, http.StatusForbidden, "a cross-origin request to the admin API: %v", err)
			return
		}
		if len(*s.tokens.Load()) == 0 && !loopbackHost(r.Host) {
			httpapi.Error(w, http.StatusForbidden, "this admin listener has no tokens and answers only requests addressed to a loopback name")
			return
		}
		switch {
		case r.URL.Path == "/admin/ui":
			http.Redirect(w, r, "/admin/ui/", http.StatusFound)
		case strings.HasPrefix(r.URL.Path, "/admin/ui/") && r.URL.Path != "/admin/ui/stream" && r.Method == http.MethodGet:
			assets.ServeHTTP(w, r)
		default:
			auth.ServeHTTP(w, r)
		}
	})
}

func (s *Server) routes(g prometheus.Gatherer) {
	metrics := promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	s.mux = http.NewServeMux()
	// Go's profiler, for operators (behind the tokens like the rest).
	s.mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	s.mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	s.mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	s.mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	httpapi.Register(s.mux, []httpapi.Endpoint{
		{Method: "GET", Pattern: "/metrics", Handler: metrics.ServeHTTP},
		{Method: "GET", Pattern: "/admin/replicas", Handler: s.replicas},
		{Method: "GET", Pattern: "/admin/ui/stream", Handler: s.uiStream},
		{Method: "POST", Pattern: "/admin/replicas", Handler: s.add},
		{Method: "DELETE", Pattern: "/admin/replicas/{id}", Handler: s.member(s.fleet.Remove, "remove")},
		{Method: "POST", Pattern: "/admin/replicas/{id}/drain", Handler: s.member(s.fleet.Drain, "drain")},
		{Method: "POST", Pattern: "/admin/replicas/{id}/undrain", Handler: s.member(s.fleet.Undrain, "undrain")},
		{Method: "GET", Pattern: "/admin/weights", Handler: s.weights},
		{Method: "PUT", Pattern: "/admin/weights", Handler: s.setWeights},
		{Method: "GET", Pattern: "/admin/tuner", Handler: s.tuner},
		{Method: "POST", Pattern: "/admin/tuner/pause", Handler: s.pauseTuner(true)},
		{Method: "POST", Pattern: "/admin/tuner/resume", Handler: s.pauseTuner(false)},
		{Method: "POST", Pattern: "/admin/decide", Handler: s.decide},
		{Method: "GET", Pattern: "/admin/models", Handler: s.models},
		{Method: "PUT", Pattern: "/admin/models", Handler: s.setModels},
	})
}

type whoKey struct{}

// who is the name of the admin token a request carried.
func who(r *http.Request) string {
	if n, ok := r.Context().Value(whoKey{}).(string); ok {
		return n
	}
	return "anonymous"
}

// authenticated lets through requests that carry one of the admin tokens
// (compared in constant time), or every request when none is configured
// (a loopback listener).
func (s *Server) authenticated(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		toks := *s.tokens.Load()
		if len(toks) == 0 {
			h.ServeHTTP(w, r)
			return
		}
		name := httpapi.Match(r, toks)
		if name == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="gorgo admin"`)
			httpapi.Error(w, http.StatusUnauthorized, "a valid admin bearer token is required")
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), whoKey{}, name)))
	})
}

// maxJSON bounds an admin request's JSON body; maxDecideBody a dry run's
// request body (as a client's, max_body_bytes' default).
const (
	maxJSON       = 1 << 20
	maxDecideBody = 8 << 20
)
