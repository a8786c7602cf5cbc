// Package tenant is what a router knows of the teams that share its fleet:
// each tenant's weight in fair shares, the priority its requests get and
// the highest they may ask for, the TTFT and TPOT SLOs they may ask for,
// and its budgets (requests and tokens per minute, as OpenAI's API and LLM
// gateways give them, with the x-ratelimit-* headers). A request's tenant
// is named by the front end (its API key's name, or a trusted gateway's
// header); a name the config does not give is the default tenant's.
//
// Budgets read no clock: times are arguments, as in the router.
package tenant

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admit"
)

// Default is the tenant of requests whose tenant the config does not name.
const Default = "default"

// Other is the metrics label of tenants beyond MaxLabelled.
const Other = "other"

// MaxTenants bounds the tenants a config may give.
const MaxTenants = 256

// Config is one tenant's, as the config file's tenants: gives it.
type Config struct {
	// Weight is its weight in fair shares within a priority band (default
	// 1).
	Weight float64 `yaml:"weight" json:"weight"`
	// Priority is what its requests get (default standard); MaxPriority
	// the highest a request may ask for with x-gorgo-priority (default
	// Priority). Names (interactive, standard, batch, sheddable) or
	// integers; asking for less is always allowed.
	Priority    string `yaml:"priority" json:"priority"`
	MaxPriority string `yaml:"max_priority" json:"max_priority"`
	// TTFTSLO is its requests' TTFT SLO (default the router's ttft_slo);
	// MinTTFTSLO the tightest a request may ask for with
	// x-gorgo-ttft-slo-ms (default TTFTSLO), MaxTTFTSLO the loosest
	// (default 10 minutes: how long a request may wait in the queue).
	TTFTSLO    time.Duration `yaml:"ttft_slo" json:"ttft_slo"`
	MinTTFTSLO time.Duration `yaml:"min_ttft_slo" json:"min_ttft_slo"`
	MaxTTFTSLO time.Duration `yaml:"max_ttft_slo" json:"max_ttft_slo"`
	// MinTPOTSLO is the tightest time per output token a request may ask
	// for with x-gorgo-tpot-slo-ms (default 5 ms: no engine decodes a
	// token much faster; tighter asks would only skew what the tuner
	// minimises where requests have SLOs).
	MinTPOTSLO time.Duration `yaml:"min_tpot_slo" json:"min_tpot_slo"`
	// RequestsPerMinute and TokensPerMinute are its budgets (0: none):
	// prompt and completion tokens, the prompt estimated and the answer
	// expected charged when a request arrives, and the count corrected
	// from its usage when it ends.
	RequestsPerMinute int `yaml:"requests_per_minute" json:"requests_per_minute"`
	TokensPerMinute   int `yaml:"tokens_per_minute" json:"tokens_per_minute"`
	// EngineOperations lets its clients send the engines' own operations
	// (a flush, an abort of all, a pause, new weights, a sleep, an
	// adapter's load: every replica's) where the router refuses them to
	// clients (engine_operations: refuse, the default with tenants): a
	// trainer's tenant on a fleet it shares.
	EngineOperations bool `yaml:"engine_operations" json:"engine_operations"`
}

// defaultMinTPOTSLO is the tightest TPOT SLO a request may ask for unless
// its tenant says otherwise.
const defaultMinTPOTSLO = 5 * time.Millisecond

// defaultMaxTTFTSLO is the loosest TTFT SLO a request may ask for unless
// its tenant says.
const defaultMaxTTFTSLO = 10 * time.Minute

// Tenant is a tenant as the router holds it.
type Tenant struct {
	Name string
	Config
	prio, maxPrio int
	slo           time.Duration // TTFTSLO, or the router's
	reqs, tokens  *bucket       // nil without a budget
	// share hears of every charge made here (Set.Share; nil: none).
	share func(tenant string, requests, tokens float64)
}

// Set is a router's tenants. It is safe for concurrent use.
type Set struct {
	by map[string]*Tenant
}

// New checks the tenants' configs and returns them; fleetSLO is the
// router's ttft_slo. A config without a default tenant gets one of the
// defaults.
func New(cfgs map[string]Config, fleetSLO time.Duration) (*Set, error) {
	if len(cfgs) > MaxTenants {
		return nil, fmt.Errorf("tenants: %d, more than %d", len(cfgs), MaxTenants)
	}
	s := &Set{by: make(map[string]*Tenant, len(cfgs)+1)}
	for name, c := range cfgs {
		t, err := newTenant(name, c, fleetSLO)
		if err != nil {
			return nil, err
		}
		s.by[name] = t
	}
	if s.by[Default] == nil {
		s.by[Default], _ = newTenant(Default, Config{}, fleetSLO)
	}
	return s, nil
}

