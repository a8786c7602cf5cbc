package main

import (
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/serve"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// tuneFlags configure the evolution strategy of tune and of sim's
// gorgo-online policy.
type tuneFlags struct {
	objective string
	guards    listFlag
	params    listFlag
	base      string
	sigma     float64
	window    int
	hop       int
	block     time.Duration
	burn      time.Duration
	confirm   bool
	earlyStop float64
	// tune is gorgo serve's and gorgo epp's --tune (nil: not given); set
	// names the flags given (liveConfig keeps them).
	tune *bool
	set  map[string]bool
	// asServed is gorgo sim's and gorgo eval's --live-tuner.
	asServed bool
}

// registerSim adds what gorgo sim and gorgo eval take besides:
// --live-tuner, gorgo serve's tuner in one flag.
func (t *tuneFlags) registerSim(fs *flag.FlagSet) {
	t.register(fs)
	fs.BoolVar(&t.asServed, "live-tuner", false, "gorgo-online as gorgo serve runs it: over the default policy (unless --base), in one-minute blocks, 256 requests an arm, steps of 0.3, wins confirmed, early stop at 1.5, the objective slo-p95 where requests have SLOs (--ttft-slo, --goodput-slo) (flags given keep their values)")
}

// defaultToSLOP95 makes the live tuner's objective slo-p95 where requests
// are held to SLOs, unless --objective says otherwise: what an operator who
// sets SLOs asks of the fleet is that requests meet them, and a p95 of raw
// TTFT weighs a tenant with a loose SLO as much as one with a tight one,
// and a time per output token not at all.
func (t *tuneFlags) defaultToSLOP95(has bool) {
	if has && !t.set["objective"] {
		t.objective = string(tune.SLOP95)
	}
}

// runSLO settles what the run's SLO (has: the flag named flag gives one,
// gorgo sim's --ttft-slo or gorgo eval's --goodput-slo) means for the tuner
// and the tenants, the same for both commands: with --live-tuner the
// objective is slo-p95 where requests have SLOs; slo-p95 without any is
// refused (its tuner would never judge a candidate), and so is a tenant's
// own SLO (wl.needSLO).
func (t *tuneFlags) runSLO(wl *workloadFlags, has bool, flag string) error {
	if t.asServed {
		t.defaultToSLOP95(has)
	}
	if t.objective == string(tune.SLOP95) && !has {
		return fmt.Errorf("--objective %s judges requests held to SLOs: give them one with %s", tune.SLOP95, flag)
	}
	return wl.needSLO(has, flag)
}

// parsed finishes the flags once fs is parsed: with --live-tuner, gorgo
// serve's settings for the flags not given.
func (t *tuneFlags) parsed(fs *flag.FlagSet) {
	t.given(fs)
	if t.asServed {
		if !t.set["base"] {
			t.base = policy.DefaultName
		}
		*t = t.live()
	}
}

// registerLive adds what gorgo serve and gorgo epp take besides: --tune.
func (t *tuneFlags) registerLive(fs *flag.FlagSet) {
	t.register(fs)
	fs.Func("tune", "tune the policy's parameters online from the traffic it routes: `true` or false (default the config's tune, else on for the default policy). Its settings are the block, burn, window-requests, sigma, objective, guard and param flags; those not given take the live tuner's values, not the defaults shown: one-minute blocks, 256 requests an arm, sigma 0.3, wins confirmed, early stop at 1.5 (the shown defaults are --policy gorgo-online's)", func(s string) error {
		v, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("want true or false, got %q", s)
		}
		t.tune = &v
		return nil
	})
}

// apply puts --tune, if given, on the config (gorgo serve's and gorgo
// epp's overrides, at start and on every reload).
func (t *tuneFlags) apply(c *serve.Config) {
	if t.tune != nil {
		c.Tune = t.tune
	}
}

// given records which flags were given (call after parsing).
func (t *tuneFlags) given(fs *flag.FlagSet) {
	t.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { t.set[f.Name] = true })
}

