package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/httpapi"
	"github.com/gorgo-llm/gorgo/internal/lifecycle"
	"github.com/gorgo-llm/gorgo/internal/tenant"
	"github.com/gorgo-llm/gorgo/internal/tracing"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// handleCompletion serves POST /v1/chat/completions (Chat),
// /v1/completions (Completion), /v1/embeddings and /v1/responses (Input),
// and any other POST under /v1 (Opaque: routed by load alone).
func (s *Server) handleCompletion(kind lifecycle.Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		received := time.Now()
		cfg := s.cfg.Load()
		core := s.fleet.Core()
		body := httpapi.GetBuffer()
		defer s.putBody(body)
		if err := s.readBody(w, r, body, cfg); err != nil {
			e := httpapi.BodyError(err)
			core.Refused(e, w.Header().Get("X-Request-Id"))
			httpapi.WriteError(w, e)
			return
		}
		x := exchange{s: s, cfg: cfg, w: w, r: r}
		in := lifecycle.Incoming{Body: *body, Kind: kind, Session: r.Header.Get(SessionHeader), RequestID: r.Header.Get("X-Request-Id"), LogID: w.Header().Get("X-Request-Id"), MadeID: r.Header.Get("X-Request-Id") == "",
			Received: received, Stored: wire.StoredID(r.URL.Path), Endpoint: r.URL.Path,
			Ask:    tenant.Ask{Priority: r.Header.Get(tenant.PriorityHeader), TTFTSLO: r.Header.Get(tenant.TTFTSLOHeader), TPOTSLO: r.Header.Get(tenant.TPOTSLOHeader)},
			Header: w.Header()}
		var err error
		if in.Tenant, err = cfg.TenantHeader.Name(clientKey(r), r.Header.Get(tenant.TenantHeader)); err != nil {
			e := wire.Errorf(http.StatusBadRequest, "%v", err)
			core.Refused(e, w.Header().Get("X-Request-Id"))
			httpapi.WriteError(w, e)
			return
		}
		if core.Tracing() {
			in.Parent = tracing.Parent(r.Header.Get("Traceparent"), strings.Join(r.Header.Values("Tracestate"), ","))
		}
		status := core.Serve(r.Context(), in, &x)
		if status == http.StatusBadGateway && x.relayed && !x.clientGone && x.cut {
			panic(http.ErrAbortHandler) // headers are out: cut the stream, don't fake its end
		}
	}
}

// readBody reads the request's body into body within read_body_timeout,
// taking its memory from max_body_bytes_in_flight (putBody gives it back
// and recycles the buffer); the deadline covers the body alone, lifted as
// soon as it is read (the answer may take far longer).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, body *[]byte, cfg *Config) error {
	if cfg.ReadBodyTimeout > 0 {
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(cfg.ReadBodyTimeout)) // writers that cannot go without
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	err := httpapi.ReadBody(r, body, cfg.MaxBodyBytes, &s.bodies)
	if errors.Is(err, httpapi.ErrBodyBudget) {
		s.m.refused.WithLabelValues("max_body_bytes_in_flight").Inc()
	}
	return err
}

// putBody gives back a body's memory to max_body_bytes_in_flight and
// recycles its buffer.
func (s *Server) putBody(body *[]byte) {
	s.bodies.Give(cap(*body))
	httpapi.PutBuffer(body)
}

// exchange is one client request as the lifecycle sees this front end
// (lifecycle.FrontEnd): attempts forwarded to replicas, the answer relayed
// to the client, refusals in OpenAI's shape.
type exchange struct {
	s   *Server
	cfg *Config
	w   http.ResponseWriter
	r   *http.Request
	a   *answer // the accepted attempt's
	// relayed: the answer's headers went out; clientGone: the client left
	// before its end; cut: the replica's answer broke off (an answer that
	// ended whole, an error event in it, is not cut).
	relayed, clientGone, cut bool
}

func (x *exchange) Send(ctx context.Context, req *lifecycle.Request, id string) (int, *lifecycle.AttemptError) {
	u := x.s.fleet.Upstream(id)
	if u == nil { // left between the decision and now
		return 0, &lifecycle.AttemptError{Error: *wire.Errorf(http.StatusServiceUnavailable, "%s left the fleet", id)}
	}
	a, err := x.s.attempt(x.r, u, req, x.cfg)
	if err != nil {
		if ctx.Err() == nil {
			u.LogAttempt(func() {
				x.s.log.Warn("attempt failed", "replica", id, "status", err.Status, "error", err.cause, "note", "logged at most every 10 s per replica")
			})
		}
		return 0, &err.AttemptError
	}
	x.a = a
	return a.resp.StatusCode, nil
}

func (x *exchange) Relay(req *lifecycle.Request) lifecycle.Outcome {
	x.relayed = true
	out := x.s.relay(x.w, x.r, x.a, req, x.cfg)
	x.clientGone, x.cut = out.ClientGone, out.Err != nil
	return out
}

