// Package lifecycle owns one request's life through a gorgo router, apart
// from any transport: it reads the request from its body bytes and a few
// header values, asks the router for a replica and its ranked fallbacks,
// records each attempt, takes the upstream's events (first token, usage with
// cached tokens, finish, errors) and feeds them back to the router, the
// online learner, the metrics and the access log. The HTTP proxy (gorgo
// serve) is a thin adapter over it; so is any other front end.
//
// Concurrency: a Core is safe for concurrent use; a Request belongs to one
// goroutine (its front end's handler) from Begin to End.
package lifecycle

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// PrefixKeyTokens is how many leading prompt tokens simple session affinity
// hashes (the paper's 256).
const PrefixKeyTokens = 256

// Health hears how replicas do: attempts that failed through a replica's
// fault (it refused, hung, broke, or answered 5xx other than 503), and
// requests it served.
type Health interface {
	Failure(id string)
	Success(id string)
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
}

// Tap hears of each request's first decision (the chosen replica and the
// ranked fallbacks, with their cost terms) and of its end. Decided returns
// an id handed back to Ended; its methods must not block.
type Tap interface {
	Decided(at time.Time, req *policy.Request, chosen *router.Ticket, fallbacks []router.Candidate) uint64
	Ended(id uint64, replica string, status int, ttft, e2e time.Duration)
}

// Observer hears of every attempt: Dispatched when the router sent it to a
// replica (with the request's view), FirstToken, and Finished when it
// ended, however. Its methods must not block.
type Observer interface {
	Dispatched(id uint64, replica string, req *policy.Request)
	FirstToken(id uint64)
	Finished(id uint64)
}

// Core is what the requests of one front end share.
type Core struct {
	Config
	// rng is used only inside Router.Dispatch, which serialises decisions.
	rng  *rand.Rand
	pool sync.Pool
	adm  *admission // nil without an SLO
	ids  atomic.Uint64
}

// NewCore returns a Core.
func NewCore(cfg Config) *Core {
	c := &Core{Config: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x4f1bbcdcbfa53e0a))}
	c.MaxAttempts = max(c.MaxAttempts, 1)
	if c.Fallbacks <= 0 {
		c.Fallbacks = c.MaxAttempts - 1
	}
	if cfg.Admission.SLO > 0 {
		c.adm = &admission{gate: admit.New[*Request](cfg.Admission), kick: make(chan struct{}, 1)}
	}
	return c
}

// Now is the router's clock at t.
func (c *Core) Now(t time.Time) time.Duration { return t.Sub(c.Start) }

// Error is why a request could not be served, in OpenAI's terms: an HTTP
// status, an error type and a message for the client, and for a busy
// replica its Retry-After.
type Error struct {
	Status     int
	Type       string
	Message    string
	RetryAfter string
}

func (e *Error) Error() string { return e.Message }

func badRequest(err error) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "BadRequestError", Message: err.Error()}
}

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

	ticket    router.Ticket
	active    bool               // ticket is in a replica's ledger
	fallbacks []router.Candidate // not tried yet, best first: the tail of fbBuf
	fbBuf     []router.Candidate
	attempts  int
	last      *Error // the last failed attempt's
	decideErr error
	// held carries admission's verdict to a request it held; ready says
	// admission dispatched it (Next hands the decision on).
	held  chan verdict
	ready bool
	// attempt is the Observer's id of the attempt a replica took (0: none
	// announced); tapID the Tap's of the request's decision.
	attempt uint64
	tapID   uint64

	sent, first, lastTok time.Time
	tokens, cached       int
	completionTokens     int
	done                 bool // the final event was relayed

	blocks  []uint64
	spliced []byte
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
	// endpoint): routed by load alone.
	Opaque
)

