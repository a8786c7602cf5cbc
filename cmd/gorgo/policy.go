package main

import (
	"flag"
	"fmt"
	"math"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/sim"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// defaultPolicies are what sim compares when --policy is not given.
var defaultPolicies = []string{"gorgo", "gorgo-ms", policy.DefaultName, "simple-session-affinity", "session-affinity", "least-request", "least-load", "prefix-cache", "round-robin", "power-of-two", "clairvoyant"}

// policyFlags configure the policies and the router's signals.
type policyFlags struct {
	weights, msWeights string
	e2eWeights         string
	tieMargin          float64
	probe, scrape      time.Duration
	alpha              float64
	rates              string
	hideMaxTokens      bool
}

func (p *policyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.weights, "weights", policy.PaperWeights.String(), "gorgo's weights, `rtt=X,queue=Y` or a JSON file {\"rtt\":X,\"queue\":Y}")
	fs.StringVar(&p.msWeights, "ms-weights", "rtt=1,queue=1", "gorgo-ms's weights, `rtt=X,queue=Y` or a JSON file")
	fs.StringVar(&p.e2eWeights, "e2e-weights", policy.DefaultE2EWeights.String(), "gorgo-e2e's (the default policy's) weights, `rtt=X,queue=Y,decode=Z` or a JSON file")
	fs.Float64Var(&p.tieMargin, "tie-margin", policy.DefaultTieMargin, "relative cost margin within which gorgo and gorgo-ms draw among tied replicas (negative: exact ties only)")
	fs.DurationVar(&p.probe, "probe-interval", sim.DefaultInterval, "period of the router's round-trip probes")
	fs.DurationVar(&p.scrape, "scrape-interval", sim.DefaultInterval, "period of the router's engine metrics scrapes")
	fs.Float64Var(&p.alpha, "rtt-alpha", 0.3, "EWMA weight of a new round-trip probe")
	fs.BoolVar(&p.hideMaxTokens, "hide-max-tokens", false, "keep requests' output lengths from the router (by default it sees them as max_tokens, as live, where the replayer asks for exactly the trace's output)")
	fs.StringVar(&p.rates, "ms-rates", "profile", "gorgo-ms's per-replica rates: profile (from each replica's engine profile), online (learned from observed TTFT, starting from the profile) or blind (learned, starting from the paper engine's for every replica)")
}

func (p *policyFlags) options() (policy.Options, error) {
	// A weight not given keeps its default.
	w, err := policy.ParseWeights(p.weights, policy.PaperWeights)
	if err != nil {
		return policy.Options{}, fmt.Errorf("--weights: %w", err)
	}
	mw, err := policy.ParseWeights(p.msWeights, policy.Weights{RTT: 1, Queue: 1})
	if err != nil {
		return policy.Options{}, fmt.Errorf("--ms-weights: %w", err)
	}
	ew, err := policy.ParseWeights(p.e2eWeights, policy.DefaultE2EWeights)
	if err != nil {
		return policy.Options{}, fmt.Errorf("--e2e-weights: %w", err)
	}
	if math.IsNaN(p.tieMargin) || math.IsInf(p.tieMargin, 0) {
		return policy.Options{}, fmt.Errorf("--tie-margin must be a finite number, got %v", p.tieMargin)
	}
	return policy.Options{Weights: w, MSWeights: mw, E2EWeights: ew}, nil
}

// router sets the simulated router's signals and tie margin in c.
func (p *policyFlags) router(c sim.Config) sim.Config {
	c.Signals = sim.Signals{ProbeInterval: p.probe, ScrapeInterval: p.scrape, RTTAlpha: p.alpha, OnlineRates: p.rates != "profile", BlindPrior: p.rates == "blind"}
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

// policies builds one fresh instance of each listed policy; gorgo-online
// is configured by tf.
func (p *policyFlags) policies(list string, tf *tuneFlags, seed uint64) ([]policy.Policy, error) {
	names := splitList(list)
	if len(names) == 0 {
		return nil, fmt.Errorf("--policy: no policy given (valid: %s)", joinNames(policyNames()))
	}
	if p.rates != "profile" && p.rates != "online" && p.rates != "blind" {
		return nil, fmt.Errorf("--ms-rates: want profile, online or blind, got %q", p.rates)
	}
	if p.probe <= 0 || p.scrape <= 0 {
		return nil, fmt.Errorf("--probe-interval and --scrape-interval must be positive")
	}
	if !(p.alpha > 0 && p.alpha <= 1) {
		return nil, fmt.Errorf("--rtt-alpha must be in (0, 1], got %v", p.alpha)
	}
	opts, err := p.options()
	if err != nil {
		return nil, err
	}
	pols := make([]policy.Policy, len(names))
	for i, n := range names {
		if n == tune.OnlineName {
			if pols[i], err = tf.online(seed, opts); err != nil {
				return nil, err
			}
			continue
		}
		if pols[i], err = policy.New(n, opts); err != nil {
			return nil, fmt.Errorf("--policy: unknown policy %q (valid: %s; default is %s)", n, joinNames(policyNames()), policy.DefaultName)
		}
	}
	return pols, nil
}
