package lifecycle

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/wire"
)

// A re-ranked attempt is the same request's, decided by the incumbent's
// turn: its outcome (timed from the first attempt) is scored for the arm
// that made the decision, not for whichever arm's turn the re-rank took
// (review, 2026-12-06).
func TestRerankKeepsTheDecisionsArm(t *testing.T) {
	c, o, rt := tunedCore(t)
	rt.SetHealthy("b", false)
	rt.SetHealthy("c", false)
	fe := &comeBack{frontEnd: frontEnd{fails: map[string]*AttemptError{"a": {Error: *wire.Errorf(502, "refused"), Broken: true}}},
		back: func() { rt.SetHealthy("b", true) }}
	in := Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now()}
	if st := c.Serve(context.Background(), in, fe); st != 200 || len(fe.sent) != 2 {
		t.Fatalf("status %d, sent %v", st, fe.sent)
	}
	if s := o.Round().Scored; s[0] != 1 || s[1] != 0 {
		t.Errorf("decided by the incumbent (arm 0), scored as %v (incumbent, candidate)", s)
	}
}

// Fallbacks used up, the replicas not tried are ranked again, once: one
// that came back since the decision (its ejection over) serves the request
// (2026-12-06, a user's test: requests decided while the other replica
// was ejected had no fallback, and failed when theirs was ejected though
// the other was back).
func TestFallbacksRankedAgainOnceUsedUp(t *testing.T) {
	c, _, _, _ := setup(t)
	rt := c.cfg.Router
	for _, id := range []string{"b", "c"} {
		rt.SetHealthy(id, false)
	}
	fe := &comeBack{frontEnd: frontEnd{fails: map[string]*AttemptError{"a": {Error: *wire.Errorf(502, "refused"), Broken: true}}}, back: func() { rt.SetHealthy("b", true) }}
	in := Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now()}
	if st := c.Serve(context.Background(), in, fe); st != 200 || strings.Join(fe.sent, "") != "ab" {
		t.Errorf("status %d, sent %v", st, fe.sent)
	}
	// Ranked again once: the ones tried are not tried again.
	rt.SetHealthy("b", false)
	fe = &comeBack{frontEnd: frontEnd{fails: map[string]*AttemptError{"a": {Error: *wire.Errorf(502, "refused"), Broken: true}}}, back: func() {}}
	if st := c.Serve(context.Background(), in, fe); st != 502 || strings.Join(fe.sent, "") != "a" {
		t.Errorf("nothing came back: status %d, sent %v", st, fe.sent)
	}
}

// comeBack is a frontEnd that calls back at its first attempt.
type comeBack struct {
	frontEnd
	back func()
}

func (f *comeBack) Send(ctx context.Context, r *Request, id string) (int, *AttemptError) {
	if len(f.sent) == 0 {
		f.back()
	}
	return f.frontEnd.Send(ctx, r, id)
}
