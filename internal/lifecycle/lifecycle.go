// Package lifecycle owns one request's life through a gorgo router, apart
// from any transport: it reads the request from its body bytes and a few
// header values, applies admission, asks the router for a replica and its
// ranked fallbacks, records each attempt, takes the upstream's events (first
// token, usage with cached tokens, finish, errors) and feeds them back to the
// router, the health counters, the online learner, the metrics and the
// access log. Core.Serve is the one order of those steps; a front end (the
// HTTP proxy of gorgo serve, the endpoint picker of gorgo epp) supplies only
// what differs between them, a FrontEnd: how an attempt reaches a replica,
// how its answer reaches the client, and how a refusal does.
//
// Concurrency: a Core is safe for concurrent use; a Request belongs to one
// goroutine (the one in Serve) from its start to its end.
package lifecycle

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/prefix"
	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/tenant"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// Health hears how replicas do: attempts that failed through a replica's
// fault (it refused, hung, broke, or answered 5xx other than 503),
// requests it served, and a replica's 404 for a model it was believed to
// serve (no failure: what it serves changed).
type Health interface {
	Failure(id string)
	Success(id string)
	ModelMissing(id, model string)
}

// Config configures a Core.
type Config struct {
	// Router routes; its policy is asked to Learn when it is a Learner.
	Router *router.Router
	// Est estimates tokens from prompt bytes; BlockTokens is the prefix
	// index's block in estimated tokens.
	Est         prompt.Estimator
	BlockTokens int
	// MaxAttempts bounds the replicas one request is tried on (at least 1).
	MaxAttempts int
	// Fallbacks is how many replicas after its choice a decision ranks
	// (default MaxAttempts − 1; more for a front end that hands a fallback
	// list on).
	Fallbacks int
	// Start is the router's clock origin: router time is time since Start.
	Start time.Time
	// Health, Metrics and Log may be nil.
	Health  Health
	Metrics *Metrics
	Log     *slog.Logger
	// Seed fixes the policies' random draws.
	Seed uint64
	// Admission holds or refuses requests predicted to miss a TTFT SLO
	// (zero SLO: off); it must have passed Validate. Run RunAdmission.
	Admission admit.Config
	// Observer, if set, hears of every attempt's dispatch, first token and
	// end (a mesh bus telling the other routers).
	Observer Observer
	// Tap, if set, hears of every request's decision and end (a live view).
	Tap Tap
	// Aliases, if set, are the router's own model names (aliases and
	// canary splits), resolved before a decision.
	Aliases *models.Resolver
	// Tenants, if set, are the teams sharing the fleet: each request's
	// class and budgets (see tenants.go); a reload changes them
	// (Core.SetTenants).
	Tenants *tenant.Set
}

// Tap hears of each request's first decision (the chosen replica and the
// ranked fallbacks, with their cost terms) and of its end. Decided returns
// an id handed back to Ended; its methods must not block.
type Tap interface {
	Decided(at time.Time, req *policy.Request, chosen *router.Ticket, fallbacks []router.Candidate) uint64
	Ended(id uint64, replica string, status int, ttft, e2e time.Duration)
}

// Observer hears of every attempt: Dispatched when the router sent it to a
// replica (with the round trip the router believes it has to the replica,
// and the request's view), FirstToken, and Finished when it
// ended, however; for a complete answer Finished carries its length and
// the time from its first token to its last (as router.Decoded takes
// them; zero otherwise). Its methods must not block.
type Observer interface {
	Dispatched(id uint64, replica string, rtt time.Duration, req *policy.Request)
	// Accepted: the replica took the attempt (its 200; a non-streaming
	// answer's comes with its end). From then its prompt is in the
	// replica's cache, as this router's prefix index says.
	Accepted(id uint64)
	FirstToken(id uint64)
	Finished(id uint64, outputTokens int, decode time.Duration)
	// Stored: replica answered the Responses API response responseID,
	// and stores it (a Responses API answer's id, read by Chunk, AnswerHead
	// or LongEvent).
	Stored(responseID, replica string)
}

