package lifecycle

import (
	"bytes"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/tenant"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// learner is a gorgo policy that records what it learns, and whether
// the requests it routed were held to SLOs.
type learner struct {
	policy.Policy
	outcomes         []policy.Outcome
	hasSLO, unjudged []bool
}

func (l *learner) Learn(tag int, o policy.Outcome) { l.outcomes = append(l.outcomes, o) }

func (l *learner) Decide(d *policy.Decision, req *policy.Request, reps []policy.Replica, rng *rand.Rand) error {
	l.hasSLO, l.unjudged = append(l.hasSLO, req.HasSLO), append(l.unjudged, req.Unjudged)
	return l.Policy.Decide(d, req, reps, rng)
}

type health struct{ failures, successes, missing []string }

func (h *health) Failure(id string)             { h.failures = append(h.failures, id) }
func (h *health) Success(id string)             { h.successes = append(h.successes, id) }
func (h *health) ModelMissing(id, model string) { h.missing = append(h.missing, id+" "+model) }

// observer records the acceptances and ends an Observer hears of.
type observer struct{ ends []string }

func (*observer) Dispatched(uint64, string, time.Duration, *policy.Request) {}
func (o *observer) Accepted(id uint64)                                      { o.ends = append(o.ends, fmt.Sprintf("accepted %d", id)) }
func (*observer) FirstToken(uint64)                                         {}
func (o *observer) Stored(id, replica string)                               { o.ends = append(o.ends, "stored "+id+" at "+replica) }
func (o *observer) Finished(_ uint64, n int, decode time.Duration) {
	o.ends = append(o.ends, fmt.Sprintf("end %d %v", n, decode))
}

// setup is a core over replicas a (10 ms), b (20 ms), c (30 ms).
func setup(t *testing.T) (*Core, *learner, *health, *prometheus.Registry) {
	t.Helper()
	g, _ := policy.New("gorgo", policy.Options{})
	l := &learner{Policy: g}
	rt, err := router.New(router.Config{Policy: l, BlockTokens: 16, TieMargin: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"a", "b", "c"} {
		rt.Add(router.ReplicaConfig{ID: id, KVCapacityTokens: 1 << 16, PrefillMSPerToken: 0.1, QueueMSPerToken: 0.1})
		rt.ObserveRTT(id, time.Duration(10*(i+1))*time.Millisecond)
	}
	reg := prometheus.NewRegistry()
	h := &health{}
	c := NewCore(Config{Router: rt, BlockTokens: 16, MaxAttempts: 3, Start: time.Unix(0, 0), Health: h, Metrics: NewMetrics(reg), Seed: 1})
	return c, l, h, reg
}

// withFlow is a core of c's config with admission a and tenants ts (nil:
// none) in place of c's.
func withFlow(c *Core, a admit.Config, ts *tenant.Set) *Core {
	cfg := c.cfg
	cfg.Admission, cfg.Tenants = a, ts
	return NewCore(cfg)
}

const chat = `{"model":"m","messages":[{"role":"user","content":"` + "a question long enough to fill a few blocks of the prefix index" + `"}],"max_tokens":8,"stream":true}`

// A learning policy hears of the SLOs a request was held to (its class's
// TTFT SLO, else the admission's; its TPOT SLO), how long it waited before
// the attempt that answered it, and its time per token, not per chunk.
func TestLearnerHearsTheSLOs(t *testing.T) {
	c, l, _, _ := setup(t)
	a := admit.Config{SLO: 2 * time.Second}
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	c = withFlow(c, a, nil)
	t0 := time.Unix(100, 0)
	cases := []struct {
		class, wait time.Duration
		tpot        float64
		tokens      int // the usage's completion tokens (0: none)
		ttftSLO     time.Duration
		itl         time.Duration
	}{
		{0, 0, 0, 0, 2 * time.Second, 10 * time.Millisecond},
		{0, 300 * time.Millisecond, 50, 0, 2 * time.Second, 10 * time.Millisecond},
		{500 * time.Millisecond, 0, 0, 3, 500 * time.Millisecond, 5 * time.Millisecond}, // two chunks, three tokens
	}
	for _, k := range cases {
		r, err := c.begin([]byte(chat), Chat, "", t0, false)
		if err != nil {
			t.Fatal(err)
		}
		r.Route.TPOTSLOMS = k.tpot // as classify sets them from a tenant's ask
		r.class.SLO = k.class
		if _, ok := r.next(); !ok {
			t.Fatal("not dispatched")
		}
		r.sendAt(t0.Add(k.wait))
		r.accepted()
		tok := wire.PeekChunk([]byte(`{"choices":[{"delta":{"content":"hi"}}]}`))
		r.Chunk(&tok, r.sent.Add(60*time.Millisecond))
		r.Chunk(&tok, r.sent.Add(70*time.Millisecond))
		if k.tokens > 0 {
			usage := wire.PeekChunk([]byte(fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":%d}}`, k.tokens)))
			r.Chunk(&usage, r.sent.Add(71*time.Millisecond))
		}
		r.Done()
		r.end(Outcome{Status: 200}, r.sent.Add(80*time.Millisecond))
	}
	if len(l.outcomes) != len(cases) {
		t.Fatalf("learned %+v", l.outcomes)
	}
	for i, o := range l.outcomes {
		k := cases[i]
		if o.TTFTSLO != k.ttftSLO || o.TPOTSLO != time.Duration(k.tpot*1e6) || o.Queued != k.wait || o.TTFT != 60*time.Millisecond || o.ITL != k.itl {
			t.Errorf("outcome %d: %+v; want SLOs %v and %vms, queued %v, TTFT 60ms, ITL %v", i, o, k.ttftSLO, k.tpot, k.wait, k.itl)
		}
	}
}

// A stream served in full whose tokens the router did not see (a gateway
// that shows the picker no body, an empty answer) is not learned from: it
// once counted as a failure for the tuner. A failed one still is.
func TestLearnerHearsNothingOfAnUnseenAnswer(t *testing.T) {
	c, l, _, _ := setup(t)
	for _, status := range []int{200, 502} {
		r, err := c.begin([]byte(chat), Chat, "", time.Unix(100, 0), false)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := r.next(); !ok {
			t.Fatal("not dispatched")
		}
		r.sendAt(time.Unix(100, 0))
		r.accepted()
		if status == 200 {
			r.Done()
		}
		r.end(Outcome{Status: status}, time.Unix(101, 0))
	}
	if len(l.outcomes) != 1 || !l.outcomes[0].Failed {
		t.Errorf("learned %+v; want the failed request's outcome alone", l.outcomes)
	}
}

// One request's life without any transport: the first replica fails, the
// fallback serves; the ledger, the index, the learner, the health and the
// metrics all hear of it.
func TestLifeOfAStreamedRequest(t *testing.T) {
	c, l, h, reg := setup(t)
	obs := &observer{}
	c.cfg.Observer = obs
	t0 := time.Unix(100, 0)
	r, err := c.begin([]byte(chat), Chat, "session-1", t0, false)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Stream() || !r.HideUsage || !bytes.Contains(r.Body, []byte(`"include_usage":true`)) || r.Route.SessionKey != "session-1" || r.Route.MaxOutputTokens != 8 || r.Route.Unstreamed {
		t.Fatalf("request %+v, body %s", r.Route, r.Body)
	}
	// The router is told when a request's answer will not be streamed.
	plain, err := c.begin([]byte(strings.Replace(chat, `"stream":true`, `"stream":false`, 1)), Chat, "", t0, false)
	if err != nil {
		t.Fatal(err)
	}
	if !plain.Route.Unstreamed || plain.Route.InstructionsKey != 0 {
		t.Errorf("a non-streaming request without instructions: %+v", plain.Route)
	}
	plain.Discard()
	// An answer's least length (min_tokens) is the router's to know, not
	// ignore_eos (see prompt.Request.MinTokens).
	forced, err := c.begin([]byte(strings.Replace(chat, `"stream":true`, `"stream":true,"ignore_eos":true,"min_tokens":5`, 1)), Chat, "", t0, false)
	if err != nil {
		t.Fatal(err)
	}
	if forced.Route.MinOutputTokens != 5 {
		t.Errorf("min_tokens 5 and ignore_eos, max_tokens 8: %+v, want MinOutputTokens 5", forced.Route)
	}
	forced.Discard()
	// A system prompt is the application's instructions: its key is the
	// same whatever the user writes after it.
	var keys []uint64
	for _, q := range []string{"one question", "another"} {
		body := `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + q + `"}]}`
		app, err := c.begin([]byte(body), Chat, "", t0, false)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, app.Route.InstructionsKey, app.Route.PrefixKey)
		app.Discard()
	}
	if keys[0] == 0 || keys[0] != keys[2] || keys[1] == keys[3] {
		t.Errorf("instructions and prefix keys %x: want the instructions' the same, the openings apart", keys)
	}
	id, ok := r.next()
	if !ok || id != "a" {
		t.Fatalf("first attempt on %q", id)
	}
	if fb := r.Fallbacks(); len(fb) != 2 || fb[0].ID != "b" || fb[1].ID != "c" {
		t.Fatalf("fallbacks %+v", fb)
	}
	r.sendAt(t0)
	r.failed(&AttemptError{Error: wire.Error{Status: 502, Message: "refused"}, Broken: true})
	if st, _ := c.cfg.Router.Replica("a"); st.InFlight != 0 {
		t.Errorf("a failed attempt stays in a's ledger: %+v", st)
	}
	if id, ok = r.next(); !ok || id != "b" {
		t.Fatalf("second attempt on %q", id)
	}
	r.sendAt(t0.Add(time.Millisecond))
	r.accepted()
	tok := wire.PeekChunk([]byte(`{"choices":[{"delta":{"content":"hi"}}]}`))
	r.Chunk(&tok, t0.Add(61*time.Millisecond))
	r.Chunk(&tok, t0.Add(71*time.Millisecond))
	usage := wire.PeekChunk([]byte(`{"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`))
	r.Chunk(&usage, t0.Add(72*time.Millisecond))
	r.Done()
	if status := r.end(Outcome{Status: 200, ClientGone: true}, t0.Add(80*time.Millisecond)); status != 200 {
		t.Errorf("a complete answer whose client left after it: status %d, want 200", status)
	}
	st, _ := c.cfg.Router.Replica("b")
	if st.InFlight != 0 || st.BacklogTokens != 0 || st.IndexBlocks == 0 {
		t.Errorf("b after the request: %+v", st)
	}
	// The learner's TTFT runs from the first attempt, a's (t0): the 1 ms
	// lost there is its arm's.
	if len(l.outcomes) != 1 || l.outcomes[0].TTFT != 61*time.Millisecond || l.outcomes[0].ITL != 10*time.Millisecond || l.outcomes[0].Failed ||
		l.outcomes[0].TTFTSLO != 0 || l.outcomes[0].TPOTSLO != 0 {
		t.Errorf("learned %+v", l.outcomes)
	}
	// The mesh hears of both attempts' ends, of the second's acceptance
	// (the first failed before its replica took it), and of the answer's
	// decode.
	if want := []string{"end 0 0s", "accepted 2", "end 2 10ms"}; !slices.Equal(obs.ends, want) {
		t.Errorf("observer heard %q, want %q", obs.ends, want)
	}
	if len(h.failures) != 1 || h.failures[0] != "a" || len(h.successes) != 1 || h.successes[0] != "b" {
		t.Errorf("health heard failures %v, successes %v", h.failures, h.successes)
	}
	for _, m := range []struct {
		name   string
		labels []string
		want   float64
	}{{"gorgo_requests_total", []string{"b", "other", "200"}, 1}, {"gorgo_retries_total", []string{"a"}, 1}} {
		var v float64
		switch m.name {
		case "gorgo_requests_total":
			v = testutil.ToFloat64(c.cfg.Metrics.requests.WithLabelValues(m.labels...))
		default:
			v = testutil.ToFloat64(c.cfg.Metrics.retries.WithLabelValues(m.labels...))
		}
		if v != m.want {
			t.Errorf("%s%v = %v, want %v", m.name, m.labels, v, m.want)
		}
	}
	_ = reg
}

// When every attempt fails, the client hears the last replica's error;
// with no replica at all, a 503.
func TestNoReplicaLeft(t *testing.T) {
	c, _, _, _ := setup(t)
	r, _ := c.begin([]byte(chat), Chat, "", time.Unix(1, 0), false)
	for range 3 {
		if _, ok := r.next(); !ok {
			t.Fatal("fewer than 3 attempts")
		}
		r.failed(&AttemptError{Error: wire.Error{Status: 503, Type: "ServiceUnavailableError", Message: "busy", RetryAfter: "2"}})
	}
	if _, ok := r.next(); ok {
		t.Fatal("a fourth attempt beyond MaxAttempts")
	}
	if e := r.failure(); e.Status != 503 || e.RetryAfter != "2" {
		t.Errorf("failure %+v", e)
	}
	r.reject(r.failure())
	for _, id := range []string{"a", "b", "c"} {
		c.cfg.Router.Drain(id)
	}
	r, _ = c.begin([]byte(chat), Chat, "", time.Unix(1, 0), false)
	if _, ok := r.next(); ok {
		t.Fatal("routed with every replica drained")
	}
	if e := r.failure(); e.Status != http.StatusServiceUnavailable || !strings.Contains(e.Message, "no available replica") {
		t.Errorf("failure %+v", e)
	}
	r.reject(r.failure())
}

// Bad bodies are refused before routing, with the parser's message.
func TestBeginRefusesBadBodies(t *testing.T) {
	c, _, _, _ := setup(t)
	for body, want := range map[string]string{
		`{"messages": [`:   "malformed JSON",
		`{"messages": []}`: "at least one message",
		`{"messages":[{"role":"user","content":""}]}`: "",
		`{"prompt": "", "max_tokens": 1}`:             "the prompt is empty",
	} {
		kind := Completion
		if strings.Contains(body, "messages") {
			kind = Chat
		}
		r, err := c.begin([]byte(body), kind, "", time.Now(), false)
		if want == "" {
			// "user\n\n" is a prompt: a chat has its roles.
			if err != nil {
				t.Errorf("%s: %v", body, err)
			} else {
				r.Discard()
			}
			continue
		}
		if err == nil || err.Status != 400 || !strings.Contains(err.Message, want) {
			t.Errorf("%s: %+v, want a 400 containing %q", body, err, want)
		}
	}
}

// A client that leaves mid-answer is a 499 that does not count against the
// replica; a broken upstream is a 502 that does.
func TestEndings(t *testing.T) {
	c, l, h, _ := setup(t)
	t0 := time.Unix(5, 0)
	r, _ := c.begin([]byte(chat), Chat, "", t0, false)
	r.next()
	r.sendAt(t0)
	r.accepted()
	if s := r.end(Outcome{Status: 200, ClientGone: true}, t0.Add(time.Second)); s != 499 {
		t.Errorf("client gone: %d", s)
	}
	r, _ = c.begin([]byte(chat), Chat, "", t0, false)
	r.next()
	r.sendAt(t0)
	r.accepted()
	tok := wire.PeekChunk([]byte(`{"choices":[{"delta":{"content":"hi"}}]}`))
	r.Chunk(&tok, t0.Add(time.Millisecond))
	if s := r.end(Outcome{Status: 200, Err: errBroken}, t0.Add(time.Second)); s != 502 {
		t.Errorf("broken: %d", s)
	}
	if len(h.failures) != 1 || len(l.outcomes) != 1 || !l.outcomes[0].Failed {
		t.Errorf("health %v, learned %+v", h.failures, l.outcomes)
	}
}

var errBroken = &wire.Error{Message: "connection reset"}

// The access log has one line per request.
func TestAccessLogLine(t *testing.T) {
	c, _, _, _ := setup(t)
	var buf bytes.Buffer
	c.cfg.Log = slog.New(slog.NewTextHandler(&buf, nil))
	r, _ := c.begin([]byte(strings.Replace(chat, `"stream":true`, `"stream":false`, 1)), Chat, "", time.Unix(0, 0), false)
	r.next()
	r.accepted()
	r.Complete(wire.PeekBody([]byte(`{"usage":{"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":16}}}`)))
	r.end(Outcome{Status: 200}, time.Unix(0, int64(3*time.Millisecond)))
	line := buf.String()
	for _, want := range []string{"replica=a", "status=200", "stream=false", "cached_tokens=16", "output_tokens=7", "e2e_ms=3"} {
		if !strings.Contains(line, want) {
			t.Errorf("log %q lacks %q", line, want)
		}
	}
}

// A Request is recycled: one parse per request, and steady state allocates
// little (the router's decision allocates nothing).
func BenchmarkLifecycle(b *testing.B) {
	g, _ := policy.New("gorgo", policy.Options{})
	rt, _ := router.New(router.Config{Policy: g, BlockTokens: 64})
	for i := range 16 {
		id := string(rune('a' + i))
		rt.Add(router.ReplicaConfig{ID: id, KVCapacityTokens: 1 << 20, PrefillMSPerToken: 0.1, QueueMSPerToken: 0.1})
		rt.ObserveRTT(id, time.Duration(rand.IntN(300)+1)*time.Millisecond)
	}
	c := NewCore(Config{Router: rt, BlockTokens: 64, MaxAttempts: 3, Start: time.Now(), Est: prompt.Estimator{}})
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 800) + `"}]}`)
	tok := wire.PeekChunk([]byte(`{"choices":[{"delta":{"content":"hi"}}]}`))
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now()
		r, err := c.begin(body, Chat, "", now, false)
		if err != nil {
			b.Fatal(err)
		}
		r.next()
		r.sendAt(now)
		r.accepted()
		r.Chunk(&tok, now)
		r.Done()
		r.end(Outcome{Status: 200}, now)
	}
}

