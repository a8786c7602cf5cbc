package sim

import (
	"math"

	"github.com/gorgo-llm/gorgo/internal/estimate"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/synth"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// OutputError replays reqs' answers, in arrival order, through the router's
// estimate of answers' lengths (estimate.Outputs under router.KeysOf, the
// requests keyed as the proxy keys the bodies the replayer sends), and
// through the running mean alone: how far each is from the true answers.
// Each answer is learned as its request arrives; a router learns it when
// it ends, so it knows a little less when it decides.
func OutputError(reqs []trace.Request) trace.OutputError {
	global := estimate.NewOutputs(router.DefaultOutputTokens, 0)
	keyed := estimate.NewOutputs(router.DefaultOutputTokens, 0)
	keys := synth.NewKeys(prompt.Estimator{})
	var e trace.OutputError
	for i := range reqs {
		r := &reqs[i]
		k := router.KeysOf(&policy.Request{SessionKey: r.Session, Tenant: r.Tenant, PrefixKey: keys.Of(r), InstructionsKey: keys.Instructions(r), Model: r.Model})
		x := float64(r.OutputTokens)
		e.Global += math.Abs(x - global.Expect())
		e.Keyed += math.Abs(x - keyed.Expect(k[0], k[1]))
		global.Observe(r.OutputTokens)
		keyed.Observe(r.OutputTokens, k[0], k[1])
	}
	if len(reqs) > 0 {
		e.Global /= float64(len(reqs))
		e.Keyed /= float64(len(reqs))
	}
	return e
}
