package fleet

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/discover"
	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/mesh"
	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/tenant"
	"github.com/gorgo-llm/gorgo/internal/yamlfile"
)

// Config is the fleet's part of gorgo serve's (and gorgo epp's) config
// file: its replicas and where more come from, the policy and its
// parameters, the signals, health, admission and the mesh. Zero fields take
// the defaults Defaults fills in.
type Config struct {
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
	// the default policy's).
	Params map[string]policy.Values `yaml:"params"`
	// Tune runs the online tuner over the policy's parameters (gorgo serve
	// and gorgo epp): on by default for the default policy, off for the
	// others; false turns it off. The tuner starts from the parameters
	// above.
	Tune *bool `yaml:"tune"`
	// TieMargin is the scoring policies' relative tie margin (default 0.01).
	TieMargin float64 `yaml:"tie_margin"`
	// BlockTokens is the prefix index's block size in estimated tokens
	// (default 64); BytesPerToken the token estimator's (default 4, as the
	// emulator's); ImageTokens the prompt tokens an image of a chat stands
	// for (default 1,024, prompt.DefaultImageTokens; the served model's
	// vision encoder's: 256 for Gemma 3, 576 for LLaVA 1.5, about 1,300
	// for a megapixel on Qwen2.5-VL); AudioTokensPerSecond those a second
	// of audio stands for (default 25, Qwen2-Audio's; 12.5 for Voxtral,
	// 6.25 for Ultravox, rounded up); VideoTokens those a video stands
	// for (default 4,096).
	BlockTokens          int `yaml:"block_tokens"`
	BytesPerToken        int `yaml:"bytes_per_token"`
	ImageTokens          int `yaml:"image_tokens"`
	AudioTokensPerSecond int `yaml:"audio_tokens_per_second"`
	VideoTokens          int `yaml:"video_tokens"`
	// ProbeInterval is the period of round-trip probes (GET /health,
	// default 5 s); ScrapeInterval of /metrics scrapes (default 5 s); both
	// the paper used 30 s.
	ProbeInterval  time.Duration `yaml:"probe_interval"`
	ScrapeInterval time.Duration `yaml:"scrape_interval"`
	// RTTAlpha smooths the probes (default 0.3).
	RTTAlpha float64 `yaml:"rtt_alpha"`
	// OnlineRates learns gorgo-ms's per-replica rates from observed TTFT.
	OnlineRates bool `yaml:"online_rates"`
	// OutputEstimate is how the router expects an answer's length: keyed
	// (the default: the running mean of all answers, moved toward those of
	// the request's application and conversation where they tell it) or
	// global (the running mean alone).
	OutputEstimate string `yaml:"output_estimate"`
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
	// MaxEjectionPercent (default 50) caps the ejections requests cause,
	// as Envoy's max_ejection_percent: while that share of the replicas
	// (rounded down, at least one) is ejected, failed requests eject no
	// more. Failing probes eject a replica whatever the share.
	FailureThreshold   int           `yaml:"failure_threshold"`
	EjectionTime       time.Duration `yaml:"ejection_time"`
	MaxEjectionTime    time.Duration `yaml:"max_ejection_time"`
	MaxEjectionPercent int           `yaml:"max_ejection_percent"`
	// StallTimeout (default 30 s; negative: off) ejects a replica that
	// passes its health checks and has stopped serving: an attempt has
	// waited this long past twice its forecast first token for its answer
	// to begin, the replica made no progress meanwhile, and its engine's
	// gauges, if scraped, did not move (see Fleet.checkStall).
	// Its waiting attempts are cut and tried elsewhere.
	StallTimeout time.Duration `yaml:"stall_timeout"`
	// ConnectTimeout bounds connecting to a replica (default 5 s).
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// UpstreamTLS is TLS to https replicas.
	UpstreamTLS UpstreamTLSConfig `yaml:"upstream_tls"`
	// Seed fixes the policies' random draws.
	Seed uint64 `yaml:"seed"`
	// TTFTSLO, if set, turns admission on: a request whose best predicted
	// TTFT exceeds it waits in a router-side queue of at most
	// AdmissionQueue requests (default 1024) until it can make it, least
	// predicted TTFT first (Admission: queue, the default), or is refused
	// at once with 429 and Retry-After (Admission: reject). A request that
	// can no longer make it gets the 429 too. Changing them needs a
	// restart.
	TTFTSLO        time.Duration `yaml:"ttft_slo"`
	Admission      admit.Mode    `yaml:"admission"`
	AdmissionQueue int           `yaml:"admission_queue"`
	// SaturationWaiting is when the fleet is saturated for batch and
	// sheddable work (see admit.Config.SaturationWaiting): every replica
	// has more than this many requests waiting for a first token (default
	// 0; -1: only when it would miss its SLO).
	SaturationWaiting int `yaml:"saturation_waiting"`
	// Tenants are the teams sharing the fleet, by name (the API keys'
	// names; see tenant.Config): their weights in fair shares, priorities,
	// SLOs and budgets. Requests of a tenant not given are the "default"
	// tenant's. Changing them needs a restart.
	Tenants map[string]tenant.Config `yaml:"tenants"`
	// Region is where this router runs: the region policies that prefer
	// their own use (skywalker), and the default name on a mesh.
	Region string `yaml:"region"`
	// Mesh, if set, shares this router's requests with the other routers
	// of a mesh, and mirrors theirs, over NATS (see package mesh). Needs a
	// restart to change.
	Mesh *mesh.Config `yaml:"mesh"`
	// Models are the router's own model names: aliases of served names,
	// and canary splits among them (a name, or a map of names to weights:
	// chat: {llama-3.1-70b: 90, llama-3.3-70b: 10}). They change on reload
	// and through the admin API.
	Models map[string]models.Spec `yaml:"models"`
	// AdapterLoadTime is what loading a LoRA adapter is believed to take
	// before one was measured (default 200ms); AdapterLoadTimes gives some
	// adapters their own. The router then learns each adapter's from the
	// first tokens of requests that had to load it. Restart to change.
	AdapterLoadTime  time.Duration            `yaml:"adapter_load_time"`
	AdapterLoadTimes map[string]time.Duration `yaml:"adapter_load_times"`
}

