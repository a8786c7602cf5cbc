package main

import (
	"flag"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/sim"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// policyFlags configure the policies and the router's signals.
type policyFlags struct {
	// params holds each policy's --KEY flag (from its registered config
	// key: --weights for gorgo, --ms-weights, --e2e-weights), by policy.
	params        map[string]*string
	tieMargin     float64
	probe, scrape time.Duration
	alpha         float64
	rates         string
	hideMaxTokens bool
	outputs       string
}

// paramFlag is the flag of a policy's parameters: its config key, dashed.
func paramFlag(i policy.Info) string { return strings.ReplaceAll(i.ConfigKey, "_", "-") }

func (p *policyFlags) register(fs *flag.FlagSet) {
	p.params = map[string]*string{}
	for _, name := range policy.WithParams() {
		i, _ := policy.Lookup(name)
		if i.ConfigKey == "" {
			continue
		}
		p.params[name] = fs.String(paramFlag(i), i.Format(i.Defaults()), fmt.Sprintf("%s's weights, `%s` or a JSON file {\"%s\":X,...}", name, i.Example(), i.Params[0].Name))
	}
	fs.Float64Var(&p.tieMargin, "tie-margin", policy.DefaultTieMargin, "relative cost margin within which gorgo and gorgo-ms draw among tied replicas (negative: exact ties only)")
	fs.DurationVar(&p.probe, "probe-interval", sim.DefaultInterval, "period of the router's round-trip probes")
	fs.DurationVar(&p.scrape, "scrape-interval", sim.DefaultInterval, "period of the router's engine metrics scrapes")
	fs.Float64Var(&p.alpha, "rtt-alpha", 0.3, "EWMA weight of a new round-trip probe")
	fs.BoolVar(&p.hideMaxTokens, "hide-max-tokens", false, "keep requests' output lengths from the router (by default it sees them as max_tokens, as live, where the replayer asks for exactly the trace's output)")
	fs.StringVar(&p.outputs, "output-estimate", "keyed", "how the router expects an answer's length: keyed (the mean of all answers, moved toward those of its prompt's opening and of its conversation) or global (the mean of all)")
	fs.StringVar(&p.rates, "ms-rates", "profile", "gorgo-ms's per-replica rates: profile (from each replica's engine profile), online (learned from observed TTFT, starting from the profile) or blind (learned, starting from the paper engine's for every replica)")
}

// paramsOf returns the named policy's parameters as its flag gives them
// (nil for a policy without parameters).
func (p *policyFlags) paramsOf(name string) (policy.Values, error) {
	i, ok := policy.Lookup(name)
	if !ok || len(i.Params) == 0 {
		return nil, nil
	}
	f := p.params[i.Name]
	if f == nil {
		return i.Defaults(), nil
	}
	v, err := i.Parse(*f, i.Defaults()) // a weight not given keeps its default
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", paramFlag(i), err)
	}
	return v, nil
}

// describeParams lists every policy's parameters as the flags set them,
// in the default comparison's order.
func (p *policyFlags) describeParams() (string, error) {
	var out []string
	for _, name := range policy.Compared() {
		if p.params[name] == nil {
			continue
		}
		v, err := p.paramsOf(name)
		if err != nil {
			return "", err
		}
		i, _ := policy.Lookup(name)
		out = append(out, fmt.Sprintf("%s weights: %s", name, i.Format(v)))
	}
	return strings.Join(out, "; "), nil
}

func (p *policyFlags) check() error {
	for _, name := range policy.WithParams() {
		if _, err := p.paramsOf(name); err != nil {
			return err
		}
	}
	if p.outputs != "keyed" && p.outputs != "global" {
		return fmt.Errorf("--output-estimate must be keyed or global, got %q", p.outputs)
	}
	if math.IsNaN(p.tieMargin) || math.IsInf(p.tieMargin, 0) {
		return fmt.Errorf("--tie-margin must be a finite number, got %v", p.tieMargin)
	}
	return nil
}

// router sets the simulated router's signals and tie margin in c.
func (p *policyFlags) router(c sim.Config) sim.Config {
	c.Signals = sim.Signals{ProbeInterval: p.probe, ScrapeInterval: p.scrape, RTTAlpha: p.alpha, OnlineRates: p.rates != "profile", BlindPrior: p.rates == "blind", GlobalOutput: p.outputs == "global"}
	c.TieMargin = p.tieMargin
	c.HideMaxTokens = p.hideMaxTokens
	if c.TieMargin == 0 {
		c.TieMargin = -1 // the flag's 0 means exact ties
	}
	return c
}

// policyNames are the policies sim, tune and eval know: every registered
// one (the simulator's clairvoyant and the online tuner register
// themselves).
func policyNames() []string { return policy.Names() }

// policies builds one fresh instance of each listed policy, with its
// parameters from its flag; gorgo-online is configured by tf.
func (p *policyFlags) policies(list string, tf *tuneFlags, seed uint64) ([]policy.Policy, error) {
	names := splitList(list)
	if len(names) == 0 {
		return nil, fmt.Errorf("--policy: no policy given (valid: %s)", joinNames(policyNames()))
	}
	if p.rates != "profile" && p.rates != "online" && p.rates != "blind" {
		return nil, fmt.Errorf("--ms-rates: want profile, online or blind, got %q", p.rates)
	}
	if p.probe < sim.MinInterval || p.scrape < sim.MinInterval {
		return nil, fmt.Errorf("--probe-interval and --scrape-interval must be at least %v", sim.MinInterval)
	}
	if !(p.alpha > 0 && p.alpha <= 1) {
		return nil, fmt.Errorf("--rtt-alpha must be in (0, 1], got %v", p.alpha)
	}
	if err := p.check(); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, n := range names {
		// One run per policy: a second ran again and wrote over the
		// first's records (an alias is its policy: default is gorgo-e2e).
		c := policy.Canonical(n)
		if seen[c] {
			return nil, fmt.Errorf("--policy: %s named twice", c)
		}
		seen[c] = true
	}
	pols := make([]policy.Policy, len(names))
	for i, n := range names {
		var err error
		if n == tune.OnlineName {
			if pols[i], err = tf.online(seed, p); err != nil {
				return nil, err
			}
			continue
		}
		if _, ok := policy.Lookup(n); !ok {
			return nil, fmt.Errorf("--policy: unknown policy %q (valid: %s; default is %s)", n, joinNames(policyNames()), policy.DefaultName)
		}
		params, _ := p.paramsOf(n) // checked
		if pols[i], err = policy.New(n, policy.Options{Params: params}); err != nil {
			return nil, fmt.Errorf("--policy: %w", err)
		}
	}
	return pols, nil
}