// The live tuner's settings where no flag gives them: arms alternate in
// one-minute blocks, the second half of each scored, 256 requests per arm
// a judgement, steps of 0.3 in log space, a winning candidate must win
// twice, and one already 1.5 times worse than the incumbent on a quarter
// of its window is dropped then (docs/results.md, part 10). The
// simulator's gorgo-online keeps the paper's hops of 32 requests, judged
// once on full windows, unless told otherwise (--live-tuner: these).
const (
	liveBlock     = time.Minute
	liveWindow    = 256
	liveSigma     = 0.3
	liveEarlyStop = 1.5
)

// liveConfig is the online tuner gorgo serve runs over base: the flags
// given, and the live settings for those not, starting from the config's
// values of the base's parameters (params); slos says whether requests are
// held to SLOs (see defaultToSLOP95).
func (t *tuneFlags) liveConfig(base string, seed uint64, params policy.Values, slos bool) (tune.OnlineConfig, error) {
	l := t.live()
	l.base = base
	l.defaultToSLOP95(slos)
	es, err := l.config(seed)
	if err != nil {
		return tune.OnlineConfig{}, err
	}
	return tune.OnlineConfig{ES: es, Base: base, Window: l.window, Hop: l.hop, Block: l.block, Burn: l.burn, Confirm: l.confirm, EarlyStop: l.earlyStop,
		BaseParams: params, StartFromBase: len(t.params) == 0}, nil
}