// Core is what the requests of one router share, whichever front end they
// came through.
type Core struct {
	cfg Config
	// rng is used only inside Router.Dispatch, which serialises decisions.
	rng  *rand.Rand
	pool sync.Pool
	adm  *admission // nil without an SLO
	// aborts is what clients aborted through the router (see aborts.go).
	aborts aborts
	ids    atomic.Uint64
	trc    coreTracer // see tracing.go
	// tenants are cfg.Tenants, or a reload's (SetTenants).
	tenants atomic.Pointer[tenant.Set]
}

// NewCore returns a Core.
func NewCore(cfg Config) *Core {
	cfg.MaxAttempts = max(cfg.MaxAttempts, 1)
	if cfg.Fallbacks <= 0 {
		cfg.Fallbacks = cfg.MaxAttempts - 1
	}
	c := &Core{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, policy.DrawStream))}
	if cfg.Admission.SLO > 0 || cfg.Tenants != nil && cfg.Tenants.HasSLO() {
		c.adm = &admission{gate: admit.New[*Request](cfg.Admission), kick: make(chan struct{}, 1)}
	}
	c.tenants.Store(cfg.Tenants)
	if cfg.Tenants != nil { // labelled by name, as SetTenants does on a reload
		cfg.Metrics.SetTenants(cfg.Tenants.Names())
	}
	return c
}

// Now is the router's clock at t.
func (c *Core) Now(t time.Time) time.Duration { return t.Sub(c.cfg.Start) }

// Router is the router the core routes with.
func (c *Core) Router() *router.Router { return c.cfg.Router }

// Forget drops a replica's series: it left the fleet.
func (c *Core) Forget(id string) {
	if c.cfg.Metrics != nil {
		c.cfg.Metrics.forget(id)
	}
}

// Status codes the lifecycle answers with (it speaks no HTTP itself).
const (
	statusOK          = 200
	statusBadRequest  = 400
	statusTooMany     = 429
	statusClientGone  = 499
	statusInternal    = 500
	statusBadGateway  = 502
	statusUnavailable = 503
)

func badRequest(err error) *wire.Error { return wire.Errorf(statusBadRequest, "%s", err.Error()) }