func (x *exchange) Refuse(e *wire.Error) { httpapi.WriteError(x.w, e) }

// attemptError is why an attempt on a replica failed before anything was
// sent to the client.
type attemptError struct {
	// AttemptError is what the lifecycle hears: the client's error, and
	// whether the failure counts against the replica (it refused, hung,
	// broke, or answered 5xx; a 503 or 429 only says it is busy).
	lifecycle.AttemptError
	// cause is the whole story, for the log (the client's message names
	// the replica at most: no address, no Go error text).
	cause string
}

func failure(id string, status int, broken bool, msg string, cause ...string) *attemptError {
	e := &attemptError{AttemptError: lifecycle.AttemptError{Error: *wire.Errorf(status, "every replica tried failed; the last (%s): %s", id, msg), Broken: broken}, cause: msg}
	if status != http.StatusTooManyRequests && status != http.StatusBadGateway && status != http.StatusGatewayTimeout && status != http.StatusInternalServerError {
		e.Type = wire.TypeOf(http.StatusServiceUnavailable) // a replica's other 5xx: unavailable
	}
	if len(cause) > 0 {
		e.cause = msg + ": " + cause[0]
	}
	return e
}

// maxEventPeek bounds the part of a streamed answer the relay holds to
// frame and peek at: an SSE event longer than this (no engine sends one;
// a hostile replica might) is passed through as it comes, unpeeked, so
// that what a replica sends cannot grow the proxy.
const maxEventPeek = 64 << 10

// answerBase is what an answer may hold whatever the budget for answers
// (Server.answers): a stream's peek at an event, the first bytes of a 404
// or a 400 read to judge it. The budget counts what a whole answer holds
// past it.
const answerBase = max(maxEventPeek, maxErrorPeek+1)

// answer is a replica's answer, read far enough to be sure it is one: for
// a stream, its first whole event (or maxEventPeek bytes of it);
// otherwise the whole body, or MaxAnswerBytes of it, or what the budget
// for answers lets it hold.
type answer struct {
	resp   *http.Response
	stream bool      // relayed event by event
	whole  bool      // not a stream, and buf holds all of it
	buf    *[]byte   // read from the body and not relayed yet
	at     time.Time // when buf's last bytes were read
	end    error     // how the body ended (io.EOF: cleanly), nil while open
	idle   *time.Timer
	cancel context.CancelFunc
	// of is the replica, once its successful answer began: each read of
	// it is the replica's progress (fleet/stall.go).
	of *fleet.Upstream
	// hold is the most buf holds (one event's peek, MaxAnswerBytes of a
	// whole answer), lowered to what it has where budget cannot give it
	// more; taken is what buf took from budget.
	hold   int
	budget *httpapi.Budget
	taken  int64
	// unheld is set when budget stopped the hold short of hold.
	unheld bool
}

// newAnswer begins an answer whose body was read as far as pre (a 404's
// or a 400's first bytes; nil: none), its buffer's capacity past
// answerBase taken from budget. A stream holds at most answerBase: a
// pooled buffer larger than that goes back to the pool, not charged.
func newAnswer(resp *http.Response, cancel context.CancelFunc, idle *time.Timer, budget *httpapi.Budget, pre []byte, stream bool) *answer {
	a := &answer{resp: resp, cancel: cancel, buf: httpapi.GetBuffer(), idle: idle, budget: budget, hold: answerBase, stream: stream}
	if c := int64(cap(*a.buf)) - answerBase; c > 0 {
		switch {
		case stream: // for a whole answer or a body to take
			httpapi.PutBuffer(a.buf)
			a.buf = new([]byte)
		case budget.Take(c):
			a.taken = c
		default:
			*a.buf = nil // the pool's buffer is too large for what is left: let it go
		}
	}
	if cap(*a.buf) < len(pre) {
		*a.buf = make([]byte, 0, len(pre)) // at most answerBase
	}
	*a.buf = append(*a.buf, pre...)
	return a
}

func (a *answer) close() {
	a.idle.Stop()
	a.resp.Body.Close()
	a.cancel()
	a.budget.Give(int(a.taken))
	a.taken = 0
	httpapi.PutBuffer(a.buf)
}

// streamEndWait and streamEndBytes bound what is read of a stream after
// its [DONE] was relayed: the rest of its body (the chunked terminator, in
// the engine's next write), so that the connection goes back to the pool
// rather than being closed unread.
const (
	streamEndWait  = 50 * time.Millisecond
	streamEndBytes = 4 << 10
)

// drain reads the rest of a complete stream's body, within streamEndWait
// and streamEndBytes (past them the connection is dropped, as before).
func (a *answer) drain() {
	a.idle.Stop()
	t := time.AfterFunc(streamEndWait, a.cancel)
	defer t.Stop()
	_, _ = io.CopyN(io.Discard, a.resp.Body, streamEndBytes)
}

