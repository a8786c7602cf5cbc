package proxy

import (
	"bytes"
	"fmt"
	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/mesh"
	"io"
	"maps"
	"math"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/gorgo-llm/gorgo/internal/discover"
	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/policy"
)

// Config is what `gorgo serve` reads from its YAML file. Zero fields take
// the defaults Defaults fills in.
type Config struct {
	// Listen is the client listener's address (default 127.0.0.1:8080).
	Listen string `yaml:"listen"`
	// Admin configures the admin listener.
	Admin AdminConfig `yaml:"admin"`
	// TLS serves clients over TLS; UpstreamTLS is TLS to https replicas.
	TLS         TLSConfig         `yaml:"tls"`
	UpstreamTLS UpstreamTLSConfig `yaml:"upstream_tls"`
	// Auth configures client API keys; RateLimit limits request rates.
	Auth      AuthConfig      `yaml:"auth"`
	RateLimit RateLimitConfig `yaml:"rate_limit"`
	// Replicas are the replicas the config names; Discover adds groups of
	// replicas found in DNS. Either may be empty (replicas can also come
	// through the admin API).
	Replicas []ReplicaConfig  `yaml:"replicas"`
	Discover []discover.Group `yaml:"discover"`
	// Policy names the routing policy (default: "default", gorgo-e2e); any
	// registered policy but the simulator's.
	Policy string `yaml:"policy"`
	// Params are policies' parameters, by policy name (a parameter not
	// given takes its default): in the file, params: {gorgo-e2e: {decode:
	// 0.3}}, or under the key the policy registered (policy.Info.ConfigKey:
	// weights: for gorgo's, ms_weights: for gorgo-ms's, e2e_weights: for
	// the default policy's), which ParseConfig reads by asking the registry.
	Params map[string]policy.Values `yaml:"params"`
	// TieMargin is the scoring policies' relative tie margin (default 0.01).
	TieMargin float64 `yaml:"tie_margin"`
	// BlockTokens is the prefix index's block size in estimated tokens
	// (default 64); BytesPerToken the token estimator's (default 4, as the
	// emulator's).
	BlockTokens   int `yaml:"block_tokens"`
	BytesPerToken int `yaml:"bytes_per_token"`
	// ProbeInterval is the period of round-trip probes (GET /health,
	// default 5 s); ScrapeInterval of /metrics scrapes (default 5 s); both
	// the paper used 30 s.
	ProbeInterval  time.Duration `yaml:"probe_interval"`
	ScrapeInterval time.Duration `yaml:"scrape_interval"`
	// RTTAlpha smooths the probes (default 0.3).
	RTTAlpha float64 `yaml:"rtt_alpha"`
	// OnlineRates learns gorgo-ms's per-replica rates from observed TTFT.
	OnlineRates bool `yaml:"online_rates"`
	// MaxAttempts bounds the replicas one request is tried on (default 3):
	// a replica that refuses the connection or answers 5xx/429 before any
	// byte reached the client is skipped and another chosen.
	MaxAttempts int `yaml:"max_attempts"`
	// FailureThreshold is how many failures in a row (requests or probes)
	// eject a replica (default 3); so does a failure rate of half its last
	// 20 requests and probes. An ejected replica takes no requests for
	// EjectionTime (default 30 s) times the number of its ejections, at
	// most MaxEjectionTime (default 5 min); then a successful probe brings
	// it back. Staying up for MaxEjectionTime resets its count.
	FailureThreshold int           `yaml:"failure_threshold"`
	EjectionTime     time.Duration `yaml:"ejection_time"`
	MaxEjectionTime  time.Duration `yaml:"max_ejection_time"`
	// ConnectTimeout bounds connecting to a replica (default 5 s);
	// HeaderTimeout waiting for a stream's response headers (default 30
	// s): SGLang and vLLM start a stream at once, even for a request they
	// queue, so a replica that sends none is hung, and the request is tried
	// on another. Non-streaming answers have no such limit (their headers
	// come with their last token). Negative means no limit.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	HeaderTimeout  time.Duration `yaml:"header_timeout"`
	// FirstByteTimeout bounds waiting for a non-streaming answer (which
	// comes whole, when generation ends; default 5 min; negative: no
	// limit): a replica that sends nothing by then is given up on and the
	// request tried elsewhere.
	FirstByteTimeout time.Duration `yaml:"first_byte_timeout"`
	// StreamIdleTimeout cuts an answer whose replica sends nothing for this
	// long (default 60 s; negative: never), which frees the client and
	// counts against the replica.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// Seed fixes the policies' random draws.
	Seed uint64 `yaml:"seed"`
	// TTFTSLO, if set, turns admission on: a request whose best predicted
	// TTFT exceeds it waits in a router-side queue of at most
	// AdmissionQueue requests (default 1024) until it can make it, least
	// predicted TTFT first (Admission: queue, the default), or is refused
	// at once with 429 and Retry-After (Admission: reject). A request that
	// can no longer make it gets the 429 too. Changing them needs a
	// restart.
	TTFTSLO time.Duration `yaml:"ttft_slo"`
	// Region is where this router runs: the region policies that prefer
	// their own use (skywalker), and the default name on a mesh.
	Region string `yaml:"region"`
	// Mesh, if set, shares this router's requests with the other routers
	// of a mesh, and mirrors theirs, over NATS (see package mesh). Needs a
	// restart to change.
	Mesh           *mesh.Config `yaml:"mesh"`
	Admission      admit.Mode   `yaml:"admission"`
	AdmissionQueue int          `yaml:"admission_queue"`
	// IdleTimeout closes a client's keep-alive connection idle this long
	// (default 75 s, nginx's); ReadHeaderTimeout cuts a client that takes
	// longer to send its request headers (default 10 s: slowloris).
	IdleTimeout       time.Duration `yaml:"idle_timeout"`
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// ShutdownTimeout is how long a shutdown (SIGTERM, SIGINT) lets the
	// requests in flight finish, streams included, while new connections
	// are refused (default 30 s).
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// MaxBodyBytes bounds a request body on every endpoint (default 8 MiB;
	// a larger one is refused with 413, from its Content-Length before it
	// is read when it gives one). MaxAnswerBytes is how much of a
	// non-streaming answer is held before the client gets any of it
	// (default 1 MiB): an answer that fits and breaks off is tried on
	// another replica; a longer one is passed through as it comes, its
	// usage unread. (A stream's events are held up to 64 KiB each, to be
	// peeked at; a longer event is passed through unpeeked.)
	MaxBodyBytes   int64 `yaml:"max_body_bytes"`
	MaxAnswerBytes int64 `yaml:"max_answer_bytes"`
	// MaxConnections caps the client connections open at once (default
	// 8192) and MaxInFlight the requests being served (default 4096); past
	// either a client is answered 503 with Retry-After at once. Negative:
	// no cap.
	MaxConnections int `yaml:"max_connections"`
	MaxInFlight    int `yaml:"max_in_flight"`
	// ConfigPoll is how often the config file's modification time is
	// checked, and the file reloaded when it changed (default 5 s; negative:
	// never; SIGHUP reloads it at any time).
	ConfigPoll time.Duration `yaml:"config_poll"`
}

