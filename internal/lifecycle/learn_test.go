package lifecycle

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/wire"
)

// A streamed request dispatched to replicas that all failed it is a failed
// request of the arm that routed it: the tuner's "fails no more requests"
// check (tune.ES.Verdict) must hear of it, as the simulator's learner does
// (sim.back learns st.failed; 2026-12-05: Serve rejected it without
// telling the learner, so a candidate whose choices ended in 502/503s was
// charged nothing, its window keeping only its survivors).
func TestLearnerHearsARequestEveryAttemptFailed(t *testing.T) {
	c, l, _, _ := setup(t)
	in := Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now()}
	fe := &frontEnd{fails: map[string]*AttemptError{
		"a": {Error: *wire.Errorf(502, "broken a"), Broken: true},
		"b": {Error: *wire.Errorf(502, "broken b"), Broken: true},
		"c": {Error: *wire.Errorf(502, "broken c"), Broken: true},
	}}
	if st := c.Serve(context.Background(), in, fe); st != 502 || len(fe.sent) != 3 {
		t.Fatalf("all broken: status %d, sent %v", st, fe.sent)
	}
	if len(l.outcomes) != 1 || !l.outcomes[0].Failed {
		t.Errorf("learned %+v; want one failed outcome for the request every attempt of which failed", l.outcomes)
	}
}

// clientErrorFE answers every attempt with the replica's 400 (vLLM's
// "maximum context length" error, say), relayed to the client as is.
type clientErrorFE struct{ frontEnd }

func (f *clientErrorFE) Send(ctx context.Context, r *Request, id string) (int, *AttemptError) {
	f.sent = append(f.sent, id)
	return 400, nil
}

func (f *clientErrorFE) Relay(r *Request) Outcome {
	f.relayed++
	return Outcome{Status: 400}
}

// A request the replica refuses as the client's error (a 400: a prompt
// over the model's context, a bad parameter) says nothing of the weights
// that routed it; any replica would have refused it (2026-12-05: learned
// as a failed request of the arm, so that tune.ES.Verdict rejected a
// candidate whose window held one more of them than the incumbent's, good
// candidates at random).
func TestLearnerIgnoresTheClientsOwnError(t *testing.T) {
	c, l, _, _ := setup(t)
	in := Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now()}
	fe := &clientErrorFE{}
	if st := c.Serve(context.Background(), in, fe); st != 400 || fe.relayed != 1 {
		t.Fatalf("status %d, relayed %d", st, fe.relayed)
	}
	for _, o := range l.outcomes {
		if o.Failed {
			t.Errorf("learned %+v: a client's 400 counted as a failure of the arm that routed it", o)
		}
	}
}

// hangingFE holds its attempt on replica a for hang, then fails it (a
// first-byte timeout); the others serve.
type hangingFE struct {
	frontEnd
	hang time.Duration
}

func (f *hangingFE) Send(ctx context.Context, r *Request, id string) (int, *AttemptError) {
	if id == "a" {
		f.sent = append(f.sent, id)
		time.Sleep(f.hang)
		return 0, &AttemptError{Error: *wire.Errorf(504, "no first byte"), Broken: true}
	}
	return f.frontEnd.Send(ctx, r, id)
}

// The learner times a request from its first attempt: the time its arm's
// choice lost on a replica that hung is the client's wait, and the
// fallback that served is the same decision's (2026-12-06: timed from
// the attempt that answered, so an arm that sent requests to a hung
// replica was charged nothing for the wait; the reviews of the tuner
// doubted it). The router's own models still time the replica that
// answered from its attempt.
func TestLearnerCountsTheTimeLostBeforeTheFallback(t *testing.T) {
	c, l, _, _ := setup(t)
	const hang = 200 * time.Millisecond
	in := Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now()}
	fe := &hangingFE{hang: hang}
	if st := c.Serve(context.Background(), in, fe); st != 200 || len(fe.sent) != 2 || fe.sent[0] != "a" {
		t.Fatalf("status %d, sent %v; want a, then a fallback that serves", st, fe.sent)
	}
	if len(l.outcomes) != 1 || l.outcomes[0].Failed {
		t.Fatalf("learned %+v", l.outcomes)
	}
	if o := l.outcomes[0]; o.TTFT < hang || o.E2E < hang {
		t.Errorf("learned TTFT %v, E2E %v; want at least the %v lost on the replica that hung", o.TTFT, o.E2E, hang)
	}
}