// fill reads what the body has now into buf, growing it while it is under
// a.hold bytes and the budget gives what it grows by past answerBase; it
// reports false, reading nothing, when buf is full.
func (a *answer) fill(idle time.Duration) bool {
	b := *a.buf
	if len(b) == cap(b) {
		if cap(b) >= a.hold {
			return false
		}
		c := cap(b) + min(max(32<<10, cap(b)), a.hold-cap(b))
		if need := int64(c-answerBase) - a.taken; need > 0 {
			if !a.budget.Take(need) {
				a.hold, a.unheld = cap(b), true
				return false
			}
			a.taken += need
		}
		nb := make([]byte, len(b), c) // made to the size taken: append would round it up
		copy(nb, b)
		b = nb
	}
	n, err := a.resp.Body.Read(b[len(b):cap(b)])
	*a.buf = b[:len(b)+n]
	a.at = time.Now()
	if n > 0 && a.of != nil {
		a.of.Progressed(a.at)
	}
	if idle > 0 {
		a.idle.Reset(idle)
	}
	if err != nil {
		a.end = err
	}
	return true
}

// lentBody is a request body lent to the transport, which may read it even
// after the answer came back (RoundTripper's contract): the buffers behind
// it are reused only once the transport closed every copy it took.
type lentBody struct {
	bytes.Reader
	wg   *sync.WaitGroup
	once sync.Once
}

func lend(b []byte, wg *sync.WaitGroup) *lentBody {
	wg.Add(1)
	l := &lentBody{wg: wg}
	l.Reset(b)
	return l
}

func (l *lentBody) Close() error {
	l.once.Do(l.wg.Done)
	return nil
}