// AdminConfig is the admin listener: /admin/* (the admin API) and
// /metrics, apart from client traffic.
type AdminConfig struct {
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

// AdminOff as AdminConfig.Listen turns the admin listener off.
const AdminOff = "off"

// ReplicaConfig is one upstream engine.
type ReplicaConfig struct {
	// ID names the replica (default the URL's host).
	ID string `yaml:"id"`
	// URL is the engine's base URL; /v1/..., /health and /metrics are
	// appended.
	URL    string `yaml:"url"`
	Region string `yaml:"region"`
	// Profile, if set, names the engine profile the replica runs: it gives
	// the KV capacity, the prefill and queue rates and the priors of the
	// ITL model unless set here.
	Profile          string  `yaml:"profile"`
	KVCapacityTokens int     `yaml:"kv_capacity_tokens"`
	PrefillMSPerTok  float64 `yaml:"prefill_ms_per_token"`
	QueueMSPerTok    float64 `yaml:"queue_ms_per_token"`
	// ITLMS and ITLSlopeMS are the priors of the replica's inter-token
	// latency model (ms, and ms per request in flight); the router learns
	// both from the streams it relays.
	ITLMS      float64 `yaml:"itl_ms"`
	ITLSlopeMS float64 `yaml:"itl_slope_ms"`
	// MetricsPath is where the engine serves Prometheus metrics (default
	// /metrics).
	MetricsPath string `yaml:"metrics_path"`
	// APIKeyEnv names the environment variable holding the replica's API
	// key, sent as its Authorization with auth.upstream: replica.
	APIKeyEnv string `yaml:"api_key_env"`
}

// LoadConfig reads a YAML config file; unknown fields are errors.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading config: %w", err)
	}
	return ParseConfig(data, path)
}

