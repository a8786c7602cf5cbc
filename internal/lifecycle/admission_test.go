package lifecycle

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// admissionCore is a core over two replicas that prefill at 10 ms a token,
// with a 60 s TTFT SLO: held requests have a minute of wall time before
// their deadline, plenty on a loaded machine.
func admissionCore(t *testing.T, mode admit.Mode) (*Core, *prometheus.Registry) {
	t.Helper()
	p, _ := policy.New("gorgo-ms", policy.Options{})
	rt, err := router.New(router.Config{Policy: p, BlockTokens: 16, TieMargin: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		rt.Add(router.ReplicaConfig{ID: id, KVCapacityTokens: 1 << 20, PrefillMSPerToken: 10, QueueMSPerToken: 10})
		rt.ObserveRTT(id, 10*time.Millisecond)
	}
	a := admit.Config{SLO: time.Minute, Mode: mode}
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	c := NewCore(Config{Router: rt, BlockTokens: 16, MaxAttempts: 2, Start: time.Now(), Metrics: NewMetrics(reg), Seed: 1, Admission: a})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.RunAdmission(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c, reg
}

func chatOf(words int, tag string) []byte {
	return []byte(`{"model":"m","messages":[{"role":"user","content":"` + tag + strings.Repeat(" word", words) + `"}],"stream":true}`)
}

// begin dispatches a request past admission: it fills the backlog.
func begin(t *testing.T, c *Core, body []byte) *Request {
	t.Helper()
	r, perr := c.begin(body, Chat, "", time.Now(), false)
	if perr != nil {
		t.Fatal(perr.Message)
	}
	if _, ok := r.next(); !ok {
		t.Fatal("not dispatched")
	}
	return r
}

// tapRec records what a Tap hears: the decisions' replicas and the ends'
// ids (the admission tests run it from one goroutine at a time).
type tapRec struct {
	decided []string
	ended   []uint64
}

func (r *tapRec) Decided(_ time.Time, _ *policy.Request, chosen *router.Ticket, _ []router.Candidate) uint64 {
	r.decided = append(r.decided, chosen.ID)
	return uint64(len(r.decided))
}

func (r *tapRec) Ended(id uint64, _ string, _ int, _, _ time.Duration) { r.ended = append(r.ended, id) }

func TestAdmissionHoldsUntilTheBacklogClears(t *testing.T) {
	c, reg := admissionCore(t, admit.ModeQueue)
	tap := &tapRec{}
	c.cfg.Tap = tap
	// Two 7.5k-token prompts: 75 s of backlog on each replica.
	big := []*Request{begin(t, c, chatOf(6000, "one")), begin(t, c, chatOf(6000, "two"))}
	if big[0].Replica() == big[1].Replica() {
		t.Fatalf("both on %s", big[0].Replica())
	}
	small, perr := c.begin(chatOf(10, "three"), Chat, "", time.Now(), false)
	if perr != nil {
		t.Fatal(perr.Message)
	}
	type res struct {
		e   *wire.Error
		err error
	}
	got := make(chan res, 1)
	go func() { e, err := small.admit(context.Background()); got <- res{e, err} }()
	deadline := time.Now().Add(3 * time.Second)
	for testutil.ToFloat64(c.cfg.Metrics.queue) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the small request was not held")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case r := <-got:
		t.Fatalf("admitted while the backlog is 75 s: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	// One big request gets its first token: its replica's backlog is gone.
	big[0].sendAt(time.Now())
	big[0].Chunk(&wire.Peek{Token: true}, time.Now())
	r := <-got
	if r.e != nil || r.err != nil {
		t.Fatalf("after the backlog cleared: %+v", r)
	}
	id, ok := small.next()
	if !ok || id != big[0].Replica() {
		t.Fatalf("dispatched to %q (%v), want %s", id, ok, big[0].Replica())
	}
	if st, _ := c.cfg.Router.Replica(id); st.InFlight != 2 {
		t.Errorf("%s has %d in flight, want 2", id, st.InFlight)
	}
	if v := testutil.ToFloat64(c.cfg.Metrics.admission.WithLabelValues("held")); v != 1 {
		t.Errorf("held counter %v", v)
	}
	for _, r := range append(big, small) {
		r.end(Outcome{Status: 200}, time.Now())
	}
	// The live view saw the held request's decision and end too (found in
	// review: a request admission dispatched never reached it).
	if len(tap.decided) != 3 || tap.decided[2] != id || len(tap.ended) != 3 {
		t.Errorf("the tap heard decisions %v and ends %v, want the three requests'", tap.decided, tap.ended)
	}
	_ = reg
}

func TestAdmissionRefusesAndLetsAClientLeave(t *testing.T) {
	c, _ := admissionCore(t, admit.ModeReject)
	begin(t, c, chatOf(6000, "one"))
	begin(t, c, chatOf(6000, "two"))
	r, _ := c.begin(chatOf(10, "three"), Chat, "", time.Now(), false)
	e, err := r.admit(context.Background())
	if err != nil || e == nil || e.Status != 429 || e.RetryAfter == "" || e.RetryAfter == "0" || !strings.Contains(e.Message, "TTFT SLO") {
		t.Fatalf("reject mode: %+v %v", e, err)
	}
	r.reject(e)
	// Too long even for an idle replica: refused whatever the mode, with
	// a 400 that says why and no Retry-After (it was a 429 that said the
	// fleet was overloaded: a client retried it for ever; a user's test,
	// 2026-12-07).
	q, _ := admissionCore(t, admit.ModeQueue)
	r, _ = q.begin(chatOf(8000, "huge"), Chat, "", time.Now(), false)
	if e, _ = r.admit(context.Background()); e == nil || e.Status != 400 || e.RetryAfter != "" || !strings.Contains(e.Message, "even on an idle replica") {
		t.Fatalf("a 10k-token prompt with a 60 s SLO at 10 ms a token: %+v", e)
	}
	r.reject(e)
	// A client that leaves while held.
	begin(t, q, chatOf(6000, "one"))
	begin(t, q, chatOf(6000, "two"))
	r, _ = q.begin(chatOf(10, "three"), Chat, "", time.Now(), false)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for testutil.ToFloat64(q.cfg.Metrics.queue) != 1 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	if e, err := r.admit(ctx); err == nil || e != nil {
		t.Fatalf("client gone: %+v %v", e, err)
	}
	r.abandon()
	if n := testutil.ToFloat64(q.cfg.Metrics.queue); n != 0 {
		t.Errorf("%v left in the queue", n)
	}
}

// After shutdown nothing would release a held request: it gets a 503 at
// once instead of waiting for its client to give up (found in review).
func TestNothingIsHeldAfterShutdown(t *testing.T) {
	p, _ := policy.New("gorgo-ms", policy.Options{})
	rt, err := router.New(router.Config{Policy: p, BlockTokens: 16, TieMargin: -1})
	if err != nil {
		t.Fatal(err)
	}
	rt.Add(router.ReplicaConfig{ID: "a", KVCapacityTokens: 1 << 20, PrefillMSPerToken: 1, QueueMSPerToken: 1})
	rt.ObserveRTT("a", time.Millisecond)
	a := admit.Config{SLO: 5 * time.Second}
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	c := NewCore(Config{Router: rt, BlockTokens: 16, MaxAttempts: 1, Start: time.Now(), Metrics: NewMetrics(prometheus.NewRegistry()), Admission: a})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c.RunAdmission(ctx) // returns at once: shut down
	begin(t, c, chatOf(6000, "one"))
	r, _ := c.begin(chatOf(10, "two"), Chat, "", time.Now(), false)
	wait, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	e, gone := r.admit(wait)
	if gone != nil || e == nil || e.Status != 503 {
		t.Fatalf("held after shutdown: %+v %v", e, gone)
	}
	r.reject(e)
}