// attempt sends the request to replica u and reads its answer until it is
// sure the answer can be relayed: a status other than 5xx and 429, and for
// a successful stream its first event. Until then nothing has reached the
// client, so any failure lets the caller try another replica.
func (s *Server) attempt(r *http.Request, u *fleet.Upstream, req *lifecycle.Request, cfg *Config) (*answer, *attemptError) {
	id := u.ID()
	ctx, stopCause := context.WithCancelCause(r.Context())
	stop := func() { stopCause(context.Canceled) }
	// Cut at once (and tried elsewhere) if the replica is ejected before
	// its answer begins; its beginning is the replica's progress.
	answered := false
	done := u.Watch(&stopCause, req)
	defer func() { done(answered) }()
	var lent sync.WaitGroup
	body := lend(req.Body, &lent)
	// cancel ends the attempt, and returns once the transport let go of
	// the body (cancelling makes it stop writing).
	cancel := func() {
		stop()
		lent.Wait()
	}
	fail := func(status int, broken bool, msg string, cause ...string) (*answer, *attemptError) {
		cancel()
		if context.Cause(ctx) == fleet.ErrEjected { // counted already
			return nil, failure(id, http.StatusServiceUnavailable, false, fleet.ErrEjected.Error())
		}
		return nil, failure(id, status, broken, msg, cause...)
	}
	// A stream's headers come at once, even for a queued request, so a
	// replica that sends none within HeaderTimeout is hung. A non-streaming
	// answer's headers come with its last token: FirstByteTimeout, longer.
	var hung atomic.Bool
	var headerTimer *time.Timer
	limit := cfg.HeaderTimeout
	if !req.Stream() {
		limit = cfg.FirstByteTimeout
	}
	if limit > 0 {
		headerTimer = time.AfterFunc(limit, func() {
			if hung.CompareAndSwap(false, true) {
				stop()
			}
		})
	}
	up, err := http.NewRequestWithContext(ctx, r.Method, u.URL()+r.URL.RequestURI(), body)
	if err != nil {
		body.Close()
		return fail(http.StatusBadGateway, true, "could not send the request", err.Error())
	}
	up.Header = forwardHeaders(r)
	if id := req.SendID(); id != "" {
		up.Header.Set("X-Request-Id", id)
	}
	s.upstreamAuth(up.Header, u)
	traceAttempt(up, req)
	up.ContentLength = int64(len(req.Body))
	// The transport may send the request again on a fresh connection when
	// a kept-alive one turned out closed before anything was written.
	up.GetBody = func() (io.ReadCloser, error) { return lend(req.Body, &lent), nil }
	resp, err := s.fleet.Client().Do(up)
	if headerTimer != nil {
		headerTimer.Stop() // it would hold the attempt's context until it fired
	}
	if headerTimer != nil && !hung.CompareAndSwap(false, true) {
		if resp != nil {
			resp.Body.Close()
		}
		return fail(http.StatusGatewayTimeout, true, fmt.Sprintf("no response within %v", limit))
	}
	if err != nil {
		return fail(http.StatusBadGateway, true, "could not reach the replica", err.Error())
	}
	// The idle limit runs from now: a replica that sends headers and then
	// nothing is cut (and tried elsewhere: nothing reached the client
	// yet), while its error body is read here too. Until a stream's first
	// event it is first_byte_timeout, if longer: an engine sends a
	// stream's headers at once and its first event after the request's
	// wait in its queue, which a non-streaming answer's headers get too.
	idle := cfg.StreamIdleTimeout
	idleTimer := time.AfterFunc(math.MaxInt64, stop)
	if idle > 0 {
		idleTimer.Reset(idle)
	}
	var pre []byte // the start of a 404's body (or of a 400 to an adapter's request), read to judge it
	switch {
	case resp.StatusCode == http.StatusBadRequest && req.Adapter():
		// SGLang refuses a request for an adapter it has not loaded with a
		// 400 (vLLM with a 404): another replica may have it.
		var err error
		pre, err = io.ReadAll(io.LimitReader(resp.Body, maxErrorPeek+1))
		if e := adapterNotLoaded(pre, id, req.Model()); e != nil || err != nil {
			idleTimer.Stop()
			resp.Body.Close()
			if err != nil {
				return fail(http.StatusBadGateway, true, "the replica's 400 broke off", err.Error())
			}
			cancel()
			return nil, e
		}
	case resp.StatusCode == http.StatusNotFound:
		var err error
		pre, err = io.ReadAll(io.LimitReader(resp.Body, maxErrorPeek+1))
		var e *attemptError
		switch {
		case err != nil:
		case req.Format() == wire.Native || len(pre) <= maxErrorPeek && wire.NoRoute(pre):
			// The replica has no such endpoint (SGLang answers no 404 to a
			// /generate: a vLLM replica in a fleet of both). Another may
			// serve it; this one is not to blame.
			e = &attemptError{AttemptError: lifecycle.AttemptError{Error: *wire.Errorf(http.StatusNotFound, "no replica tried serves %s %s", r.Method, r.URL.Path), NoEndpoint: true},
				cause: fmt.Sprintf("%s has no route for %s %s", id, r.Method, r.URL.Path)}
		case req.Model() != "" || req.Names() != "":
			e = modelMissing(pre, id, req.Model(), req.Names())
			if e == nil && req.Names() != "" && len(pre) <= maxErrorPeek {
				// It does not hold the response the request names: another
				// replica may (the router did not know, or its holder failed).
				e = &attemptError{AttemptError: lifecycle.AttemptError{Error: *wire.Errorf(http.StatusNotFound, "%s", wire.ErrorMessage(pre)), NotHeld: true},
					cause: fmt.Sprintf("%s does not hold response %s", id, req.Names())}
			}
		}
		if e != nil || err != nil {
			idleTimer.Stop()
			resp.Body.Close()
			if err != nil {
				return fail(http.StatusBadGateway, true, "the replica's 404 broke off", err.Error())
			}
			cancel()
			return nil, e
		}
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		idleTimer.Stop()
		resp.Body.Close()
		// Where it points stays in the log: it may name an internal host.
		return fail(http.StatusBadGateway, true, fmt.Sprintf("it answered %d, a redirect, which gorgo does not follow", resp.StatusCode), "to "+resp.Header.Get("Location"))
	}
	if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		idleTimer.Stop()
		resp.Body.Close()
		busy := resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests
		a, e := fail(resp.StatusCode, !busy, wire.ErrorMessage(data))
		e.RetryAfter, e.Busy = resp.Header.Get("Retry-After"), busy
		return a, e
	}
	stream := resp.StatusCode == http.StatusOK && (req.Stream() || isEventStream(resp.Header))
	a := newAnswer(resp, cancel, idleTimer, &s.answers, pre, stream)
	if pre != nil && len(pre) <= maxErrorPeek {
		a.end = io.EOF // all of it
	}
	// Hold at most one event's peek, or MaxAnswerBytes of a whole answer
	// (or what the budget for answers gives it): past it the answer has
	// begun, and is passed through as it comes.
	a.hold = int(cfg.MaxAnswerBytes)
	wait := idle
	if stream {
		a.hold = maxEventPeek
		if cfg.FirstByteTimeout > 0 && (idle <= 0 || cfg.FirstByteTimeout > idle) {
			wait = cfg.FirstByteTimeout
			idleTimer.Reset(wait)
		}
	} else if idle > 0 {
		// A whole answer is held until its end, which comes at once after
		// its headers (an engine writes it when the generation is done):
		// stream_idle_timeout bounds the whole hold, not each read
		// (2026-12-06, a user's test: a replica trickling a byte a second
		// held its answer, and its client, for ever).
		idleTimer.Reset(idle)
		wait = 0
	}
	for a.end == nil && a.fill(wait) {
		if stream {
			if _, ok := firstEvent(*a.buf, req.Format()); ok {
				break
			}
		}
	}
	if idle <= 0 {
		idleTimer.Stop() // first_byte_timeout's, armed above: no idle limit from here
	}
	a.whole = !stream && a.end == io.EOF
	if !stream && a.end == nil {
		limit := "max_answer_bytes"
		if a.unheld {
			limit = "max_answer_bytes_in_flight"
		}
		s.m.unheld.WithLabelValues(limit).Inc()
	}
	if a.end != nil && a.end != io.EOF || len(*a.buf) == 0 && resp.StatusCode == http.StatusOK {
		err := a.end
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		a.close()
		if context.Cause(ctx) == fleet.ErrEjected {
			return nil, failure(id, http.StatusServiceUnavailable, false, fleet.ErrEjected.Error())
		}
		return nil, failure(id, http.StatusBadGateway, true, "its answer broke off before it began", err.Error())
	}
	// An abort before the first token is the engine giving the request up,
	// unless its client aborted it (through the router, or another of its
	// mesh, whose news may come after the engine's answer): that is
	// relayed.
	if stream {
		if e := adapterNotLoadedEvent(*a.buf, req, id); e != nil {
			a.close()
			return nil, e
		}
		if why, msg, failed := failedStream(*a.buf, req.Format()); failed && !(why == givenUp && req.AwaitClientAbort(ctx, s.fleet.AbortGrace())) {
			a.close()
			return nil, failure(id, http.StatusBadGateway, true, why, msg)
		}
	}
	// An answer that is none (a whole answer that is not JSON, a stream
	// that ended without one event of data) is the replica's fault, and
	// nothing has reached the client: 2026-12-06, a user's test: a
	// replica answering garbage at once drew 98.5% of the traffic, each
	// relayed as a 200, and was never charged. (A stream of events the
	// peek does not know, a Responses API tool call's, is an answer.)
	if a.end == io.EOF && resp.StatusCode == http.StatusOK && req.AnswersJSON() && !json.Valid(*a.buf) && (!stream || !hasData(*a.buf)) {
		a.close()
		return nil, failure(id, http.StatusBadGateway, true, "its answer was none (not JSON, or a stream without an event of data)", fmt.Sprintf("%.80q", *a.buf))
	}
	if a.whole && resp.StatusCode == http.StatusOK && req.Format().AbortedUnanswered(*a.buf) && !req.AwaitClientAbort(ctx, s.fleet.AbortGrace()) {
		a.close()
		return nil, failure(id, http.StatusBadGateway, true, givenUp, `finish_reason "abort"`)
	}
	if answered = resp.StatusCode < 300 && req.AnswersJSON(); answered { // not a /tokenize: the engine's work
		a.of = u
	}
	return a, nil
}