// With tenants' own SLOs and none for the fleet, a request of a tenant
// without one is held by flow control to its max_ttft_slo (classify), but
// the learner hears it had no SLO, as the simulator's does; a tenant's
// own SLO it hears (2026-12-06, the tuner's review: the 10-minute hold was
// learned as its SLO, so under slo-p95, whose windows are the requests
// with SLOs, such requests filled them with ratios near 0).
func TestLearnerHearsNoSLOWhereFlowControlOnlyHolds(t *testing.T) {
	c0, l, _, _ := setup(t)
	ts, a := chatAndBatch(t, time.Second)
	c := withFlow(c0, a, ts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.RunAdmission(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for _, name := range []string{"batch", "chat"} {
		in := Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now(), Tenant: name}
		if st := c.Serve(context.Background(), in, &frontEnd{}); st != 200 {
			t.Fatalf("%s: status %d", name, st)
		}
	}
	if len(l.outcomes) != 2 {
		t.Fatalf("learned %+v", l.outcomes)
	}
	if o := l.outcomes[0]; o.HasSLO() {
		t.Errorf("a request of a tenant without an SLO learned with TTFT SLO %v: it would count in slo-p95's windows", o.TTFTSLO)
	}
	if o := l.outcomes[1]; o.TTFTSLO != time.Second {
		t.Errorf("a request of a tenant with a 1s SLO learned with %v", o.TTFTSLO)
	}
}

// A request every replica it was sent to refused as busy (429, as 503) is
// a failed request of the arm that routed it, not the client's error
// (2026-12-06, the tuner's review: a 429 was skipped as a 4xx).
func TestLearnerCountsTheReplicasBusyAnswer(t *testing.T) {
	for _, status := range []int{429, 503} {
		c, l, _, _ := setup(t)
		in := Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now()}
		busy := func(id string) *AttemptError { return &AttemptError{Error: *wire.Errorf(status, "busy %s", id)} }
		fe := &frontEnd{fails: map[string]*AttemptError{"a": busy("a"), "b": busy("b"), "c": busy("c")}}
		if st := c.Serve(context.Background(), in, fe); st != status {
			t.Fatalf("every replica busy with %d: status %d", status, st)
		}
		if len(l.outcomes) != 1 || !l.outcomes[0].Failed {
			t.Errorf("every replica answered %d: learned %+v, want one failed outcome", status, l.outcomes)
		}
	}
}

// wholeFE answers every request whole: no token is seen before its end.
type wholeFE struct{ frontEnd }

func (f *wholeFE) Relay(r *Request) Outcome {
	f.relayed++
	time.Sleep(time.Millisecond) // its end is some time after its send
	r.Complete(r.Format().Body([]byte(`{"choices":[{"message":{"content":"hi there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":2}}`)))
	return Outcome{Status: 200}
}

// A whole answer is learned from, timed by its end alone
// (Outcome.Unstreamed): a tuner whose objective is its end-to-end latency
// learns from a fleet whose clients never stream (2026-12-07: nothing was
// learned from them, so such a fleet kept its starting weights whatever
// the objective).
func TestLearnerHearsWholeAnswers(t *testing.T) {
	c, l, _, _ := setup(t)
	body := strings.Replace(chat, `"stream":true`, `"stream":false`, 1)
	fe := &wholeFE{}
	if st := c.Serve(context.Background(), Incoming{Body: []byte(body), Kind: Chat, Received: time.Now()}, fe); st != 200 || fe.relayed != 1 {
		t.Fatalf("status %d, relayed %d", st, fe.relayed)
	}
	if len(l.outcomes) != 1 {
		t.Fatalf("learned %+v, want one outcome", l.outcomes)
	}
	if o := l.outcomes[0]; !o.Unstreamed || o.Failed || o.TTFT != 0 || o.E2E < time.Millisecond || o.ITL != 0 || o.Tokens != 2 {
		t.Errorf("learned %+v, want a whole answer timed by its end", o)
	}
	if _, ok := l.outcomes[0].SLORatio(); ok {
		t.Error("a whole answer has an SLO ratio: its first token was not seen")
	}
}

// The decision hears whether its request is held to an SLO
// (policy.Request.HasSLO), as its outcome will say: a tuner judging SLO
// ratios routes the others with its incumbent, not a candidate it will
// never judge by them. A tenant without an SLO, held by flow control to
// its max_ttft_slo, has none (2026-12-07).
func TestDecisionHearsWhetherAnSLOHolds(t *testing.T) {
	c, l, _, _ := setup(t)
	ts, a := chatAndBatch(t, time.Minute)
	c = withFlow(c, a, ts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.RunAdmission(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for _, tenant := range []string{"chat", "batch"} {
		if st := c.Serve(context.Background(), Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now(), Tenant: tenant}, &frontEnd{}); st != 200 {
			t.Fatalf("%s: status %d", tenant, st)
		}
	}
	if !slices.Equal(l.hasSLO, []bool{true, false}) || len(l.outcomes) != 2 || !l.outcomes[0].HasSLO() || l.outcomes[1].HasSLO() {
		t.Errorf("decided with SLOs %v, learned %+v; want chat's held to one and batch's not, alike", l.hasSLO, l.outcomes)
	}
}

// Embeddings (and the engines' other endpoints that generate no text),
// and a stream a gateway shows the picker nothing of, are not learned
// from, and the decision hears so; a Responses API request, which
// generates, is (a review: embeddings were learned as whole answers of no
// length, and unseen streams routed by a candidate that never heard of
// them).
func TestEmbeddingsAreNotLearned(t *testing.T) {
	c, l, _, _ := setup(t)
	for _, ep := range []string{"/v1/embeddings", "/v1/responses"} {
		in := Incoming{Body: []byte(`{"model":"m","input":"a text long enough to fill a few blocks of the prefix index"}`), Kind: Input, Endpoint: ep, Received: time.Now()}
		if st := c.Serve(context.Background(), in, &wholeFE{}); st != 200 {
			t.Fatalf("%s: status %d", ep, st)
		}
	}
	if st := c.Serve(context.Background(), Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now(), Unseen: true}, &frontEnd{}); st != 200 {
		t.Fatalf("an unseen stream: status %d", st)
	}
	if len(l.outcomes) != 1 || !l.outcomes[0].Unstreamed || !slices.Equal(l.unjudged, []bool{true, false, true}) {
		t.Errorf("learned %+v, unjudged %v; want the responses request's alone", l.outcomes, l.unjudged)
	}
}
