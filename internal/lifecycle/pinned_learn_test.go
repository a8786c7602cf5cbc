package lifecycle

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// A follow-up pinned to the replica that stored the response it names goes
// there whatever the weights say: its outcome is not a measurement of the
// arm whose turn it was (the tuner's "each measurement belongs to the
// weights that produced it", docs/results.md "The tuner"; 2026-12-05: it
// was tagged with the arm and filled its window, so that in block mode a
// candidate's block was charged for follow-ups the incumbent had placed).
func TestPinnedFollowUpIsNotScored(t *testing.T) {
	c, o, rt := tunedCore(t)
	rt.Stored("resp_1", "c")
	fe := &frontEnd{}
	in := Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now(), Stored: "resp_1"}
	if st := c.Serve(context.Background(), in, fe); st != 200 || len(fe.sent) != 1 || fe.sent[0] != "c" {
		t.Fatalf("pinned: status %d, sent %v; want 200 from c, the holder", st, fe.sent)
	}
	if s := o.Round().Scored; s[0]+s[1] != 0 {
		t.Errorf("the pinned follow-up was scored for an arm (%v outcomes of incumbent, candidate)", s)
	}
	// An unpinned request is scored as usual.
	in.Stored = ""
	if st := c.Serve(context.Background(), in, &frontEnd{}); st != 200 {
		t.Fatalf("status %d", st)
	}
	if s := o.Round().Scored; s[0]+s[1] != 1 {
		t.Errorf("an unpinned request: scored %v, want one outcome", s)
	}
}

// tunedCore is a core over replicas a, b and c (10, 20 and 30 ms away)
// routed by the online tuner over gorgo, whose two arms alternate request
// by request.
func tunedCore(t *testing.T) (*Core, *tune.Online, *router.Router) {
	t.Helper()
	o, err := tune.NewOnline(tune.OnlineConfig{ES: tune.Config{Seed: 1}, Base: "gorgo", Window: 64, Hop: 1})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := router.New(router.Config{Policy: o, BlockTokens: 16, TieMargin: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"a", "b", "c"} {
		rt.Add(router.ReplicaConfig{ID: id, KVCapacityTokens: 1 << 16, PrefillMSPerToken: 0.1, QueueMSPerToken: 0.1})
		rt.ObserveRTT(id, time.Duration(10*(i+1))*time.Millisecond)
	}
	return NewCore(Config{Router: rt, BlockTokens: 16, MaxAttempts: 3, Start: time.Unix(0, 0), Metrics: NewMetrics(prometheus.NewRegistry()), Seed: 1}), o, rt
}