// ReplicaConfig is one upstream engine: a config file's replicas: entry,
// or the admin API's POST /admin/replicas body (the same names).
type ReplicaConfig struct {
	// ID names the replica (default the URL's host).
	ID string `yaml:"id" json:"id,omitempty"`
	// URL is the engine's base URL; /v1/..., /health and /metrics are
	// appended.
	URL    string `yaml:"url" json:"url,omitempty"`
	Region string `yaml:"region" json:"region,omitempty"`
	// Profile, if set, names the engine profile the replica runs: it gives
	// the KV capacity, the prefill and queue rates and the priors of the
	// ITL model unless set here.
	Profile          string  `yaml:"profile" json:"profile,omitempty"`
	KVCapacityTokens int     `yaml:"kv_capacity_tokens" json:"kv_capacity_tokens,omitempty"`
	PrefillMSPerTok  float64 `yaml:"prefill_ms_per_token" json:"prefill_ms_per_token,omitempty"`
	QueueMSPerTok    float64 `yaml:"queue_ms_per_token" json:"queue_ms_per_token,omitempty"`
	// ITLMS and ITLSlopeMS are the priors of the replica's inter-token
	// latency model (ms, and ms per request in flight); the router learns
	// both from the streams it relays.
	ITLMS      float64 `yaml:"itl_ms" json:"itl_ms,omitempty"`
	ITLSlopeMS float64 `yaml:"itl_slope_ms" json:"itl_slope_ms,omitempty"`
	// MetricsPath is where the engine serves Prometheus metrics (default
	// /metrics).
	MetricsPath string `yaml:"metrics_path" json:"metrics_path,omitempty"`
	// APIKeyEnv names the environment variable holding the replica's API
	// key, which a front end sends it (auth.upstream: replica).
	APIKeyEnv string `yaml:"api_key_env" json:"api_key_env,omitempty"`
	// Models are the names the replica's base model is served under and
	// Adapters the LoRA adapters on it: given, they are what it serves
	// and its GET /v1/models is not read; else that list is read with
	// every probe (a replica whose list cannot be read is taken to serve
	// any model).
	Models   []string `yaml:"models" json:"models,omitempty"`
	Adapters []string `yaml:"adapters" json:"adapters,omitempty"`
	// MaxLoRAs is the replica's adapter slots when its engine does not
	// report them (vLLM's max_lora, SGLang's lora_pool_slots_total).
	MaxLoRAs int `yaml:"max_loras" json:"max_loras,omitempty"`
}