// Request is one request's life.
type Request struct {
	core *Core
	// Route is the router's view of the request.
	Route policy.Request
	// Parsed is what was read of the body.
	Parsed prompt.Request
	// Body is what to send a replica: the client's body, with usage asked
	// for when the client streams without asking (see HideUsage).
	Body []byte
	// HideUsage says the client did not ask for a stream's usage, which the
	// proxy asked for (the engine's cached-token report corrects the prefix
	// index): a usage-only chunk must not reach the client.
	HideUsage bool
	// Received is when the request arrived.
	Received time.Time
	// class is what flow control knows of it: tenant, priority, tokens,
	// SLO; tenant its tenant (nil without tenants), grant its charge to
	// the tenant's budgets, header the answer's headers that show them
	// (Incoming.Header). sloHold: the class's SLO is the hold of a
	// request that was given none (classify), not an SLO it must meet.
	class   admit.Class
	tenant  *tenant.Tenant
	grant   tenant.Grant
	header  HeaderSetter
	sloHold bool

	ticket    router.Ticket
	active    bool               // ticket is in a replica's ledger
	fallbacks []router.Candidate // not tried yet, best first: the tail of fbBuf
	fbBuf     []router.Candidate
	// tried are the replicas tried, in order; reranked says the fallbacks
	// were ranked again once used up (or are not to be: none holds it, or
	// a gateway sends the fallbacks); tag is the decision's arm
	// (Ticket.Tag), which fallbacks ranked again keep.
	tried     []string
	reranked  bool
	tag       int
	attempts  int
	last      *wire.Error // the last failed attempt's
	decideErr error
	// held carries admission's verdict to a request it held; ready says
	// admission dispatched it (Next hands the decision on).
	held  chan verdict
	ready bool
	// decided is when the router made the request's decision.
	decided time.Time
	// attempt is the Observer's id of the attempt a replica took (0: none
	// announced); tapID the Tap's of the request's decision.
	attempt uint64
	tapID   uint64

	// sent is when the attempt under way was sent, dispatched when the
	// first was (see sendAt).
	sent, dispatched, first, lastTok time.Time
	tokens, cached                   int
	// endTokens and endDecode are a complete answer's length and decode
	// time, for the Observer's Finished.
	endTokens        int
	endDecode        time.Duration
	completionTokens int
	done             bool // the final event was relayed
	// streamErr: the replica sent an error event in the stream (vLLM and
	// SGLang end a stream they fail with one, then [DONE]); streamFault:
	// the error blames the request.
	streamErr, streamFault bool

	blocks    []uint64
	blockEnds []int // a batch's chains' ends in blocks (policy.Request.BlockEnds)
	spliced   []byte
	// rewritten is the client's body with the model an alias stood for
	// (nil: not rewritten), in rewriteBuf; modelLabel the model of its
	// metrics; cacheModel the model its prompt's blocks are keyed by (an
	// adapter as BASE:ADAPTER, a base by its first name, however the
	// client named it); adapter says its model is a LoRA adapter.
	rewritten, rewriteBuf  []byte
	modelLabel, cacheModel string
	adapter                bool
	// longTail and longCounts are what is read of a streamed event too
	// long for the front end to hold (LongEventPart); longEnds: its head
	// says it is the answer's last (LongEvent).
	longTail   []byte
	longCounts wire.Counts
	longEnds   bool
	// ended: the stream's events said the answer ended without [DONE]
	// (ends), so that a stream that stops before it or [DONE] was broken
	// off (Ended).
	ended bool
	// pinned is the replica that stored the response the request names
	// (its previous_response_id, a path's id), which its first attempt
	// goes to; unpinned is what the decision allowed without it.
	pinned   string
	unpinned func(id string) bool
	// holder is the replica the first attempt was pinned to: its 404 for
	// the response is the last word (no other replica is tried).
	holder    string
	storedID  bool   // storedAs was told the answer's id
	named     string // the stored response the request names, if any
	kind      Kind
	rids      []string // its rids (Parsed.RID's), by which a client aborts it
	engineIDs []string // the ids vLLM's engine knows it by (readEngineIDs), matched exactly
	logID     string   // the access log's name for it (Incoming.LogID)
	sendID    string   // the X-Request-Id its replica is sent (SendID)

	tr reqTrace // see tracing.go
}

// Kind is what a request body is.
type Kind int

const (
	// Chat is a chat completion; Completion a legacy completion.
	Chat Kind = iota
	Completion
	// Input is another OpenAI request with its text in "input"
	// (embeddings, responses): routed on that text, or by load alone.
	Input
	// Opaque is a body gorgo does not read (an upload, an unknown
	// endpoint) but for a JSON object's "model": routed by load alone,
	// among the replicas of its model.
	Opaque
	// Generate is SGLang's native API (POST /generate): its text or
	// token ids are the prompt, and its answer is in SGLang's own shape
	// (wire.PeekNative).
	Generate
)