// Begin reads a request body of the given kind; session is the client's
// session header (empty if none). The Request owns body until End.
func (c *Core) Begin(body []byte, kind Kind, session string, received time.Time) (*Request, *Error) {
	r, _ := c.pool.Get().(*Request)
	if r == nil {
		r = &Request{fbBuf: make([]router.Candidate, 0, c.Fallbacks)}
	}
	r.reset(c, received)
	var err error
	switch kind {
	case Chat, Completion:
		err = prompt.ParseRequest(body, kind == Chat, &r.Parsed)
		if err == nil && len(r.Parsed.Text) == 0 {
			err = errors.New("the prompt is empty")
		}
	case Input:
		err = prompt.ParseInput(body, &r.Parsed)
	}
	if err != nil {
		r.release()
		return nil, badRequest(err)
	}
	text := r.Parsed.Text
	r.blocks = c.Est.Blocks(text, c.BlockTokens, r.blocks[:0])
	r.Route = policy.Request{
		SessionKey:      session,
		PrefixKey:       xxhash.Sum64(text[:min(len(text), c.Est.Bytes(PrefixKeyTokens))]),
		PromptTokens:    c.Est.Tokens(text),
		Blocks:          r.blocks,
		MaxOutputTokens: max(r.Parsed.MaxTokens, 0),
	}
	if r.Route.SessionKey == "" {
		r.Route.SessionKey = r.Parsed.User
	}
	r.Body = body
	if r.Parsed.Stream && !r.Parsed.IncludeUsage && (kind == Chat || kind == Completion) {
		r.spliced = prompt.WithIncludeUsage(body, r.spliced[:0])
		r.Body, r.HideUsage = r.spliced, true
	}
	return r, nil
}

func (r *Request) reset(c *Core, received time.Time) {
	*r = Request{core: c, Parsed: prompt.Request{Text: r.Parsed.Text[:0], Model: r.Parsed.Model, User: r.Parsed.User},
		fbBuf: r.fbBuf[:0], blocks: r.blocks[:0], spliced: r.spliced[:0], Received: received, cached: -1, held: r.held}
}

// Stream reports whether the client asked for a stream.
func (r *Request) Stream() bool { return r.Parsed.Stream }

// Next dispatches the request to its next replica: the router's choice on
// the first call, then its fallbacks in rank order, skipping those no
// longer available, until MaxAttempts replicas were tried. It returns the
// replica's id, or false when none is left; then Failure says why.
func (r *Request) Next() (string, bool) {
	if r.ready { // admission dispatched it
		r.ready = false
		if r.decideErr != nil {
			return "", false
		}
		r.announce()
		return r.ticket.ID, true
	}
	if r.active || r.attempts >= r.core.MaxAttempts {
		return "", false
	}
	c := r.core
	if r.attempts == 0 {
		start := time.Now()
		t, fb, err := c.Router.Dispatch(c.Now(start), &r.Route, c.rng, r.fbBuf[:0])
		if c.Metrics != nil {
			c.Metrics.decision.Observe(time.Since(start).Seconds())
		}
		if err != nil {
			r.decideErr = err
			return "", false
		}
		r.fallbacks = fb
		r.ticket, r.active, r.attempts = t, true, 1
		r.announce()
		if c.Tap != nil {
			r.tapID = c.Tap.Decided(start, &r.Route, &r.ticket, fb)
		}
		return t.ID, true
	}
	for len(r.fallbacks) > 0 {
		fb := &r.fallbacks[0]
		t, ok := c.Router.Redispatch(c.Now(time.Now()), fb, &r.Route)
		r.fallbacks = r.fallbacks[1:]
		if ok {
			r.ticket, r.active = t, true
			r.attempts++
			r.announce()
			return t.ID, true
		}
	}
	return "", false
}

// Fallbacks returns the replicas ranked after the current attempt's, best
// first, that Next has not tried yet.
func (r *Request) Fallbacks() []router.Candidate { return r.fallbacks }

// Replica returns the id of the replica of the current attempt.
func (r *Request) Replica() string { return r.ticket.ID }

// Sent records when the current attempt's request left for the replica.
func (r *Request) Sent(at time.Time) { r.sent = at }

// Failed records that the current attempt failed before anything reached
// the client: the replica is free of it, and Next may try another. broken
// says the failure was the replica's fault (it counts against its health);
// a busy replica (503, 429) is not broken.
func (r *Request) Failed(e *Error, broken bool) {
	c := r.core
	c.Router.Finish(&r.ticket)
	c.kickAdmission()
	r.announceEnd()
	r.active = false
	r.last = e
	if c.Metrics != nil {
		c.Metrics.retries.WithLabelValues(r.ticket.ID).Inc()
	}
	if broken && c.Health != nil {
		c.Health.Failure(r.ticket.ID)
	}
}