// BenchmarkBegin is reading a request (parse, estimate, hash) at 1k and
// 16k tokens: what the proxy does before it routes.
func BenchmarkBegin(b *testing.B) {
	g, _ := policy.New("gorgo", policy.Options{})
	rt, _ := router.New(router.Config{Policy: g, BlockTokens: 64})
	c := NewCore(Config{Router: rt, BlockTokens: 64, MaxAttempts: 3, Start: time.Now()})
	para := `Prefix caching keeps the KV blocks of a prompt's leading tokens on the GPU, so a request that shares them with an earlier one skips their prefill.\n\n`
	for _, tokens := range []int{1000, 16000} {
		body := []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"` + strings.Repeat(para, tokens*4/len(para)) + `"}]}`)
		b.Run(fmt.Sprintf("body=%dKB", len(body)>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				r, err := c.begin(body, Chat, "", time.Time{}, false)
				if err != nil {
					b.Fatal(err)
				}
				r.Discard()
			}
		})
	}
}

// A batch's usage reports one prompt's cached tokens (vLLM's, the last
// prompt's), not the whole batch's the router estimated: it is no
// evidence that the replica forgot its cache. A single prompt's is.
func TestBatchCachedReportIsNotEvidence(t *testing.T) {
	long := strings.Repeat("a prompt long enough to fill many blocks of the prefix index ", 8)
	for _, c := range []struct {
		name, prompt string
		resets       bool
	}{
		{"one prompt", `"` + long + `"`, true},
		{"a batch", `["` + long + `","` + long + `"]`, false},
	} {
		core, _, _, _ := setup(t)
		t0 := time.Unix(100, 0)
		body := []byte(`{"model":"m","prompt":` + c.prompt + `,"max_tokens":8,"stream":true}`)
		for range 40 {
			r, err := core.begin(body, Completion, "", t0, false)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := r.next(); !ok {
				t.Fatal("not dispatched")
			}
			r.sendAt(t0)
			r.accepted()
			tok := wire.PeekChunk([]byte(`{"choices":[{"text":"hi"}]}`))
			r.Chunk(&tok, t0.Add(10*time.Millisecond))
			usage := wire.PeekChunk([]byte(`{"choices":[],"usage":{"prompt_tokens":200,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":0}}}`))
			r.Chunk(&usage, t0.Add(20*time.Millisecond))
			r.Done()
			r.end(Outcome{Status: 200}, t0.Add(30*time.Millisecond))
		}
		if got := core.Router().IndexResets() > 0; got != c.resets {
			t.Errorf("%s: the index reset %d times after 40 answers reporting no cached tokens; want a reset: %v", c.name, core.Router().IndexResets(), c.resets)
		}
	}
}