// begin reads a request body of the given kind; session is the client's
// session header (empty if none). The Request owns body until its end.
func (c *Core) begin(body []byte, kind Kind, session string, received time.Time, dry bool) (*Request, *wire.Error) {
	r, _ := c.pool.Get().(*Request)
	if r == nil {
		r = &Request{fbBuf: make([]router.Candidate, 0, c.cfg.Fallbacks)}
	}
	r.reset(c, received)
	r.kind = kind
	var err error
	switch kind {
	case Chat, Completion:
		err = c.cfg.Est.ParseRequest(body, kind == Chat, &r.Parsed)
		if err == nil && len(r.Parsed.Text) == 0 {
			err = errors.New("the prompt is empty")
		}
	case Input:
		err = c.cfg.Est.ParseInput(body, &r.Parsed)
	case Opaque:
		r.Parsed.Model = prompt.Model(body) // routed by load, but only where its model is
	case Generate:
		err = prompt.ParseGenerate(body, &r.Parsed)
	}
	if err != nil {
		r.release()
		return nil, badRequest(err)
	}
	r.readRIDs()
	est, text := c.cfg.Est, r.Parsed.Text
	// A chat's tools open its prompt and name its application; the keys
	// of its opening (simple session affinity's, the conversation's) are
	// its messages', images left out.
	opening, instructions := prompt.OpeningKeys(&r.Parsed, est)
	r.Route = policy.Request{
		SessionKey:      session,
		PrefixKey:       opening,
		InstructionsKey: instructions,
		ToolsKey:        prompt.ToolsKey(text, r.Parsed.Tools),
		PromptTokens:    est.Tokens(text),
		MaxOutputTokens: max(r.Parsed.MaxTokens, 0),
		MinOutputTokens: r.Parsed.MinTokens,
		Choices:         r.Parsed.Choices(),
		Unstreamed:      !r.Parsed.Stream,
	}
	if r.Route.SessionKey == "" {
		r.Route.SessionKey = r.Parsed.User
	}
	if e := r.resolveModel(kind, body, dry); e != nil {
		r.release()
		return nil, e
	}
	// The index is keyed by model, as the engines' caches are.
	// A batch's prompts are cached apart, each its own chain, as the
	// engine runs them: so many requests.
	r.blocks, r.blockEnds = r.blocks[:0], r.blockEnds[:0]
	start := 0
	for _, end := range r.Parsed.PromptEnds {
		r.blocks = est.Blocks(text[start:end], c.cfg.BlockTokens, r.blocks)
		r.blockEnds = append(r.blockEnds, len(r.blocks))
		start = end + 1 // past the newline that ends it
	}
	if len(r.blockEnds) == 0 {
		r.blocks = est.Blocks(text, c.cfg.BlockTokens, r.blocks)
	}
	r.blocks = prefix.Keyed(r.blocks, prefix.ModelKey(r.cacheModel))
	r.Route.Blocks, r.Route.BlockEnds = r.blocks, r.blockEnds
	r.Body = body
	if r.rewritten != nil {
		r.Body = r.rewritten
	}
	if r.Parsed.Stream && !r.Parsed.IncludeUsage && (kind == Chat || kind == Completion) {
		r.spliced = prompt.WithIncludeUsage(r.Body, r.spliced[:0])
		r.Body, r.HideUsage = r.spliced, true
	}
	return r, nil
}

func (r *Request) reset(c *Core, received time.Time) {
	*r = Request{core: c, Parsed: prompt.Request{Text: r.Parsed.Text[:0], Model: r.Parsed.Model, User: r.Parsed.User,
		Media: r.Parsed.Media[:0], PromptEnds: r.Parsed.PromptEnds[:0]},
		fbBuf: r.fbBuf[:0], tried: r.tried[:0], blocks: r.blocks[:0], blockEnds: r.blockEnds[:0], spliced: r.spliced[:0], Received: received, cached: -1, held: r.held,
		rewriteBuf: r.rewriteBuf[:0]}
}

// Stream reports whether the client asked for a stream.
func (r *Request) Stream() bool { return r.Parsed.Stream }

// next dispatches the request to its next replica: the router's choice on
// the first call, then its fallbacks in rank order, skipping those no
// longer available, until MaxAttempts replicas were tried. Fallbacks used
// up, the replicas not tried are ranked again, once: one may have come
// back since the decision (its ejection over), or joined. It returns the
// replica's id, or false when none is left; then failure says why.
func (r *Request) next() (string, bool) {
	if r.ready { // admission dispatched it
		r.ready = false
		if r.decideErr != nil {
			return "", false
		}
		r.announce()
		r.tap()
		r.tried = append(r.tried, r.ticket.ID)
		return r.ticket.ID, true
	}
	c := r.core
	if r.active || r.attempts >= c.cfg.MaxAttempts {
		return "", false
	}
	if r.attempts == 0 {
		start := time.Now()
		r.dispatch(c.Now(start), start)
		if r.decideErr != nil {
			return "", false
		}
		r.announce()
		r.tap()
		r.tried = append(r.tried, r.ticket.ID)
		return r.ticket.ID, true
	}
	for {
		for len(r.fallbacks) > 0 {
			fb := &r.fallbacks[0]
			t, ok := c.cfg.Router.Redispatch(c.Now(time.Now()), fb, &r.Route)
			r.fallbacks = r.fallbacks[1:]
			if ok {
				r.ticket, r.active = t, true
				r.attempts++
				r.announce()
				r.tried = append(r.tried, t.ID)
				return t.ID, true
			}
		}
		if r.reranked {
			return "", false
		}
		r.rerank(c.Now(time.Now()))
	}
}