// Failure is why no replica served the request, once Next returned false.
func (r *Request) Failure() *Error {
	switch {
	case r.last != nil:
		e := *r.last
		if e.RetryAfter == "" && (e.Status == http.StatusServiceUnavailable || e.Status == http.StatusTooManyRequests) {
			e.RetryAfter = "1"
		}
		return &e
	case r.decideErr != nil && !errors.Is(r.decideErr, policy.ErrNoReplica):
		return &Error{Status: http.StatusInternalServerError, Type: "InternalServerError", Message: "routing failed: " + r.decideErr.Error()}
	}
	return &Error{Status: http.StatusServiceUnavailable, Type: "ServiceUnavailableError", Message: "no available replica", RetryAfter: "5"}
}

// Accepted records that the replica took the request (its answer is being
// relayed): its prompt now enters the replica's share of the prefix index.
func (r *Request) Accepted() {
	c := r.core
	c.Router.Accepted(&r.ticket, &r.Route)
	c.Metrics.decided(r.ticket.Terms)
}

// announce tells the Observer that the current attempt went to its
// replica: at dispatch, so that other routers count it while it is
// prefilled (a non-streaming answer's headers come only with its end).
func (r *Request) announce() {
	if c := r.core; c.Observer != nil && r.attempt == 0 {
		r.attempt = c.ids.Add(1)
		c.Observer.Dispatched(r.attempt, r.ticket.ID, &r.Route)
	}
}

// announceEnd tells the Observer that the announced attempt ended.
func (r *Request) announceEnd() {
	if r.attempt != 0 {
		r.core.Observer.Finished(r.attempt)
		r.attempt = 0
	}
}