// A batch's prompts are cached apart, as the engine runs them: a prompt
// sent alone after a batch finds its blocks where the batch went, and a
// batch's later prompt is credited the blocks it shares with an earlier
// one, which the replica computes once.
func TestBatchPromptsAreCachedApart(t *testing.T) {
	p := strings.Repeat("the first prompt of the batch, long enough for blocks ", 6)
	q := strings.Repeat("another prompt that shares nothing with the first one ", 6)
	batch := func(prompts ...string) []byte {
		return []byte(`{"model":"m","prompt":["` + strings.Join(prompts, `","`) + `"],"max_tokens":8}`)
	}
	core, _, _, _ := setup(t)
	est := core.cfg.Est
	t0 := time.Unix(100, 0)
	send := func(body []byte) router.Ticket {
		t.Helper()
		r, err := core.begin(body, Completion, "", t0, false)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := r.next(); !ok {
			t.Fatal("not dispatched")
		}
		tk := r.ticket
		r.sendAt(t0)
		r.accepted()
		r.Done()
		r.end(Outcome{Status: 200}, t0.Add(30*time.Millisecond))
		return tk
	}
	first := send(batch(p, q))
	if first.EstCachedTokens != 0 {
		t.Fatalf("a fresh batch of two unrelated prompts is estimated %d tokens cached", first.EstCachedTokens)
	}
	alone := send([]byte(`{"model":"m","prompt":"` + q + `","max_tokens":8}`))
	full := est.Tokens([]byte(q)) / 16 * 16
	if alone.ID != first.ID || alone.EstCachedTokens < full {
		t.Errorf("the batch's second prompt alone: %s with %d tokens cached; want %s with at least %d", alone.ID, alone.EstCachedTokens, first.ID, full)
	}
	// A fresh batch whose prompts share a long opening: its second prompt
	// finds the opening the first computed, wherever the batch goes.
	shared := strings.Repeat("shared instructions of an evaluation's few shots ", 8)
	sb := send(batch(shared+"question one", shared+"question two"))
	if min := est.Tokens([]byte(shared)) / 16 * 16; sb.EstCachedTokens < min-16 {
		t.Errorf("a batch sharing a %d-token opening is estimated %d tokens cached", est.Tokens([]byte(shared)), sb.EstCachedTokens)
	}
}