// rerank ranks the replicas not tried yet as the request's fallbacks.
// They are the same decision's, so of its arm: a learning policy's Decide,
// asked again, took another arm's turn (its alternation shifts by one,
// rarely), and the outcome is timed from the first attempt.
func (r *Request) rerank(now time.Duration) {
	r.reranked = true
	c, tried, allowed := r.core, r.tried, r.Route.Allowed
	r.Route.Allowed = func(id string) bool { return !slices.Contains(tried, id) && (allowed == nil || allowed(id)) }
	r.fallbacks, _ = c.cfg.Router.Rank(now, &r.Route, c.rng, r.fbBuf[:0])
	r.Route.Allowed = allowed
	for k := range r.fallbacks {
		r.fallbacks[k].Tag = r.tag
	}
}

// pin sends the request's first attempt to the replica that stored the
// response stored (a responses request's previous_response_id, or the id
// in its path), if the router knows it and it is available and allowed;
// else the request goes where the policy sends it. allowed is what the
// decision allows otherwise (nil: any replica).
func (r *Request) pin(stored string, allowed func(id string) bool) {
	if stored == "" {
		return
	}
	id, ok := r.core.cfg.Router.Holder(stored)
	if !ok || allowed != nil && !allowed(id) {
		return
	}
	r.pinned, r.unpinned = id, allowed
	r.Route.Allowed, r.Route.Holder = func(x string) bool { return x == id }, id
}

// storedAs records that the answer is the response id, which its replica
// stores: a follow-up that names it goes there (Router.Stored), this
// router's and, through the Observer, the others'. The first id of an
// answer counts.
func (r *Request) storedAs(id string) {
	if id == "" || r.storedID || r.ticket.ID == "" {
		return
	}
	r.storedID = true
	r.core.cfg.Router.Stored(id, r.ticket.ID)
	if o := r.core.cfg.Observer; o != nil {
		o.Stored(id, r.ticket.ID)
	}
}

// tap shows the request's decision to the Tap (the live view), if any,
// whether admission dispatched it or the request's first attempt did.
func (r *Request) tap() {
	if t := r.core.cfg.Tap; t != nil {
		r.tapID = t.Decided(r.decided, &r.Route, &r.ticket, r.fallbacks)
	}
}

// dispatch makes the router's decision at now (start on the wall clock):
// the ticket of the chosen replica, and the ranked fallbacks.
func (r *Request) dispatch(now time.Duration, start time.Time) {
	c := r.core
	if c.adm != nil {
		r.Route.TTFTBudgetMS = c.cfg.Admission.TTFTBudget(r.class, c.Now(r.Received), now)
	}
	t, fb, err := c.cfg.Router.Dispatch(now, &r.Route, c.rng, r.fbBuf[:0])
	if err != nil && r.pinned != "" { // its holder left since: wherever the policy says
		r.pinned, r.Route.Allowed = "", r.unpinned
		t, fb, err = c.cfg.Router.Dispatch(now, &r.Route, c.rng, r.fbBuf[:0])
	}
	if err == nil && r.pinned != "" {
		// The others, ranked as the policy would, are its fallbacks: if
		// the holder fails, another may hold the response too (a store
		// the replicas share), or answer that it does not; and a gateway
		// that is given the list can try them itself.
		held, allowed := r.pinned, r.unpinned
		// The holder was not the policy's choice: its outcome measures
		// no arm of a tuner (policy.Learner ignores a negative tag).
		t.Tag = -1
		r.Route.Allowed = func(id string) bool { return id != held && (allowed == nil || allowed(id)) }
		fb, _ = c.cfg.Router.Rank(now, &r.Route, c.rng, r.fbBuf[:0])
		r.pinned, r.holder, r.Route.Allowed = "", held, allowed
	}
	c.cfg.Metrics.decisionTime(time.Since(start))
	r.decided = start
	r.traceDecision(start, &t, fb, err)
	if err != nil {
		r.decideErr = err
		return
	}
	r.fallbacks = fb
	r.ticket, r.active, r.attempts, r.tag = t, true, 1, t.Tag
}