// Equal reports whether two replica configs are the same.
func (r ReplicaConfig) Equal(o ReplicaConfig) bool { return reflect.DeepEqual(r, o) }

// served is what the config says the replica serves (nil: it does not
// say).
func (r ReplicaConfig) served() (*models.Set, error) {
	if len(r.Models) == 0 && len(r.Adapters) == 0 {
		return nil, nil
	}
	return models.WithAdapters(r.Models, r.Adapters)
}

// UpstreamTLSConfig is TLS to https:// replicas: the CA that signed their
// certificates (else the system's), and an optional client certificate.
// It is read at start; changing it needs a restart.
type UpstreamTLSConfig struct {
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// paperProfile is the profile replicas without one are priced at.
const paperProfile = "paper"

// Defaults returns c with every zero field set to its default.
func (c Config) Defaults() Config {
	if c.Policy == "" {
		c.Policy = policy.DefaultName
	}
	c.Policy = policy.Canonical(c.Policy)
	if len(c.Params) > 0 {
		params := make(map[string]policy.Values, len(c.Params))
		for name, v := range c.Params {
			params[policy.Canonical(name)] = v
		}
		c.Params = params
	}
	if c.TieMargin == 0 {
		c.TieMargin = policy.DefaultTieMargin
	}
	if c.OutputEstimate == "" {
		c.OutputEstimate = "keyed"
	}
	if c.BlockTokens == 0 {
		c.BlockTokens = 64
	}
	if c.BytesPerToken == 0 {
		c.BytesPerToken = 4
	}
	if c.ImageTokens == 0 {
		c.ImageTokens = prompt.DefaultImageTokens
	}
	if c.AudioTokensPerSecond == 0 {
		c.AudioTokensPerSecond = prompt.DefaultAudioTokensPerSecond
	}
	if c.VideoTokens == 0 {
		c.VideoTokens = prompt.DefaultVideoTokens
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
	if c.MaxEjectionPercent == 0 {
		c.MaxEjectionPercent = 50
	}
	if c.StallTimeout == 0 {
		c.StallTimeout = 30 * time.Second
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = 5 * time.Second
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

// Validate reports the first problem of a defaulted replica, its API key's
// environment variable unset among them.
func (r ReplicaConfig) Validate() error {
	u, err := url.Parse(r.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("url %q is not an http(s) URL", r.URL)
	}
	if strings.HasSuffix(u.Path, "/v1") {
		// An OpenAI client's base URL: the client's /v1/... path is
		// forwarded as it came, after the replica's URL.
		return fmt.Errorf("url %q ends in /v1: give the engine's address without it (requests go to URL/v1/..., probes to URL/health)", r.URL)
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
	if r.MaxLoRAs < 0 {
		return fmt.Errorf("max_loras must not be negative")
	}
	if _, err := r.served(); err != nil {
		return err
	}
	// A replica without its key is refused here, so that a reload naming
	// it is refused whole, as a start is.
	_, err = r.apiKey()
	return err
}

// apiKey reads a replica's API key from its environment variable.
func (r ReplicaConfig) apiKey() (string, error) {
	if r.APIKeyEnv == "" {
		return "", nil
	}
	k := os.Getenv(r.APIKeyEnv)
	if k == "" {
		return "", fmt.Errorf("replica %s: api_key_env: $%s is unset or empty", r.ID, r.APIKeyEnv)
	}
	return k, nil
}

// Validate reports the first problem of a defaulted config; it changes
// nothing.
func (c Config) Validate() error {
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
		if g.MaxLoRAs < 0 {
			return fmt.Errorf("config: discover group %s: max_loras must not be negative", g.Name())
		}
		if _, err := (ReplicaConfig{Models: g.Models, Adapters: g.Adapters}).served(); err != nil {
			return fmt.Errorf("config: discover group %s: %w", g.Name(), err)
		}
	}
	if info, ok := policy.Lookup(c.Policy); !ok {
		return fmt.Errorf("config: unknown policy %q (valid: %s)", c.Policy, strings.Join(policy.LiveNames(), ", "))
	} else if info.SimOnly {
		return fmt.Errorf("config: policy %s runs only in the simulator (valid here: %s)", c.Policy, strings.Join(policy.LiveNames(), ", "))
	} else if c.Tune != nil && *c.Tune && len(info.Params) == 0 && !info.Tuner {
		return fmt.Errorf("config: tune: policy %s has no parameters to tune (these have: %s)", c.Policy, strings.Join(policy.WithParams(), ", "))
	} else if c.Tune != nil && !*c.Tune && info.Tuner {
		return fmt.Errorf("config: tune: false, but policy %s is a tuner: name the policy it tunes for fixed weights", c.Policy)
	}
	switch {
	case c.BlockTokens < 1 || c.BytesPerToken < 1:
		return fmt.Errorf("config: block_tokens and bytes_per_token must be at least 1")
	case c.ImageTokens < 1 || c.ImageTokens > prompt.MaxMediaTokens:
		return fmt.Errorf("config: image_tokens must be from 1 to %d, got %d", prompt.MaxMediaTokens, c.ImageTokens)
	case c.AudioTokensPerSecond < 1 || c.AudioTokensPerSecond > prompt.MaxAudioTokensPerSecond:
		return fmt.Errorf("config: audio_tokens_per_second must be from 1 to %d, got %d", prompt.MaxAudioTokensPerSecond, c.AudioTokensPerSecond)
	case c.VideoTokens < 1 || c.VideoTokens > prompt.MaxMediaTokens:
		return fmt.Errorf("config: video_tokens must be from 1 to %d, got %d", prompt.MaxMediaTokens, c.VideoTokens)
	case c.ProbeInterval <= 0 || c.ScrapeInterval <= 0 || c.ConnectTimeout <= 0:
		return fmt.Errorf("config: intervals and timeouts must be positive")
	case !(c.RTTAlpha > 0 && c.RTTAlpha <= 1):
		return fmt.Errorf("config: rtt_alpha must be in (0, 1], got %v", c.RTTAlpha)
	case c.MaxAttempts < 1 || c.FailureThreshold < 1:
		return fmt.Errorf("config: max_attempts and failure_threshold must be at least 1")
	case c.EjectionTime < 0 || c.MaxEjectionTime < c.EjectionTime:
		return fmt.Errorf("config: ejection_time must be positive and at most max_ejection_time")
	case c.MaxEjectionPercent < 1 || c.MaxEjectionPercent > 100:
		return fmt.Errorf("config: max_ejection_percent must be in [1, 100], got %d", c.MaxEjectionPercent)
	case math.IsNaN(c.TieMargin) || math.IsInf(c.TieMargin, 0):
		return fmt.Errorf("config: tie_margin must be finite")
	case c.OutputEstimate != "keyed" && c.OutputEstimate != "global":
		return fmt.Errorf("config: output_estimate must be keyed or global, got %q", c.OutputEstimate)
	}
	ts, err := c.tenants()
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if _, err := c.admission(ts); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if m := c.Mesh; m != nil {
		mc := *m
		if mc.Name == "" {
			mc.Name = mesh.DefaultName(c.Region)
		}
		if mc.URL == "" && mc.Embed != "" {
			mc.URL = "nats://" + mc.Embed // checked only for presence here
		}
		if err := mc.Validate(); err != nil {
			return fmt.Errorf("config: %w", err)
		}
	}
	if _, err := models.ParseAliases(c.Models); err != nil {
		return fmt.Errorf("config: %w", err) // its errors say "models:"
	}
	if c.AdapterLoadTime < 0 {
		return fmt.Errorf("config: adapter_load_time must not be negative")
	}
	for name, d := range c.AdapterLoadTimes {
		if d < 0 {
			return fmt.Errorf("config: adapter_load_times: %s: must not be negative", name)
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

// HasSLO reports whether requests are held to a TTFT SLO: the fleet's
// ttft_slo, or a tenant's.
func (c Config) HasSLO() bool {
	if c.TTFTSLO > 0 {
		return true
	}
	for _, t := range c.Tenants {
		if t.TTFTSLO > 0 {
			return true
		}
	}
	return false
}

// Tuned reports whether the online tuner runs over the config's policy
// (see Tune).
func (c Config) Tuned() bool {
	if c.Tune != nil {
		return *c.Tune
	}
	return policy.Canonical(c.Policy) == policy.DefaultName || c.Policy == ""
}

// PolicyOptions are the options of a new instance of the named policy
// under this config: its parameters (the defaults of those not given) and
// the router's region.
func (c *Config) PolicyOptions(name string) policy.Options {
	return policy.Options{Params: c.Params[policy.Canonical(name)].Clone(), Region: c.Region}
}

// tenants are the config's tenants (nil without any).
func (c *Config) tenants() (*tenant.Set, error) {
	if len(c.Tenants) == 0 {
		return nil, nil
	}
	return tenant.New(c.Tenants, c.TTFTSLO)
}

// admission is the config's flow control (zero SLO and no tenant's: off).
func (c *Config) admission(ts *tenant.Set) (admit.Config, error) {
	if c.TTFTSLO == 0 && !c.HasSLO() { // a negative SLO goes on, to be refused
		if c.Admission != "" || c.AdmissionQueue != 0 {
			return admit.Config{}, fmt.Errorf("admission and admission_queue need ttft_slo (--ttft-slo)")
		}
		return admit.Config{}, nil
	}
	a := admit.Config{SLO: c.TTFTSLO, MaxQueue: c.AdmissionQueue, SaturationWaiting: c.SaturationWaiting}
	if ts != nil {
		a.Weights = ts.Weights()
	}
	if c.Admission != "" {
		m, err := admit.ParseMode(string(c.Admission))
		if err != nil {
			return a, err
		}
		a.Mode = m
	}
	// Validate fills the defaults into a: call it before a is read for
	// the return (the spec leaves the order of the two unspecified).
	err := a.Validate()
	return a, err
}

// client returns the TLS config of connections to replicas (nil: Go's
// defaults).
func (t UpstreamTLSConfig) client() (*tls.Config, error) {
	if t == (UpstreamTLSConfig{}) {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := yamlfile.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("config: upstream_tls.ca_file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("config: upstream_tls.ca_file %s holds no PEM certificate", t.CAFile)
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("config: upstream_tls: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	case t.CertFile != "" || t.KeyFile != "":
		return nil, errors.New("config: upstream_tls needs both cert_file and key_file for a client certificate")
	}
	return c, nil
}

// Estimator is the token estimator the config gives: its bytes per token
// and what a chat's media stand for.
func (c Config) Estimator() prompt.Estimator {
	return prompt.Estimator{BytesPerToken: c.BytesPerToken, ImageTokens: c.ImageTokens,
		AudioTokensPerSecond: c.AudioTokensPerSecond, VideoTokens: c.VideoTokens}
}