// A chat's tools are prompt tokens (the engine's chat template renders
// them, most at the prompt's start) and part of its application's key;
// the opening simple session affinity and the conversation's key hash is
// its messages'.
func TestToolsArePartOfThePrompt(t *testing.T) {
	core, _, _, _ := setup(t)
	tools := `[{"type":"function","function":{"name":"lookup","description":"` + strings.Repeat("looks a thing up ", 40) + `","parameters":{"type":"object"}}}]`
	body := func(tools string) []byte {
		b := `{"model":"m","messages":[{"role":"system","content":"you are an agent"},{"role":"user","content":"find it"}]`
		if tools != "" {
			b += `,"tools":` + tools
		}
		return []byte(b + `}`)
	}
	route := func(tools string) policy.Request { return routeOf(t, core, body(tools)) }
	without, with := route(""), route(tools)
	other := route(strings.Replace(tools, "lookup", "search", 1))
	if got, want := with.PromptTokens-without.PromptTokens, core.cfg.Est.Tokens([]byte(tools)); got < want {
		t.Errorf("tools of ~%d tokens add %d prompt tokens", want, got)
	}
	if with.PrefixKey != without.PrefixKey || with.InstructionsKey != without.InstructionsKey {
		t.Error("the tools changed the messages' opening keys")
	}
	if with.Blocks[0] == without.Blocks[0] || with.Blocks[0] == other.Blocks[0] {
		t.Error("the tools are not the prompt's first block")
	}
	a, b, c := router.KeysOf(&without), router.KeysOf(&with), router.KeysOf(&other)
	if a[0] == b[0] || b[0] == c[0] {
		t.Errorf("application keys without tools, with them and with others: %x %x %x", a[0], b[0], c[0])
	}
}