// adapterNotLoadedEvent judges a stream for an adapter whose first event
// is an error as adapterNotLoaded does a 400: SGLang streams its refusal
// of an adapter it has not loaded (a 200, then the error event) where it
// answers a whole request's with a 400.
func adapterNotLoadedEvent(buf []byte, req *lifecycle.Request, id string) *attemptError {
	if !req.Adapter() {
		return nil
	}
	ev, ok := firstEvent(buf, req.Format())
	if !ok {
		return nil
	}
	var scratch []byte
	data := wire.EventData(ev, &scratch)
	if !req.Format().Chunk(data).Error {
		return nil
	}
	return adapterNotLoaded(data, id, req.Model())
}

// givenUp is why an attempt the engine ended with finish_reason "abort"
// before its first token failed.
const givenUp = "it gave the request up before its first token"

// failedStream reports whether a stream whose first event is in buf failed
// before its first token, why, and the replica's message: it began with
// an error the replica owns (vLLM sends a 200, then an error event, when
// its engine fails before the first token; SGLang when its queue is full),
// or the engine gave the request up (vLLM, shutting down or paused, ends
// such a stream at once: [DONE]; SGLang sends a finish_reason "abort").
// A chunk of usage with no tokens is not an end: vLLM's continuous usage
// puts one on its role chunk. Nothing has reached the client: another
// replica may serve the request. An error that blames the request
// (its Format's RequestFault) is relayed as it is.
func failedStream(buf []byte, f wire.Format) (why, msg string, failed bool) {
	ev, ok := firstEvent(buf, f)
	if !ok {
		return "", "", false
	}
	var scratch []byte
	data := wire.EventData(ev, &scratch)
	if wire.IsDone(data) {
		return "its stream ended before its first token", "[DONE]", true
	}
	switch p := f.Chunk(data); {
	case p.Token:
		return "", "", false
	case p.Error:
		if f.RequestFault(data) {
			return "", "", false
		}
		return "its stream began with an error", wire.ErrorMessage(data), true
	case p.Abort:
		return givenUp, `finish_reason "abort"`, true
	}
	return "", "", false
}

// firstEvent returns the first event in buf that begins the answer: one
// with data, other than a Responses API stream's opening
// (response.created, .in_progress, .queued), which an engine sends at
// once, before the request's wait in its queue, and other than a chunk
// that carries nothing (empty: the role chunk vLLM and SGLang send with
// the first token, or as an abort's only chunk).
// Comments (keep-alives) and data-less events before it carry nothing of
// the answer: until the answer begins, the attempt may still fail over,
// and has first_byte_timeout.
func firstEvent(buf []byte, f wire.Format) ([]byte, bool) {
	var scratch []byte
	for {
		ev, rest, ok := wire.NextEvent(buf)
		if !ok {
			return nil, false
		}
		buf = rest
		if data := wire.EventData(ev, &scratch); len(data) > 0 && !wire.IsOpening(data) && !empty(data, f) {
			return ev, true
		}
	}
}

