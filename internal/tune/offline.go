package tune

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
)

// OfflineConfig configures offline tuning, possible only with a simulator:
// every candidate is measured by replaying the whole tuning window from the
// same start state, so comparisons carry no noise.
type OfflineConfig struct {
	ES Config
	// Generations bounds the run (default 40). Each generation measures
	// Workers candidates at once (default 2) and judges them in turn; with
	// one worker the strategy is exactly (1+1). The result depends on
	// Workers (it changes the candidates drawn), never on the machine.
	Generations, Workers int
	// Patience stops the run early once the step size sits at its floor
	// and this many candidates in a row failed (default 12).
	Patience int
}

// EvalFunc measures a point: in the simulator, one replay of the window.
type EvalFunc func(ctx context.Context, p Point) (Metrics, error)

// OfflineResult is what an offline run found.
type OfflineResult struct {
	Best        Point
	BestMetrics Metrics
	// Initial is the incumbent's starting measurement.
	Initial     Metrics
	Steps       []Outcome
	Evaluations int
}

// Offline runs the strategy against eval. step, if set, is called after
// each verdict, in order.
func Offline(ctx context.Context, cfg OfflineConfig, eval EvalFunc, step func(Outcome)) (*OfflineResult, error) {
	if cfg.Generations == 0 {
		cfg.Generations = 40
	}
	if cfg.Workers == 0 {
		cfg.Workers = 2
	}
	if cfg.Patience == 0 {
		cfg.Patience = 12
	}
	if cfg.Generations < 0 || cfg.Workers < 0 || cfg.Patience < 0 {
		return nil, fmt.Errorf("tune: generations, workers and patience must not be negative")
	}
	if cfg.ES.Objective == SLOP95 {
		return nil, fmt.Errorf("tune: %s needs each request's SLOs, which whole runs' metrics do not carry: tune it online", SLOP95)
	}
	es, err := NewES(cfg.ES)
	if err != nil {
		return nil, err
	}
	incM, err := eval(ctx, es.Incumbent())
	if err != nil {
		return nil, fmt.Errorf("measuring the initial weights: %w", err)
	}
	res := &OfflineResult{Initial: incM, Evaluations: 1}
	failures := 0
	for g := 0; g < cfg.Generations && failures < cfg.Patience; g++ {
		cands := make([]Point, cfg.Workers)
		for i := range cands {
			cands[i] = es.Propose()
		}
		ms := make([]Metrics, len(cands))
		grp, gctx := errgroup.WithContext(ctx)
		for i := range cands {
			grp.Go(func() (err error) {
				ms[i], err = eval(gctx, cands[i])
				return err
			})
		}
		if err := grp.Wait(); err != nil {
			return nil, err
		}
		res.Evaluations += len(cands)
		for i := range cands {
			out := es.Judge(cands[i], ms[i], incM)
			if out.Accepted {
				incM = ms[i]
				failures = 0
			} else if es.Sigma() <= es.Config().SigmaMin {
				failures++
			}
			res.Steps = append(res.Steps, out)
			if step != nil {
				step(out)
			}
		}
	}
	res.Best, res.BestMetrics = es.Incumbent(), incM
	return res, nil
}