// Fallbacks returns the replicas ranked after the current attempt's, best
// first, that Next has not tried yet.
func (r *Request) Fallbacks() []router.Candidate { return r.fallbacks }

// Replica returns the id of the replica of the current attempt.
func (r *Request) Replica() string { return r.ticket.ID }

// Began reports whether the answer's first token came.
func (r *Request) Began() bool { return r.tokens > 0 }

// Forecast is when the router expected the attempt's first token, from
// its sending: Predict's forecast there with its margin (a long prompt's
// prefill, the replica's queue), 0 if it had none.
func (r *Request) Forecast() time.Duration {
	ms := r.ticket.Forecast + r.ticket.Margin
	if !(ms > 0) || ms > 1e9 { // none, or not a number; a forecast past 11 days is none either
		return 0
	}
	return time.Duration(ms * 1e6)
}

// failed records that the current attempt failed before anything reached
// the client: the replica is free of it, and next may try another. A
// replica that broke it (it refused, hung, broke, answered 5xx) has it
// count against its health; a busy one (503, 429) does not, one that
// said it does not serve the model loses the model, and one without the
// request's endpoint is passed over for it.
func (r *Request) failed(e *AttemptError) {
	c := r.core
	r.free()
	if !e.NotHeld && !e.NoEndpoint || r.last == nil { // a holder's or a server's failure says more than another's "not found"
		r.last = &e.Error
	}
	if e.NotHeld && r.ticket.ID == r.holder {
		// The replica that answered it does not hold it (its store is
		// off, or lost with a restart): nor does any other, which a store
		// they shared would have answered it from.
		r.fallbacks, r.reranked = nil, true
	}
	c.cfg.Metrics.retried(r.ticket.ID)
	current := c.cfg.Router.Current(&r.ticket) // else replaced since: not its successor's doing
	if e.Busy && current {
		now := time.Now()
		c.cfg.Router.Busy(r.ticket.ID, c.Now(now), wire.RetryWait(e.RetryAfter, now))
	}
	if e.NoEndpoint && current {
		c.cfg.Router.Lacks(r.ticket.ID, r.Route.Endpoint, c.Now(time.Now()))
	}
	switch {
	case c.cfg.Health == nil, !current:
	case e.ModelMissing:
		c.cfg.Health.ModelMissing(r.ticket.ID, r.Route.Model)
	case e.Broken:
		c.cfg.Health.Failure(r.ticket.ID)
	}
}

// failure is why no replica served the request, once next returned false.
func (r *Request) failure() *wire.Error {
	switch {
	case r.last != nil:
		e := *r.last
		if e.RetryAfter == "" && (e.Status == statusUnavailable || e.Status == statusTooMany) {
			e.RetryAfter = "1"
		}
		return &e
	case r.decideErr != nil && !errors.Is(r.decideErr, policy.ErrNoReplica):
		return wire.Errorf(statusInternal, "routing failed: %v", r.decideErr)
	}
	e := wire.Errorf(statusUnavailable, "no available replica")
	e.RetryAfter = "5"
	return e
}

// accepted records that the replica took the request (its answer is being
// relayed): its prompt now enters the replica's share of the prefix index.
func (r *Request) accepted() {
	c := r.core
	c.cfg.Router.Accepted(&r.ticket, &r.Route)
	c.cfg.Metrics.decided(r.ticket.Terms)
	if c.cfg.Observer != nil && r.attempt != 0 {
		c.cfg.Observer.Accepted(r.attempt)
	}
}

// free takes the current attempt out of the replica's ledger (it failed,
// or the request ended): admission hears the fleet changed, and the
// Observer that the attempt ended.
func (r *Request) free() {
	if !r.active {
		return
	}
	c := r.core
	c.cfg.Router.Finish(&r.ticket)
	c.kickAdmission()
	r.announceEnd()
	r.active = false
}

// announce tells the Observer that the current attempt went to its
// replica: at dispatch, so that other routers count it while it is
// prefilled (a non-streaming answer's headers come only with its end).
func (r *Request) announce() {
	if c := r.core; c.cfg.Observer != nil && r.attempt == 0 {
		r.attempt = c.ids.Add(1)
		c.cfg.Observer.Dispatched(r.attempt, r.ticket.ID, r.ticket.RTT, &r.Route)
	}
}

