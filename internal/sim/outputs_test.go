package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/trace"
)

// Replayed through the router's estimate, answers told by their
// application's system prompt are estimated far better than by the
// running mean; with one application for all, no better.
func TestOutputError(t *testing.T) {
	var apps, one []trace.Request
	for i := range 400 {
		out, system := 40, "You call tools."
		if i%2 == 1 {
			out, system = 800, "You write reports."
		}
		r := request(time.Duration(i)*time.Second, uint64(i+1), 200, out)
		r.Messages = []trace.Message{{Role: "system", Content: system}, {Role: "user", Content: fmt.Sprint("question ", i)}}
		apps = append(apps, r)
		r.Messages = []trace.Message{{Role: "system", Content: "You help."}, {Role: "user", Content: fmt.Sprint("question ", i)}}
		one = append(one, r)
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