// ParseConfig decodes a YAML config (name says where it came from, for
// errors); unknown fields are errors, and so is an empty document (a file
// caught half-written by a reload must not empty the fleet).
func ParseConfig(data []byte, name string) (Config, error) {
	var f configFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if err == io.EOF {
			return Config{}, fmt.Errorf("config %s is empty", name)
		}
		return Config{}, fmt.Errorf("config %s: %w", name, err)
	}
	if err := f.readPolicyKeys(); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", name, err)
	}
	return f.Config, nil
}

// configFile is the file as decoded: the config, and the top-level keys no
// field takes, which may be policies' keys.
type configFile struct {
	Config `yaml:",inline"`
	Keys   map[string]yaml.Node `yaml:",inline"`
}

// readPolicyKeys moves the parameters given under policies' own keys into
// Params (params: wins where both give one); any other unknown key is an
// error, as for the fields.
func (c *configFile) readPolicyKeys() error {
	for _, key := range slices.Sorted(maps.Keys(c.Keys)) {
		node := c.Keys[key]
		info, ok := policy.ByConfigKey(key)
		if !ok {
			return fmt.Errorf("line %d: field %s not found in the config (policies' parameters: params: or %s)", node.Line, key, strings.Join(policy.ConfigKeys(), ", "))
		}
		var v policy.Values
		if err := node.Decode(&v); err != nil {
			return fmt.Errorf("line %d: %s: %w", node.Line, key, err)
		}
		if v == nil {
			v = policy.Values{}
		}
		if c.Params == nil {
			c.Params = map[string]policy.Values{}
		}
		for k, x := range c.Params[info.Name] {
			v[k] = x
		}
		c.Params[info.Name] = v
	}
	return nil
}

// PolicyOptions are the options of a new instance of the named policy
// under this config: its parameters (the defaults of those not given) and
// the router's region.
func (c *Config) PolicyOptions(name string) policy.Options {
	return policy.Options{Params: c.Params[policy.Canonical(name)].Clone(), Region: c.Region}
}

// paperProfile is the profile replicas without one are priced at.
const paperProfile = "paper"