// An image, an audio clip or a video is prompt tokens (its encoder's, as
// the estimator says) and cached blocks of its own: the same question
// about another one shares only what comes before it, and is no cache hit.
func TestMediaArePartOfThePrompt(t *testing.T) {
	core, _, _, _ := setup(t)
	core.cfg.Est.ImageTokens, core.cfg.Est.AudioTokensPerSecond, core.cfg.Est.VideoTokens = 512, 30, 2000
	for _, tt := range []struct {
		part   string
		tokens int
	}{
		{"image_url", 512},
		{"audio_url", 300}, // a fetched clip: ten seconds
		{"video_url", 2000},
	} {
		body := func(url string) []byte {
			return []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"` + tt.part + `","` + tt.part + `":{"url":"` + url +
				`"}},{"type":"text","text":"what is in this one? describe it in a few words, please"}]}]}`)
		}
		route := func(url string) policy.Request { return routeOf(t, core, body(url)) }
		cat, dog, cat2 := route("https://media/cat"), route("https://media/dog"), route("https://media/cat")
		if cat.PromptTokens < tt.tokens || cat.PromptTokens > tt.tokens+40 {
			t.Errorf("%s and a question: %d prompt tokens, want the media's %d and the question's", tt.part, cat.PromptTokens, tt.tokens)
		}
		if !slices.Equal(cat.Blocks, cat2.Blocks) {
			t.Errorf("%s: one medium, two chains", tt.part)
		}
		// The first block holds the role and the medium's name: it
		// differs, and so does every block after it.
		if cat.Blocks[0] == dog.Blocks[0] {
			t.Errorf("%s: two media, one first block", tt.part)
		}
		// The same question about another one is the same application's
		// and opens the same way.
		if router.KeysOf(&cat) != router.KeysOf(&dog) || cat.PrefixKey != dog.PrefixKey {
			t.Errorf("%s: one question about two media: keys %x and %x", tt.part, router.KeysOf(&cat), router.KeysOf(&dog))
		}
	}
}