// Chunk takes one streamed event of the answer, read at at.
func (r *Request) Chunk(p *wire.Peek, at time.Time) {
	if p.Token {
		if r.first.IsZero() {
			r.first = at
			r.core.Router.FirstToken(&r.ticket, at.Sub(r.sent))
			r.core.kickAdmission()
			if r.attempt != 0 {
				r.core.Observer.FirstToken(r.attempt)
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
}

// Done records that the stream's final event ([DONE]) was relayed: the
// request is complete whatever the client does next.
func (r *Request) Done() { r.done = true }

// Complete takes a whole non-streaming answer's usage (cached -1 if not
// reported).
func (r *Request) Complete(completionTokens, cached int) {
	r.completionTokens, r.cached = completionTokens, cached
	r.done = true
}

// Outcome is how a request ended, for End.
type Outcome struct {
	// Status is the replica's HTTP status.
	Status int
	// ClientGone: the client went away before the answer was complete.
	ClientGone bool
	// Err is the upstream's failure after the answer started (a broken or
	// stalled stream); nil if it ended well.
	Err error
}

// End closes the request at at: the replica's ledger is freed, its cached
// report corrects the index, the learner hears the outcome, and the metrics
// and the access log record it. It returns the status to log (499 for a
// client that left, 502 for a broken answer) and recycles the Request: do
// not use it after.
func (r *Request) End(o Outcome, at time.Time) int {
	c := r.core
	status := o.Status
	switch {
	case r.done: // complete, whatever the client or the replica does now
		o.Err = nil
	case o.ClientGone:
		status = 499
	case o.Err != nil:
		status = http.StatusBadGateway
		if c.Health != nil {
			c.Health.Failure(r.ticket.ID)
		}
	}
	if r.active {
		if status == http.StatusOK && r.done {
			// The token gap only from a stream of at least two token
			// events; the length from any complete answer.
			var decode time.Duration
			if r.tokens > 1 {
				decode = r.lastTok.Sub(r.first)
			}
			c.Router.Decoded(&r.ticket, r.outputTokens(), decode)
		}
		c.Router.Finish(&r.ticket)
		c.kickAdmission()
		r.announceEnd()
		if r.cached >= 0 && status == http.StatusOK {
			c.Router.CachedReport(&r.ticket, r.cached)
		}
	}
	id := r.ticket.ID
	ok := status == http.StatusOK
	if ok && c.Health != nil {
		c.Health.Success(id)
	}
	if m := c.Metrics; m != nil {
		m.requests.WithLabelValues(id, statusText(status)).Inc()
		if ok {
			m.e2e.WithLabelValues(id).Observe(at.Sub(r.Received).Seconds())
			if !r.first.IsZero() {
				m.ttft.WithLabelValues(id).Observe(r.first.Sub(r.Received).Seconds())
			}
		}
	}
	// Only a stream says when its first token came: a non-streaming answer
	// is timed by its end, which is no TTFT.
	if l, isLearner := c.Router.Policy().(policy.Learner); isLearner && r.Parsed.Stream && r.active && status != 499 {
		out := policy.Outcome{Failed: !ok || r.first.IsZero()}
		if !out.Failed {
			out.TTFT, out.E2E = r.first.Sub(r.sent), at.Sub(r.sent)
			if r.tokens > 1 {
				out.ITL = r.lastTok.Sub(r.first) / time.Duration(r.tokens-1)
			}
		}
		l.Learn(r.ticket.Tag, out)
	}
	if c.Tap != nil && r.tapID != 0 {
		var ttft time.Duration
		if !r.first.IsZero() {
			ttft = r.first.Sub(r.Received)
		}
		c.Tap.Ended(r.tapID, id, status, ttft, at.Sub(r.Received))
	}
	if c.Log != nil {
		attrs := []any{"replica", id, "status", status, "stream", r.Parsed.Stream, "prompt_tokens", r.Route.PromptTokens,
			"est_cached_tokens", r.ticket.EstCachedTokens, "cached_tokens", r.cached, "output_tokens", r.outputTokens(),
			"attempts", r.attempts, "e2e_ms", ms(at.Sub(r.Received))}
		if !r.first.IsZero() {
			attrs = append(attrs, "ttft_ms", ms(r.first.Sub(r.Received)))
		}
		if o.Err != nil {
			attrs = append(attrs, "error", o.Err.Error())
		}
		c.Log.Info("request", attrs...)
	}
	r.release()
	return status
}

// Reject closes a request no replica served (after Next returned false):
// it records the failure and recycles the Request.
func (r *Request) Reject(e *Error) {
	c := r.core
	if c.Metrics != nil {
		c.Metrics.requests.WithLabelValues("", statusText(e.Status)).Inc()
	}
	if c.Log != nil {
		c.Log.Info("request", "replica", "", "status", e.Status, "stream", r.Parsed.Stream, "prompt_tokens", r.Route.PromptTokens,
			"attempts", r.attempts, "error", e.Message)
	}
	r.release()
}

// Abandon closes a request whose client went away while no replica was
// serving it.
func (r *Request) Abandon() {
	if r.active {
		r.core.Router.Finish(&r.ticket)
		r.core.kickAdmission()
		r.announceEnd()
		r.active = false
	}
	if m := r.core.Metrics; m != nil {
		m.requests.WithLabelValues(r.ticket.ID, "499").Inc()
	}
	r.release()
}

// Discard recycles a request that was only read (a dry run); call it
// before Next.
func (r *Request) Discard() { r.release() }

// pooledBytes is the largest buffer a recycled Request keeps: one huge
// prompt must not pin its memory for the life of the process.
const pooledBytes = 1 << 20

func (r *Request) release() {
	r.Body = nil
	if cap(r.Parsed.Text) > pooledBytes || cap(r.spliced) > pooledBytes || cap(r.blocks) > pooledBytes/8 {
		r.Parsed.Text, r.spliced, r.blocks = nil, nil, nil
	}
	r.core.pool.Put(r)
}

func (r *Request) outputTokens() int {
	if r.completionTokens > 0 {
		return r.completionTokens
	}
	return r.tokens
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

var statusTexts sync.Map // int -> string

func statusText(code int) string {
	if s, ok := statusTexts.Load(code); ok {
		return s.(string)
	}
	s := fmt.Sprint(code)
	statusTexts.Store(code, s)
	return s
}