// live returns the flags with the live settings for those not given.
func (t *tuneFlags) live() tuneFlags {
	l := *t
	if !t.set["block"] {
		l.block = liveBlock
	}
	if !t.set["window-requests"] {
		l.window = liveWindow
	}
	if !t.set["sigma"] {
		l.sigma = liveSigma
	}
	if !t.set["confirm"] {
		l.confirm = true
	}
	if !t.set["early-stop"] {
		l.earlyStop = liveEarlyStop
	}
	return l
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func (t *tuneFlags) register(fs *flag.FlagSet) {
	var objs []string
	for _, o := range tune.Objectives() {
		objs = append(objs, string(o))
	}
	fs.StringVar(&t.objective, "objective", string(tune.P95TTFT), "metric the tuner minimises: "+joinNames(objs)+" (slo-p95: the p95 of each request's TTFT over its TTFT SLO, or time per output token over its TPOT SLO, whichever is nearer missing; online, over requests with SLOs; the live tuner's default where they have them. The TTFT objectives learn from streams alone; p95-e2e and p95-e2e-per-token, each request's E2E over its answer's tokens, from whole answers too: the latter for a fleet whose clients do not stream)")
	fs.Var(&t.guards, "guard", "reject a candidate whose `METRIC=RATIO` exceeds RATIO times the incumbent's: e2e-p95=1.05 or itl-mean=1.1 (repeatable; default e2e-p95=1.05; \"none\" for no guard)")
	fs.Var(&t.params, "param", "tuned parameter as `NAME=MIN:MAX:INIT`, NAME one of the base policy's (repeatable; default those it marks for tuning: "+tunedDefaults()+")")
	fs.StringVar(&t.base, "base", "gorgo", "policy whose parameters are tuned: "+joinNames(policy.WithParams()))
	fs.Float64Var(&t.sigma, "sigma", 0.5, "initial step size in log space")
	fs.IntVar(&t.window, "window-requests", 128, "online: requests each arm is scored on")
	fs.IntVar(&t.hop, "hop", 32, "online: consecutive requests one arm routes before the other (without --block)")
	fs.DurationVar(&t.block, "block", 0, "online: the arms alternate in blocks of this much time instead of every --hop requests (0: by requests)")
	fs.BoolVar(&t.confirm, "confirm", false, "online: a candidate that wins its round must win a second one, measured afresh, to be accepted")
	fs.Float64Var(&t.earlyStop, "early-stop", 0, "online: drop a candidate before its window is full once, with a quarter of a window on each arm, its objective or a guarded metric is more than `F` times the incumbent's (0: judge every candidate on a full window)")
	fs.DurationVar(&t.burn, "burn", 0, "online, with --block: the start of each block whose requests are routed but not scored (default half the block)")
}

// config builds the strategy's configuration.
func (t *tuneFlags) config(seed uint64) (tune.Config, error) {
	cfg := tune.Config{Objective: tune.Objective(t.objective), Seed: seed, Sigma: t.sigma}
	switch {
	case len(t.guards) == 0:
		cfg.Guards = []tune.Guard{{Metric: "e2e-p95", MaxRatio: 1.05}}
	case len(t.guards) == 1 && t.guards[0] == "none":
	default:
		for _, s := range t.guards {
			g, err := tune.ParseGuard(s)
			if err != nil {
				return cfg, fmt.Errorf("--guard: %w", err)
			}
			cfg.Guards = append(cfg.Guards, g)
		}
	}
	for _, s := range t.params {
		p, err := parseParam(s)
		if err != nil {
			return cfg, fmt.Errorf("--param: %w", err)
		}
		cfg.Params = append(cfg.Params, p)
	}
	if len(cfg.Params) == 0 {
		cfg.Params = tune.DefaultParams(t.base)
	}
	if t.sigma <= 0 || math.IsNaN(t.sigma) {
		return cfg, fmt.Errorf("--sigma must be positive")
	}
	if t.window < 1 || t.hop < 1 {
		// 0 would mean the tuner's own default, not the live one.
		return cfg, fmt.Errorf("--window-requests and --hop must be at least 1, got %d and %d", t.window, t.hop)
	}
	if t.earlyStop != 0 && !(t.earlyStop > 1 && !math.IsInf(t.earlyStop, 0)) {
		return cfg, fmt.Errorf("--early-stop must be 0 (off) or a finite ratio above 1, got %v", t.earlyStop)
	}
	cfg.SigmaMax = max(1, t.sigma)
	cfg.SigmaMin = min(0.02, t.sigma)
	return cfg, nil
}

// online builds a gorgo-online policy; its base's untuned parameters come
// from the base's flag (pf; nil: its defaults).
func (t *tuneFlags) online(seed uint64, pf *policyFlags) (*tune.Online, error) {
	cfg, err := t.config(seed)
	if err != nil {
		return nil, err
	}
	var base policy.Values
	if pf != nil {
		if base, err = pf.paramsOf(t.base); err != nil {
			return nil, err
		}
	}
	// As gorgo serve's (--live-tuner): from the weights given.
	return t.onlineWith(cfg, base, t.asServed && len(t.params) == 0)
}

// onlineWith builds a gorgo-online policy over the base's given values,
// its tuned parameters starting from them if fromBase
// (tune.OnlineConfig.StartFromBase).
func (t *tuneFlags) onlineWith(cfg tune.Config, base policy.Values, fromBase bool) (*tune.Online, error) {
	return tune.NewOnline(tune.OnlineConfig{ES: cfg, Base: t.base, Window: t.window, Hop: t.hop, Block: t.block, Burn: t.burn, Confirm: t.confirm, EarlyStop: t.earlyStop,
		BaseParams: base, StartFromBase: fromBase})
}

// tunedDefaults describes what each policy with parameters tunes by
// default.
func tunedDefaults() string {
	var out []string
	for _, name := range policy.WithParams() {
		var ps []string
		for _, p := range tune.DefaultParams(name) {
			ps = append(ps, fmt.Sprintf("%s=%g:%g:%g", p.Name, p.Min, p.Max, p.Init))
		}
		out = append(out, name+" "+strings.Join(ps, " "))
	}
	return strings.Join(out, "; ")
}

func parseParam(s string) (tune.Param, error) {
	name, rest, ok := strings.Cut(s, "=")
	parts := strings.Split(rest, ":")
	if !ok || len(parts) != 3 {
		return tune.Param{}, fmt.Errorf("bad parameter %q: want NAME=MIN:MAX:INIT", s)
	}
	var v [3]float64
	for i, p := range parts {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil {
			return tune.Param{}, fmt.Errorf("bad parameter %q: %w", s, err)
		}
		v[i] = f
	}
	return tune.Param{Name: name, Min: v[0], Max: v[1], Init: v[2]}, nil
}