// announceEnd tells the Observer that the announced attempt ended, with
// the answer's length and decode time when it completed (see report).
func (r *Request) announceEnd() {
	if r.attempt != 0 {
		r.core.cfg.Observer.Finished(r.attempt, r.endTokens, r.endDecode)
		r.attempt = 0
		r.endTokens, r.endDecode = 0, 0
	}
}

// Chunk takes one streamed event of the answer, read at at.
func (r *Request) Chunk(p *wire.Peek, at time.Time) {
	if p.Token {
		if r.first.IsZero() {
			c := r.core
			r.first = at
			r.traceFirstToken(at)
			ttft := at.Sub(r.sent)
			c.cfg.Router.FirstToken(&r.ticket, ttft)
			c.cfg.Metrics.forecast(r.ticket.ID, float64(ttft)/1e6 <= r.ticket.Forecast+r.ticket.Margin)
			c.kickAdmission()
			if r.attempt != 0 {
				c.cfg.Observer.FirstToken(r.attempt)
			}
		}
		r.lastTok = at
		r.tokens++
	}
	if p.Usage {
		r.completionTokens = p.CompletionTokens
		if p.CachedTokens >= 0 {
			r.cached = p.CachedTokens
		}
	}
	if p.ResponseID != "" && !r.storedID {
		r.storedAs(strings.Clone(p.ResponseID))
	}
	r.ended = r.ended || r.ends(p)
}

// StreamError records that the stream carried an error event (requestFault:
// one that blames the request, wire.RequestFault): the answer is broken
// even if the stream then ends as a whole one does.
func (r *Request) StreamError(requestFault bool) {
	r.streamErr, r.streamFault = true, r.streamFault || requestFault
}

// AnswersJSON reports whether a whole answer to the request is a JSON
// value (a chat, a completion, SGLang's /generate, embeddings, responses),
// as a body gorgo does not read (an upload's, a transcription's text) need
// not be.
func (r *Request) AnswersJSON() bool { return r.kind != Opaque }

// Format is how the request's answer is written: SGLang's native API's
// for Generate, else the OpenAI API's.
func (r *Request) Format() wire.Format {
	if r.kind == Generate {
		return wire.Native
	}
	return wire.OpenAI
}

// Names is the id of the stored response the request names (its
// previous_response_id, or its path's), "" for none: a 404 to it says the
// replica does not hold it (AttemptError.NotHeld).
func (r *Request) Names() string { return r.named }

// AnswerHead reads the first bytes (or all) of a whole answer its replica
// sent with a 200: a Responses API answer's id (wire.ResponseID), which
// its replica stores, whether the client takes the answer or not.
func (r *Request) AnswerHead(head []byte) {
	if r.kind == Input && !r.storedID {
		r.storedAs(wire.ResponseID(head))
	}
}

// LongEvent reads the start of a streamed event too long for the front
// end to hold: a Responses API event carries the whole response (vLLM's
// echoes the request's instructions and tools), whose id comes first.
func (r *Request) LongEvent(ev []byte) {
	if r.Format() == wire.Native {
		return
	}
	var scratch []byte
	p := wire.PeekChunk(wire.EventData(ev, &scratch))
	r.longEnds = p.End // a Responses API stream's last event (it repeats the answer), by its type
	if r.kind != Input || r.storedID {
		return
	}
	if id := p.ResponseID; id != "" {
		r.storedAs(strings.Clone(id))
	}
}

// LongEventPart hands the lifecycle the next piece of a streamed event too
// long for the front end to hold, as it passes (the first piece, its head,
// too); LongEventEnd reads its counts once it has passed: SGLang's native
// chunks carry the whole text so far and their counts (meta_info) after
// it, perhaps followed by the log-probabilities of every token
// (wire.Counts finds them as they pass); a Responses API event, the whole
// response, has its usage in its last bytes (wire.KeepTail). The counts
// found are the answer's so far. What is kept is bounded: the last
// wire.TailBytes and a few bytes more.
func (r *Request) LongEventPart(b []byte) {
	if r.Format() == wire.Native {
		r.longCounts.Feed(b)
		return
	}
	r.longTail = wire.KeepTail(r.longTail, b)
}