// MaxName bounds a tenant's name.
const MaxName = 64

// CheckName says why name cannot be a tenant's: empty, longer than
// MaxName, or holding white space, a comma or a colon (the separators of
// a mix of tenants, see trace.ParseTenants).
func CheckName(name string) error {
	if name == "" || len(name) > MaxName || strings.ContainsAny(name, " \t\r\n,:") {
		return fmt.Errorf("%q is not a tenant name (1 to %d bytes, no spaces, commas or colons)", name, MaxName)
	}
	if name == Other {
		return fmt.Errorf("%q is not a tenant name: the metrics label the tenants not named so", name)
	}
	return nil
}

// HeaderRule is what a front end does with a client's X-Gorgo-Tenant:
// "refuse" it (the default, ""), "ignore" it, or "trust" it (the front
// end sits behind a gateway that sets it).
type HeaderRule string

// The header rules.
const (
	HeaderRefuse HeaderRule = "refuse"
	HeaderIgnore HeaderRule = "ignore"
	HeaderTrust  HeaderRule = "trust"
)

// Check says why the rule is not one of the rules.
func (h HeaderRule) Check() error {
	switch h {
	case "", HeaderRefuse, HeaderIgnore, HeaderTrust:
		return nil
	}
	return fmt.Errorf("tenant_header must be refuse, ignore or trust, got %q", string(h))
}

// Name is a request's tenant by the rule: header (its X-Gorgo-Tenant,
// "" if none) where the rule trusts it, else key (its API key's name, ""
// if none). A header the rule refuses is an error, for a 400.
func (h HeaderRule) Name(key, header string) (string, error) {
	switch {
	case header == "":
		return key, nil
	case h == HeaderTrust:
		return header, nil
	case h == HeaderIgnore:
		return key, nil
	}
	return "", fmt.Errorf("%s: clients here may not name their tenant (their API key does)", TenantHeader)
}

func newTenant(name string, c Config, fleetSLO time.Duration) (*Tenant, error) {
	if err := CheckName(name); err != nil {
		return nil, fmt.Errorf("tenants: %w", err)
	}
	errf := func(format string, args ...any) error {
		return fmt.Errorf("tenants: %s: "+format, append([]any{name}, args...)...)
	}
	t := &Tenant{Name: name, Config: c}
	if t.Weight == 0 {
		t.Weight = 1
	}
	if !(t.Weight >= admit.MinWeight) || math.IsInf(t.Weight, 0) {
		return nil, errf("weight must be a finite number of at least %v, got %v", admit.MinWeight, c.Weight)
	}
	var err error
	t.prio = admit.Standard
	if c.Priority != "" {
		if t.prio, err = admit.ParsePriority(c.Priority); err != nil {
			return nil, errf("priority: %v", err)
		}
	}
	t.maxPrio = t.prio
	if c.MaxPriority != "" {
		if t.maxPrio, err = admit.ParsePriority(c.MaxPriority); err != nil {
			return nil, errf("max_priority: %v", err)
		}
		if t.maxPrio < t.prio {
			return nil, errf("max_priority %s is below its priority %s", c.MaxPriority, c.Priority)
		}
	}
	if c.TTFTSLO < 0 || c.MinTTFTSLO < 0 || c.MaxTTFTSLO < 0 || c.MinTPOTSLO < 0 || c.RequestsPerMinute < 0 || c.TokensPerMinute < 0 {
		return nil, errf("SLOs and budgets must not be negative")
	}
	t.slo = c.TTFTSLO
	if t.slo == 0 {
		t.slo = fleetSLO
	}
	if t.MaxTTFTSLO == 0 {
		t.MaxTTFTSLO = max(defaultMaxTTFTSLO, t.slo)
	}
	if t.MinTTFTSLO == 0 {
		// A tenant given no SLO (and a router with none) may not ask for
		// one tighter than the loosest: a header never upgrades a tenant,
		// as MaxPriority defaults to Priority.
		t.MinTTFTSLO = t.slo
		if t.slo == 0 {
			t.MinTTFTSLO = t.MaxTTFTSLO
		}
	}
	if t.MinTPOTSLO == 0 {
		t.MinTPOTSLO = defaultMinTPOTSLO
	}
	if t.MinTTFTSLO > t.MaxTTFTSLO || t.slo > 0 && (t.slo < t.MinTTFTSLO || t.slo > t.MaxTTFTSLO) {
		return nil, errf("ttft_slo %v must lie within min_ttft_slo %v and max_ttft_slo %v", t.slo, t.MinTTFTSLO, t.MaxTTFTSLO)
	}
	if n := c.RequestsPerMinute; n > 0 {
		t.reqs = newBucket(n)
	}
	if n := c.TokensPerMinute; n > 0 {
		t.tokens = newBucket(n)
	}
	return t, nil
}