// Defaults returns c with every zero field set to its default.
func (c Config) Defaults() Config {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	c.Auth = c.Auth.defaults()
	if c.Admin.Listen == "" {
		c.Admin.Listen = "127.0.0.1:9091"
	}
	if c.ConfigPoll == 0 {
		c.ConfigPoll = 5 * time.Second
	}
	if c.Policy == "" {
		c.Policy = policy.DefaultName
	}
	c.Policy = policy.Canonical(c.Policy)
	if c.TieMargin == 0 {
		c.TieMargin = policy.DefaultTieMargin
	}
	if c.BlockTokens == 0 {
		c.BlockTokens = 64
	}
	if c.BytesPerToken == 0 {
		c.BytesPerToken = 4
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = 5 * time.Second
	}
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = 5 * time.Second
	}
	if c.RTTAlpha == 0 {
		c.RTTAlpha = 0.3
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 3
	}
	if c.FailureThreshold == 0 {
		c.FailureThreshold = 3
	}
	if c.EjectionTime == 0 {
		c.EjectionTime = 30 * time.Second
	}
	if c.MaxEjectionTime == 0 {
		c.MaxEjectionTime = 5 * time.Minute
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 75 * time.Second
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = 10 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 8 << 20
	}
	if c.MaxAnswerBytes == 0 {
		c.MaxAnswerBytes = 1 << 20
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = 8192
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 4096
	}
	if c.FirstByteTimeout == 0 {
		c.FirstByteTimeout = 5 * time.Minute
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = 5 * time.Second
	}
	if c.HeaderTimeout == 0 {
		c.HeaderTimeout = 30 * time.Second
	}
	if c.StreamIdleTimeout == 0 {
		c.StreamIdleTimeout = 60 * time.Second
	}
	if len(c.Params) > 0 {
		params := make(map[string]policy.Values, len(c.Params))
		for name, v := range c.Params {
			params[policy.Canonical(name)] = v
		}
		c.Params = params
	}
	c.Replicas = append([]ReplicaConfig(nil), c.Replicas...)
	for i := range c.Replicas {
		c.Replicas[i] = c.Replicas[i].Defaults()
	}
	c.Discover = append([]discover.Group(nil), c.Discover...)
	for i := range c.Discover {
		c.Discover[i] = c.Discover[i].Defaults()
	}
	return c
}

// Defaults returns r with every zero field set to its default: the id
// from the URL's host, the KV capacity and rates from the profile.
func (r ReplicaConfig) Defaults() ReplicaConfig {
	r.URL = strings.TrimRight(r.URL, "/")
	if r.ID == "" {
		if u, err := url.Parse(r.URL); err == nil {
			r.ID = u.Host
		}
	}
	if r.MetricsPath == "" {
		r.MetricsPath = "/metrics"
	}
	prof := r.Profile
	if prof == "" {
		prof = paperProfile
	}
	if p, err := engine.LookupProfile(prof); err == nil {
		if r.KVCapacityTokens == 0 {
			r.KVCapacityTokens = p.KVCapacityTokens
		}
		if r.PrefillMSPerTok == 0 {
			r.PrefillMSPerTok = p.PrefillMSPerToken()
		}
		if r.QueueMSPerTok == 0 {
			r.QueueMSPerTok = p.QueueMSPerToken()
		}
		if r.ITLMS == 0 {
			r.ITLMS = p.ITLMS()
		}
		if r.ITLSlopeMS == 0 {
			r.ITLSlopeMS = p.ITLSlopeMS()
		}
	}
	return r
}

// Validate reports the first problem of a defaulted replica.
func (r ReplicaConfig) Validate() error {
	u, err := url.Parse(r.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("url %q is not an http(s) URL", r.URL)
	}
	if r.ID == "" || strings.ContainsAny(r.ID, "/?#") || strings.TrimSpace(r.ID) != r.ID {
		return fmt.Errorf("id %q: want a non-empty id without '/', '?', '#' or surrounding spaces", r.ID)
	}
	if r.Profile != "" {
		if _, err := engine.LookupProfile(r.Profile); err != nil {
			return err
		}
	}
	for _, v := range []float64{r.PrefillMSPerTok, r.QueueMSPerTok} {
		if !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("prefill and queue rates must be positive and finite")
		}
	}
	for _, v := range []float64{r.ITLMS, r.ITLSlopeMS} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("itl_ms and itl_slope_ms must be non-negative and finite")
		}
	}
	if r.KVCapacityTokens <= 0 {
		return fmt.Errorf("kv_capacity_tokens must be positive")
	}
	if !strings.HasPrefix(r.MetricsPath, "/") {
		return fmt.Errorf("metrics_path %q must start with /", r.MetricsPath)
	}
	return nil
}

