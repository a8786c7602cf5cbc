// Package policytest holds a policy for tests only (nothing but tests
// imports it): test-gain, whose whole definition, its tunable parameter
// included, is this one file. It is the proof that a weighted policy needs
// nothing outside its own file: the config file, the tuner and the admin
// API find its parameter through the registry.
package policytest

import (
	"math"
	"math/rand/v2"
	"sync/atomic"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// Name is the test policy's registered name.
const Name = "test-gain"

func init() {
	policy.Register(policy.Info{Name: Name, New: newGain, ConfigKey: "gain_params",
		Params: []policy.Param{{Name: "gain", Default: 1, Tune: true, Min: 0.01, Max: 100, Init: 1}}})
}

// gain scores a replica gain·rtt_ms + uncached prompt tokens.
type gain struct{ g atomic.Uint64 }

func newGain(o policy.Options) (policy.Policy, error) {
	p := &gain{}
	return p, p.SetParams(o.Params)
}

func (*gain) Name() string { return Name }

func (p *gain) Decide(d *policy.Decision, req *policy.Request, reps []policy.Replica, _ *rand.Rand) error {
	g := p.gain()
	d.Scores = d.Scores[:0]
	for i := range reps {
		r := &reps[i]
		t := policy.Terms{RTT: g * float64(r.RTT) / 1e6, Prefill: float64(max(req.PromptTokens-r.CachedTokens, 0))}
		t.Total = t.RTT + t.Prefill
		d.Scores = append(d.Scores, t)
	}
	d.Replica = policy.ByScore
	return nil
}

func (p *gain) gain() float64 { return math.Float64frombits(p.g.Load()) }

func (p *gain) Params() policy.Values { return policy.Values{"gain": p.gain()} }

func (p *gain) SetParams(v policy.Values) error {
	info, _ := policy.Lookup(Name)
	v, err := info.Resolve(v)
	if err != nil {
		return err
	}
	p.g.Store(math.Float64bits(v["gain"]))
	return nil
}