// Lookup returns the named tenant, or the default one for a name the
// config does not give (or "").
func (s *Set) Lookup(name string) *Tenant {
	if t := s.by[name]; t != nil {
		return t
	}
	return s.by[Default]
}

// Operates reports whether tenant name may send the engines' operations
// where the router refuses them to clients (its config's
// engine_operations: true); a nil set has no such tenant.
func (s *Set) Operates(name string) bool {
	if s == nil {
		return false
	}
	t := s.Lookup(name)
	return t != nil && t.EngineOperations
}

// Names returns the tenants' names, sorted.
func (s *Set) Names() []string {
	names := make([]string, 0, len(s.by))
	for n := range s.by {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Weights are the tenants' weights in fair shares (admit.Config.Weights).
func (s *Set) Weights() map[string]float64 {
	w := make(map[string]float64, len(s.by))
	for n, t := range s.by {
		w[n] = t.Weight
	}
	return w
}

// HasSLO reports whether some tenant has a TTFT SLO (flow control is then
// on for its requests).
func (s *Set) HasSLO() bool {
	for _, t := range s.by {
		if t.slo > 0 {
			return true
		}
	}
	return false
}

// Priority is the priority the tenant's requests get unless they ask for
// another (admit's bands).
func (t *Tenant) Priority() int { return t.prio }

// Ask is what a request asks for in its headers (x-gorgo-priority,
// x-gorgo-ttft-slo-ms, x-gorgo-tpot-slo-ms), as sent; empty: nothing.
type Ask struct {
	Priority, TTFTSLO, TPOTSLO string
}

// Headers a request asks with.
const (
	PriorityHeader = "X-Gorgo-Priority"
	TTFTSLOHeader  = "X-Gorgo-Ttft-Slo-Ms"
	TPOTSLOHeader  = "X-Gorgo-Tpot-Slo-Ms"
	// TenantHeader names the tenant, from a gateway the config trusts.
	TenantHeader = "X-Gorgo-Tenant"
)

// Class is what flow control knows of a request of the tenant that asks
// for a: its priority (the tenant's, or what it asks within what the
// tenant may) and TTFT SLO, and its TPOT SLO (0: none). tokens is its
// cost in fair shares. An ask out of bounds is an error for a 400.
func (t *Tenant) Class(a Ask, tokens int) (admit.Class, time.Duration, error) {
	c := admit.Class{Tenant: t.Name, Priority: t.prio, Tokens: tokens, SLO: t.slo}
	if a.Priority != "" {
		p, err := admit.ParsePriority(a.Priority)
		if err != nil {
			return c, 0, fmt.Errorf("%s: %v", PriorityHeader, err)
		}
		if p > t.maxPrio {
			return c, 0, fmt.Errorf("%s: %s is above what tenant %s may ask for (%s)", PriorityHeader, a.Priority, t.Name, admit.PriorityName(t.maxPrio))
		}
		c.Priority = p
	}
	if a.TTFTSLO != "" {
		d, err := millis(TTFTSLOHeader, a.TTFTSLO)
		if err != nil {
			return c, 0, err
		}
		if d < t.MinTTFTSLO || d > t.MaxTTFTSLO {
			return c, 0, fmt.Errorf("%s: %s ms is outside what tenant %s may ask for (%d to %d ms)", TTFTSLOHeader, a.TTFTSLO, t.Name, t.MinTTFTSLO.Milliseconds(), t.MaxTTFTSLO.Milliseconds())
		}
		c.SLO = d
	}
	var tpot time.Duration
	if a.TPOTSLO != "" {
		d, err := millis(TPOTSLOHeader, a.TPOTSLO)
		if err != nil {
			return c, 0, err
		}
		if d < t.MinTPOTSLO {
			return c, 0, fmt.Errorf("%s: %s ms is tighter than tenant %s may ask for (at least %d ms)", TPOTSLOHeader, a.TPOTSLO, t.Name, t.MinTPOTSLO.Milliseconds())
		}
		tpot = d
	}
	return c, tpot, nil
}

// millis reads a header's positive number of milliseconds.
func millis(header, v string) (time.Duration, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || !(f > 0) || f > float64(math.MaxInt64/int64(time.Millisecond)) {
		return 0, fmt.Errorf("%s: %q is not a positive number of milliseconds", header, v)
	}
	return time.Duration(f * float64(time.Millisecond)), nil
}