// Validate reports the first problem of a defaulted config; it changes
// nothing.
func (c Config) Validate() error {
	if len(c.Replicas) == 0 && len(c.Discover) == 0 && c.Admin.Listen == AdminOff {
		return fmt.Errorf("config: no replicas, no discover groups and no admin API to add any")
	}
	ids := map[string]bool{}
	for i, r := range c.Replicas {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("config: replica %d (%s): %w", i+1, r.ID, err)
		}
		if ids[r.ID] {
			return fmt.Errorf("config: replica id %q used twice", r.ID)
		}
		ids[r.ID] = true
	}
	names := map[string]bool{}
	for i, g := range c.Discover {
		if err := g.Validate(); err != nil {
			return fmt.Errorf("config: discover group %d: %w", i+1, err)
		}
		if names[g.Name()] {
			return fmt.Errorf("config: discover group %q listed twice", g.Name())
		}
		names[g.Name()] = true
		if g.Profile != "" {
			if _, err := engine.LookupProfile(g.Profile); err != nil {
				return fmt.Errorf("config: discover group %s: %w", g.Name(), err)
			}
		}
	}
	if info, ok := policy.Lookup(c.Policy); !ok {
		return fmt.Errorf("config: unknown policy %q (valid: %s)", c.Policy, strings.Join(policy.LiveNames(), ", "))
	} else if info.SimOnly {
		return fmt.Errorf("config: policy %s runs only in the simulator (valid here: %s)", c.Policy, strings.Join(policy.LiveNames(), ", "))
	}
	if err := c.Admin.validate(); err != nil {
		return err
	}
	if err := c.Auth.validate(); err != nil {
		return err
	}
	if err := c.RateLimit.validate(); err != nil {
		return err
	}
	switch {
	case c.BlockTokens < 1 || c.BytesPerToken < 1:
		return fmt.Errorf("config: block_tokens and bytes_per_token must be at least 1")
	case c.ProbeInterval <= 0 || c.ScrapeInterval <= 0 || c.ConnectTimeout <= 0:
		return fmt.Errorf("config: intervals and timeouts must be positive")
	case !(c.RTTAlpha > 0 && c.RTTAlpha <= 1):
		return fmt.Errorf("config: rtt_alpha must be in (0, 1], got %v", c.RTTAlpha)
	case c.MaxAttempts < 1 || c.FailureThreshold < 1:
		return fmt.Errorf("config: max_attempts and failure_threshold must be at least 1")
	case c.MaxBodyBytes < 1 || c.MaxAnswerBytes < 1:
		return fmt.Errorf("config: max_body_bytes and max_answer_bytes must be positive")
	case c.EjectionTime < 0 || c.MaxEjectionTime < c.EjectionTime:
		return fmt.Errorf("config: ejection_time must be positive and at most max_ejection_time")
	case math.IsNaN(c.TieMargin) || math.IsInf(c.TieMargin, 0):
		return fmt.Errorf("config: tie_margin must be finite")
	}
	if _, err := c.admission(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if m := c.Mesh; m != nil {
		mc := *m
		if mc.Name == "" {
			mc.Name = c.Region
		}
		if mc.URL == "" && mc.Embed != "" {
			mc.URL = "nats://" + mc.Embed // checked only for presence here
		}
		if err := mc.Validate(); err != nil {
			return fmt.Errorf("config: %w", err)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Params)) {
		info, ok := policy.Lookup(name)
		if !ok {
			return fmt.Errorf("config: params: unknown policy %q (policies with parameters: %s)", name, strings.Join(policy.WithParams(), ", "))
		}
		if _, err := info.Resolve(c.Params[name]); err != nil {
			return fmt.Errorf("config: %w", err)
		}
	}
	return nil
}

// admission is the config's admission under a TTFT SLO (zero: off).
func (c *Config) admission() (admit.Config, error) {
	if c.TTFTSLO == 0 {
		if c.Admission != "" || c.AdmissionQueue != 0 {
			return admit.Config{}, fmt.Errorf("admission and admission_queue need ttft_slo (--ttft-slo)")
		}
		return admit.Config{}, nil
	}
	a := admit.Config{SLO: c.TTFTSLO, MaxQueue: c.AdmissionQueue}
	if c.Admission != "" {
		m, err := admit.ParseMode(string(c.Admission))
		if err != nil {
			return a, err
		}
		a.Mode = m
	}
	return a, a.Validate()
}