// LongEventEnd: see LongEventPart. An event whose head said it was the
// answer's last but for [DONE] ends the answer (Ended).
func (r *Request) LongEventEnd() {
	c, cached := 0, -1
	if r.Format() != wire.Native {
		c, cached = r.Format().Tail(r.longTail)
	} else if n, k, ok := r.longCounts.Last(); ok {
		c, cached = n, k
	}
	r.longCounts.Reset()
	r.longTail = r.longTail[:0]
	if c > 0 {
		r.completionTokens = c
		if cached >= 0 {
			r.cached = cached
		}
	}
	r.ended = r.ended || r.longEnds
	r.longEnds = false
}

// Ended reports whether the stream's events said the answer ended: its
// [DONE] (Done), or a chunk that ends it without one (ends). A stream that
// stops before either was broken off: its front end says ErrNoEnd.
func (r *Request) Ended() bool { return r.ended || r.done }

// ErrNoEnd is a stream the replica closed before its [DONE] and without a
// final event (Ended): an answer broken off (a graceful shutdown's, a
// sidecar's), charged to the replica as a cut one is.
var ErrNoEnd = errors.New("the stream ended before its final event")

// ends reports whether a streamed chunk ends the answer without [DONE]:
// its end (an OpenAI stream's usage chunk, a Responses API stream's last
// event), an error, or, for a request of one sequence, its finish (a
// finish is one choice's: of several, the others may go on). A stream
// that stops before such a chunk or [DONE] was broken off.
func (r *Request) ends(p *wire.Peek) bool {
	return p.End || p.Error || p.Finish && r.Route.Sequences() == 1
}

// AnswerPart hands the lifecycle each piece of a whole (unstreamed) answer
// too long for the front end to hold, as it passes; AnswerEnd, given its
// last bytes, completes the request with its counts: an SGLang answer's
// as they passed (its meta_info's counts may be followed by every token's
// log-probability, more than any tail holds: wire.Counts), else those its
// last bytes say. (A batch's answers too long to hold are counted as the
// last one.)
func (r *Request) AnswerPart(b []byte) {
	if r.Format() == wire.Native {
		r.longCounts.Feed(b)
	}
}

// AnswerEnd: see AnswerPart.
func (r *Request) AnswerEnd(tail []byte) {
	n, cached, ok := r.longCounts.Last()
	r.longCounts.Reset()
	if !ok {
		n, cached = r.Format().Tail(tail)
	}
	r.Complete(n, cached)
}

// SendID is the X-Request-Id a front end sends the replica (empty: the
// client's own goes, or its body names the request): the id the client is
// answered with, where the client named the request nowhere.
func (r *Request) SendID() string { return r.sendID }

// Done records that the stream's final event ([DONE]) was relayed: the
// request is complete whatever the client does next.
func (r *Request) Done() { r.done = true }

// Complete takes a whole non-streaming answer's usage (cached -1 if not
// reported).
func (r *Request) Complete(completionTokens, cached int) {
	r.completionTokens, r.cached = completionTokens, cached
	r.done = true
}

// Discard recycles a request that was only read (a dry run, see DryRun).
func (r *Request) Discard() { r.release() }

// pooledBytes is the largest buffer a recycled Request keeps: one huge
// prompt must not pin its memory for the life of the process.
const pooledBytes = 1 << 20

func (r *Request) release() {
	r.Body = nil
	if cap(r.Parsed.Text) > pooledBytes || cap(r.spliced) > pooledBytes || cap(r.blocks) > pooledBytes/8 || cap(r.blockEnds) > pooledBytes/8 || cap(r.rewriteBuf) > pooledBytes ||
		cap(r.Parsed.Media) > pooledBytes/8 || cap(r.Parsed.PromptEnds) > pooledBytes/8 {
		r.Parsed.Text, r.spliced, r.blocks, r.blockEnds, r.rewriteBuf = nil, nil, nil, nil, nil
		r.Parsed.Media, r.Parsed.PromptEnds = nil, nil
	}
	r.core.pool.Put(r)
}
