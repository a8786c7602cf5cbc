package sim

import (
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/trace"
)

// Replayed through the router's estimate, answers told by their
// application's system prompt are estimated far better than by the
// running mean; with one application for all, no better.
func TestOutputError(t *testing.T) {
	apps := appsTrace(400, time.Second)
	one := appsTrace(400, time.Second)
	for i := range one {
		one[i].Messages = []trace.Message{{Role: "system", Content: "You help."}, one[i].Messages[1]}
	}
	if e := OutputError(apps); e.Keyed > e.Global/4 {
		t.Errorf("two applications: keyed ±%.0f, running mean ±%.0f: want the keys far better", e.Keyed, e.Global)
	}
	if e := OutputError(one); e.Keyed < e.Global*0.95 || e.Keyed > e.Global*1.05 {
		t.Errorf("one application: keyed ±%.0f, running mean ±%.0f: want about the same", e.Keyed, e.Global)
	}
	if e := OutputError(nil); e != (trace.OutputError{}) {
		t.Errorf("no requests: %+v", e)
	}
}