// hasData reports whether buf holds an event with data.
func hasData(buf []byte) bool {
	var scratch []byte
	for {
		ev, rest, ok := wire.NextEvent(buf)
		if !ok {
			return false
		}
		if len(wire.EventData(ev, &scratch)) > 0 {
			return true
		}
		buf = rest
	}
}

// empty reports whether a chunk's data is a JSON object that carries
// nothing of the answer: no token, finish, error or response id, and no
// usage but one of no completion tokens (vLLM's continuous usage on its
// role chunk; with include_usage, the usage that closes a stream it gave
// up before its first token, which a whole answer would have finished
// first).
func empty(data []byte, f wire.Format) bool {
	if data[0] != '{' || wire.IsDone(data) {
		return false
	}
	p := f.Chunk(data)
	return !p.Token && !p.Finish && !p.Error && p.ResponseID == "" && (!p.Usage || p.CompletionTokens == 0)
}

// traceAttempt passes a traced attempt's trace context on to the replica
// (its traceparent and tracestate replace the client's: the replica's
// spans are the attempt's children) and names the replica's address on the
// attempt's span. A request not traced keeps the client's trace headers as
// they came.
func traceAttempt(up *http.Request, req *lifecycle.Request) {
	sp := req.AttemptSpan()
	sc := sp.SpanContext()
	if !sc.IsValid() {
		return
	}
	tp, ts := tracing.Headers(sc)
	up.Header["Traceparent"] = []string{tp}
	if ts != "" {
		up.Header["Tracestate"] = []string{ts}
	} else {
		delete(up.Header, "Tracestate")
	}
	if sp.IsRecording() {
		port, _ := strconv.Atoi(up.URL.Port())
		sp.SetAttributes(attribute.String("server.address", up.URL.Hostname()), attribute.Int("server.port", port),
			attribute.String("http.request.method", up.Method), attribute.String("url.path", up.URL.Path))
	}
}

// isEventStream reports whether an answer is a server-sent event stream.
func isEventStream(h http.Header) bool {
	return strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
}

// private are the replica's response headers that say things about it the
// client has no use for.
var private = map[string]bool{"Server": true, "Set-Cookie": true, "X-Request-Id": true}

// answerRequestID answers the request with an X-Request-Id, the client's
// or one made here, as OpenAI answers every request with one (its SDKs
// show it as the request's id), and the access log names the request by
// the same (Incoming.LogID); a replica's own is not passed on. A made one
// is sent to the replica with a chat or a completion whose body names no
// request_id (vLLM would take the header over it, and the client may abort
// the request by it):
// the engine's logs and aborts then name the request as the router does
// (lifecycle.Request.SendID). A client's id that is not one to echo
// (httpapi.PrintableID) is not echoed nor logged: one is made in its place.
func answerRequestID(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("X-Request-Id")
	if !httpapi.PrintableID(id) {
		id = "req_" + rand.Text()
	}
	w.Header().Set("X-Request-Id", id)
}

// forwardHeaders copies a client's request headers for the replica, less
// the hop-by-hop ones (those its Connection names too), and adds the
// client's address to X-Forwarded-For and X-Forwarded-Proto, as Go's
// httputil.ReverseProxy does.
func forwardHeaders(r *http.Request) http.Header {
	src := r.Header
	dst := make(http.Header, len(src)+2)
	conn := src["Connection"]
	for k, v := range src {
		if httpapi.EndToEnd(k, conn) {
			dst[k] = v
		}
	}
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := src["X-Forwarded-For"]; len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		dst["X-Forwarded-For"] = []string{ip}
	}
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	dst["X-Forwarded-Proto"] = []string{proto}
	return dst
}

// copyHeaders copies a replica's response headers for the client, less
// the hop-by-hop ones (those its Connection names too) and the private
// ones.
func copyHeaders(dst, src http.Header) {
	conn := src["Connection"]
	for k, v := range src {
		if !private[k] && httpapi.EndToEnd(k, conn) {
			dst[k] = v
		}
	}
}