// A pooled request keeps its media's and a batch's offsets: reading one
// allocates no more than reading a plain chat.
func TestPooledRequestKeepsItsOffsets(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	core, _, _, _ := setup(t)
	allocs := func(body string) float64 {
		return testing.AllocsPerRun(200, func() {
			r, err := core.begin([]byte(body), Chat, "", time.Unix(100, 0), false)
			if err != nil {
				t.Fatal(err)
			}
			r.Discard()
		})
	}
	plain := allocs(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	image := allocs(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"u"}}]}]}`)
	if image > plain {
		t.Errorf("a chat with an image: %v allocations a request, a plain chat %v", image, plain)
	}
}

// routeOf is what the router is told of a chat body: its policy.Request,
// its blocks its own.
func routeOf(t *testing.T, core *Core, body []byte) policy.Request {
	t.Helper()
	r, err := core.begin(body, Chat, "", time.Unix(100, 0), false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.release()
	req := r.Route
	req.Blocks = slices.Clone(req.Blocks)
	return req
}

// A status's label is its number where HTTP names it (and 499), else its
// class: a replica answering every number from 100 to 599 makes a few
// dozen series per model, not hundreds (2026-12-07, a review: 201).
func TestStatusLabelsAreBounded(t *testing.T) {
	for code, want := range map[int]string{200: "200", 404: "404", 429: "429", 499: "499", 503: "503", 299: "2xx", 418: "418", 420: "4xx", 599: "5xx", 999: "9xx"} {
		if got := statusText(code); got != want {
			t.Errorf("%d: %q, want %q", code, got, want)
		}
	}
	labels := map[string]bool{}
	for code := 100; code < 600; code++ {
		labels[statusText(code)] = true
	}
	if len(labels) > 80 {
		t.Errorf("statuses 100 to 599 make %d labels", len(labels))
	}
}