// relay sends a replica's answer to the client as it comes, handing every
// event to the lifecycle. Events that arrive together leave together, in
// one write and one flush. Once bytes reached the client, a failure aborts
// the client's connection rather than pretend the answer ended well.
func (s *Server) relay(w http.ResponseWriter, r *http.Request, a *answer, req *lifecycle.Request, cfg *Config) lifecycle.Outcome {
	defer a.close()
	h := w.Header()
	copyHeaders(h, a.resp.Header)
	h.Set(ReplicaHeader, req.Replica())
	ok := a.resp.StatusCode == http.StatusOK
	switch {
	case a.whole: // the whole body is in the buffer
		h.Set("Content-Length", strconv.Itoa(len(*a.buf)))
	case !a.stream && a.resp.ContentLength >= 0: // passed through as it comes
		h.Set("Content-Length", strconv.FormatInt(a.resp.ContentLength, 10))
	}
	// A client that stops taking its answer is cut, as a replica that
	// stops sending is: it would hold the handler, and the replica's
	// answer, for ever. Each write has the idle limit, and a millisecond
	// more per byte (a client taking a held answer of a megabyte at a
	// kilobyte a second is slow, not gone). (Writers that cannot set
	// deadlines go without.)
	rc := http.NewResponseController(w)
	deadline := func(n int) {
		if cfg.StreamIdleTimeout > 0 {
			_ = rc.SetWriteDeadline(time.Now().Add(cfg.StreamIdleTimeout + time.Duration(n)*time.Millisecond))
		}
	}
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	deadline(len(*a.buf))
	w.WriteHeader(a.resp.StatusCode)
	var clientErr error
	if a.whole {
		if _, clientErr = w.Write(*a.buf); clientErr == nil {
			// Under the deadline, not after the handler returns.
			if err := rc.Flush(); !errors.Is(err, http.ErrNotSupported) {
				clientErr = err
			}
		}
		if ok && clientErr == nil {
			req.Complete(req.Format().Body(*a.buf))
		}
		if ok {
			req.AnswerHead(*a.buf)
		}
		return lifecycle.Outcome{Status: a.resp.StatusCode, ClientGone: clientErr != nil || r.Context().Err() != nil}
	}
	fl, _ := w.(http.Flusher)
	out := httpapi.GetBuffer()
	defer httpapi.PutBuffer(out)
	var scratch []byte
	idle := cfg.StreamIdleTimeout
	// over: inside an event too long to peek, passed through as it comes
	// until its blank line, the lifecycle reading it as it passes
	// (lifecycle.Request.LongEventPart); prev holds the last bytes passed
	// of it.
	over := !a.stream // an answer too long to hold is passed through whole
	var prev []byte
	var tail []byte // the last wire.TailBytes of an answer passed through whole
	for {
		rest := *a.buf
		*out = (*out)[:0]
		done := false
		if over && a.stream {
			if n := eventEnd(prev, rest); n >= 0 {
				req.LongEventPart(rest[:n])
				req.LongEventEnd()
				*out, rest, over = append(*out, rest[:n]...), rest[n:], false
			}
		}
		// Relay every whole event read so far.
		for !over {
			ev, next, whole := wire.NextEvent(rest)
			if !whole {
				break
			}
			rest = next
			if s.hide(ev, req, &scratch, a.at, &done) {
				continue
			}
			*out = append(*out, ev...)
		}
		if !over && len(rest) >= maxEventPeek {
			over = true // an event too long to peek at: pass it through
			if a.stream {
				req.LongEvent(rest)
			}
		}
		var passed []byte // of a whole answer, written from its own buffer: not copied to out
		if over {
			if a.stream {
				*out = append(*out, rest...)
			} else {
				passed = rest
			}
			prev = append(prev[:0], rest[max(0, len(rest)-2):]...)
			if a.stream {
				req.LongEventPart(rest)
			} else {
				req.AnswerPart(rest)
			}
			rest = rest[len(rest):]
		}
		// Keep the unfinished event at the front of the buffer.
		*a.buf = (*a.buf)[:copy(*a.buf, rest)]
		if a.end != nil && len(*a.buf) > 0 {
			// The last event, without the blank line after it, if the
			// stream ended; if it broke off, the part of an event it
			// broke off in is dropped, as the client's parser would drop
			// it, and an event of its own says why (below).
			if a.end == io.EOF && !s.hide(*a.buf, req, &scratch, a.at, &done) {
				*out = append(*out, *a.buf...)
			}
			*a.buf = (*a.buf)[:0]
		}
		pass := *out
		if !a.stream {
			pass = passed
		}
		if len(pass) > 0 {
			// While the client takes the bytes, the replica cannot send
			// more: its idle limit waits, and the client's runs.
			a.idle.Stop()
			deadline(len(pass))
			if _, clientErr = w.Write(pass); clientErr != nil {
				break
			}
			if fl != nil {
				fl.Flush()
			}
			if idle > 0 {
				a.idle.Reset(idle)
			}
			if !a.stream {
				if tail == nil && ok { // the answer's first bytes
					req.AnswerHead(pass)
				}
				tail = wire.KeepTail(tail, pass)
			}
		}
		if a.end == io.EOF && a.stream && !done && !req.Ended() && !over {
			// The replica closed the stream before its end: cut short
			// (a graceful shutdown, a sidecar's). (One cut inside an
			// event too long to peek at is passed on as it came, and
			// taken as whole.)
			a.end = lifecycle.ErrNoEnd
		}
		if done || a.end == io.EOF {
			if !a.stream && ok {
				// Too long to hold: its counts are read as it passed, or
				// from its last bytes.
				req.AnswerEnd(tail)
			}
			if a.stream && over {
				req.LongEventEnd() // the last event, ended by the stream's end
			}
			req.Done() // the final event reached the client: the answer is complete
			if a.end == nil {
				a.drain()
			}
			a.end = io.EOF
		}
		if a.end != nil {
			break
		}
		a.fill(idle)
	}
	var upErr error
	if a.end != nil && a.end != io.EOF {
		upErr = a.end
		if errors.Is(upErr, context.Canceled) && r.Context().Err() == nil {
			upErr = fmt.Errorf("no byte from the replica for %v", idle)
		}
		if a.stream && !over && clientErr == nil {
			// The stream broke off (the part of an event it broke off in
			// dropped above): say so in an event of its own, as the
			// engines say an error mid-stream, before the
			// connection is cut (the handler's part), so that a client
			// reading events (OpenAI's SDKs throw on an event's "error")
			// has a reason, not a bare cut.
			e := wire.Errorf(http.StatusBadGateway, "the replica's answer broke off (%s): it is incomplete", req.Replica())
			deadline(0)
			if _, clientErr = w.Write(sseEvent(e.JSON())); clientErr == nil && fl != nil {
				fl.Flush()
			}
		}
	}
	return lifecycle.Outcome{Status: a.resp.StatusCode, ClientGone: clientErr != nil || r.Context().Err() != nil, Err: upErr}
}

// sseEvent is a JSON value (its trailing newline dropped) as an SSE event.
func sseEvent(v []byte) []byte {
	return append(append([]byte("data: "), bytes.TrimRight(v, "\n")...), "\n\n"...)
}

// eventEnd returns how many bytes of b end the SSE event being passed
// through, up to and including the blank line after it, or -1 if b does
// not end it; prev is what was passed of the event just before b (its
// last two bytes suffice, for a blank line split across reads).
func eventEnd(prev, b []byte) int {
	var w [4]byte
	n := copy(w[:], prev[max(0, len(prev)-2):])
	m := copy(w[n:], b)
	if i := blankLine(w[:n+m]); i > n {
		return i - n
	}
	return blankLine(b)
}

// blankLine returns the index just past the first blank line in b ("\n\n"
// or "\n\r\n", a line's end and an empty line), or -1.
func blankLine(b []byte) int {
	best := -1
	if i := bytes.Index(b, []byte("\n\n")); i >= 0 {
		best = i + 2
	}
	if i := bytes.Index(b, []byte("\n\r\n")); i >= 0 && (best < 0 || i+3 < best) {
		best = i + 3
	}
	return best
}

// hide hands one event to the lifecycle and reports whether the client
// must not see it (the usage chunk it did not ask for); done is set by the
// [DONE] event.
func (s *Server) hide(ev []byte, req *lifecycle.Request, scratch *[]byte, at time.Time, done *bool) bool {
	data := wire.EventData(ev, scratch)
	if len(data) == 0 {
		return false
	}
	if wire.IsDone(data) {
		*done = true
		return false
	}
	f := req.Format()
	p := f.Chunk(data)
	req.Chunk(&p, at)
	if p.Error {
		req.StreamError(f.RequestFault(data))
	}
	return req.HideUsage && p.Usage && !p.Token && !p.Finish
}

// maxErrorPeek bounds what is read of a 404, or a 400, to judge it.
const maxErrorPeek = 64 << 10

// modelMissing judges a 404 to a request for model from the start of its
// body: if it says the model is not there (an engine's "The model `x` does
// not exist.", or an adapter not found), the attempt fails without blaming
// the replica, which loses the model, and the next fallback is tried;
// otherwise nil, and the body is relayed. named is the stored response the
// request names, whose id the message may quote.
func modelMissing(data []byte, id, model, named string) *attemptError {
	msg := strings.ToLower(wire.ErrorMessage(data))
	if named != "" { // the client's id, quoted ("Response with id '...' not found."), says nothing of the model
		msg = strings.ReplaceAll(msg, strings.ToLower(named), "")
	}
	if model == "" || len(data) > maxErrorPeek || !(strings.Contains(msg, "model") || strings.Contains(msg, "lora") || strings.Contains(msg, "adapter")) {
		return nil
	}
	return &attemptError{AttemptError: lifecycle.AttemptError{Error: *wire.ModelNotFound(model), ModelMissing: true},
		cause: fmt.Sprintf("%s does not serve %s: %s", id, model, msg)}
}

// adapterNotLoaded judges a 400 to a request for model from the start of
// its body as modelMissing does a 404: SGLang's "The following requested
// LoRA adapters are not loaded: x" says the replica lacks the adapter
// (unloaded since the router last read its models); any other 400 is the
// request's, and relayed. model is an adapter (a request for the base
// whose lora_path names one the router does not know of is refused so
// too, and the refusal is its).
func adapterNotLoaded(data []byte, id, model string) *attemptError {
	if len(data) > maxErrorPeek {
		return nil
	}
	msg := strings.ToLower(wire.ErrorMessage(data))
	if !strings.Contains(msg, "not loaded") || !(strings.Contains(msg, "lora") || strings.Contains(msg, "adapter")) {
		return nil
	}
	return modelMissing(data, id, model, "")
}
