package lifecycle

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// Outcome is how an answer that reached the client ended.
type Outcome struct {
	// Status is the replica's HTTP status.
	Status int
	// ClientGone: the client went away before the answer was complete.
	ClientGone bool
	// Err is the upstream's failure after the answer started (a broken or
	// stalled stream); nil if it ended well.
	Err error
}

// end closes the request at at, each concern in its turn: the status it
// ended with, the replica's ledger and the router's models, its health,
// the learner, and the record (metrics, live view, access log). It returns
// the status (499 for a client that left, 502 for a broken answer) and
// recycles the Request: do not use it after.
func (r *Request) end(o Outcome, at time.Time) int {
	status, broken := r.settle(&o)
	routed := r.active
	r.report(status)
	r.judge(status, broken)
	if routed {
		r.learn(status, at)
	}
	r.traceEnd(status, at, o.Err)
	r.record(status, at, o.Err)
	if !(status == statusOK && r.done && r.outputTokens() == 0) {
		// An answer served in full of which the router saw no output (no
		// token events, no usage: a gateway that shows the picker no
		// body, an engine that reports no usage) keeps the output charged
		// on arrival: settled at zero, the tenant's token budget would
		// count its prompts only.
		r.settleBudget(at)
	}
	r.release()
	return status
}

// settle turns how the answer ended into the status the request ended
// with, and whether the replica broke it: a complete answer stays complete
// whatever the client or the replica does after.
func (r *Request) settle(o *Outcome) (status int, broken bool) {
	switch {
	case r.streamErr && !o.ClientGone && (r.done || o.Err == nil): // ended ([DONE], or the body's end), but broken
		o.Err = nil
		if r.streamFault {
			return statusBadRequest, false
		}
		return statusBadGateway, true
	case r.done:
		o.Err = nil
		return o.Status, false
	case o.ClientGone:
		return statusClientGone, false
	case o.Err != nil:
		return statusBadGateway, true
	}
	return o.Status, false
}

// report tells the router how the attempt went: a complete answer's token
// gap and length (the ITL model, the output estimate), the replica's
// ledger, and its cached-token report (the prefix index's correction).
func (r *Request) report(status int) {
	if !r.active {
		return
	}
	rt := r.core.cfg.Router
	if status == statusOK && r.done {
		// The token gap only where it was timed (gapTimed); the length
		// from any complete answer.
		var decode time.Duration
		if r.gapTimed() {
			decode = r.lastTok.Sub(r.first)
		}
		rt.Decoded(&r.ticket, r.answerTokens(), decode)
		r.endTokens, r.endDecode = r.answerTokens(), decode
	}
	t := r.ticket
	r.free()
	// A batch's usage gives one prompt's cached tokens (vLLM's: the last
	// prompt's), not those of the whole the router estimated.
	if r.cached >= 0 && status == statusOK && r.Parsed.Prompts() == 1 {
		rt.CachedReport(&t, r.cached)
	}
}

// judge tells the health counters: an answer the replica broke off counts
// against it, one served in full for it.
func (r *Request) judge(status int, broken bool) {
	h := r.core.cfg.Health
	switch {
	case h == nil:
	case !r.core.cfg.Router.Current(&r.ticket): // replaced since: not its successor's doing
	case broken:
		h.Failure(r.ticket.ID)
	case status == statusOK:
		h.Success(r.ticket.ID)
	}
}

// learn hands a request's outcome to a learning policy, unless no
// learner hears it (policy.Request.Unjudged). Only a stream says when its first
// token came: a whole answer is timed by its end alone
// (Outcome.Unstreamed). A stream served in full without a token
// seen (an empty answer; a gateway that shows the picker no body) says
// nothing of the replica's speed: it is not learned from, not counted as
// failed.
func (r *Request) learn(status int, at time.Time) {
	l, isLearner := r.core.cfg.Router.Policy().(policy.Learner)
	unstreamed := !r.Parsed.Stream
	if !isLearner || r.Route.Unjudged || status == statusClientGone || status == statusOK && r.first.IsZero() && !unstreamed {
		return
	}
	if status >= 400 && status < 500 && status != statusTooMany {
		// The client's error (a prompt over the context, a bad
		// parameter): any replica would have refused it, so it says
		// nothing of the weights that routed it. Not the replicas'
		// 429s: busy, as their 503s say, where the arm sent it.
		return
	}
	out := r.slos()
	out.Failed, out.Unstreamed = status != statusOK, unstreamed // served, a stream had a first token (above)
	if !out.Failed {
		out.Tokens = r.answerTokens()
	}
	switch {
	case !out.Failed && unstreamed:
		out.E2E, out.Queued = at.Sub(r.dispatched), r.dispatched.Sub(r.Received)
	case !out.Failed:
		// From the first attempt: time lost on a replica before the
		// fallback (sendAt) is the arm's, time in the router's queue not.
		out.TTFT, out.E2E, out.Queued = r.first.Sub(r.dispatched), at.Sub(r.dispatched), r.dispatched.Sub(r.Received)
		// Per token, not per chunk: an engine may stream several tokens
		// in one event (the usage, when it came, says how many).
		if n := r.answerTokens(); n > 1 && r.gapTimed() {
			out.ITL = r.lastTok.Sub(r.first) / time.Duration(n-1)
		}
	}
	l.Learn(r.ticket.Tag, out)
}

// generates reports whether the request asks for generated text: a chat,
// a completion, SGLang's /generate, a Responses API request; not
// embeddings, nor the engines' other endpoints (tokenizing, scoring).
func (r *Request) generates() bool {
	switch r.kind {
	case Chat, Completion, Generate:
		return true
	case Input:
		return strings.HasSuffix(r.Route.Endpoint, "/responses")
	}
	return false
}

// slos is an outcome with the SLOs the request is held to: its class's
// TTFT SLO, and the TPOT SLO it asks for.
func (r *Request) slos() policy.Outcome {
	o := policy.Outcome{TPOTSLO: time.Duration(r.Route.TPOTSLOMS * 1e6)}
	if !r.sloHold {
		// Not flow control's hold of a request given no SLO (classify):
		// held to max_ttft_slo, it would count in slo-p95's windows,
		// whose requests are those with SLOs, with a ratio near 0.
		o.TTFTSLO = r.core.cfg.Admission.SLOOf(r.class)
	}
	return o
}

// record counts the request in the metrics, tells the live view, and
// writes the access log line.
func (r *Request) record(status int, at time.Time, err error) {
	c := r.core
	id := r.ticket.ID
	ttft := noTTFT
	if !r.first.IsZero() {
		ttft = r.first.Sub(r.Received)
	}
	c.cfg.Metrics.ended(id, r.modelLabel, status, ttft, at.Sub(r.Received))
	if r.tenant != nil && status == statusOK {
		c.cfg.Metrics.tenantServed(r.tenant.Name, r.class.Priority, ttft, at.Sub(r.Received))
	}
	if c.cfg.Tap != nil && r.tapID != 0 {
		c.cfg.Tap.Ended(r.tapID, id, status, max(ttft, 0), at.Sub(r.Received))
	}
	if c.cfg.Log != nil {
		attrs := []any{"replica", id, "status", status, "stream", r.Parsed.Stream, "prompt_tokens", r.Route.PromptTokens,
			"est_cached_tokens", r.ticket.EstCachedTokens, "cached_tokens", r.cached,
			"expected_output_tokens", r.ticket.ExpectedOutputTokens, "output_tokens", r.outputTokens(),
			"attempts", r.attempts, "e2e_ms", ms(at.Sub(r.Received))}
		if ttft != noTTFT {
			attrs = append(attrs, "ttft_ms", ms(ttft))
		}
		if err != nil {
			attrs = append(attrs, "error", err.Error())
		}
		c.cfg.Log.Info("request", r.traceLog(attrs...)...)
	}
}

// reject closes a request no replica served: it records the failure and
// recycles the Request.
func (r *Request) reject(e *wire.Error) {
	c := r.core
	r.refund(time.Now()) // not served: its tenant is charged nothing
	r.traceEnd(e.Status, time.Now(), e)
	c.cfg.Metrics.ended("", r.modelLabel, e.Status, noTTFT, 0)
	if c.cfg.Log != nil {
		c.cfg.Log.Info("request", r.traceLog("replica", "", "status", e.Status, "stream", r.Parsed.Stream, "prompt_tokens", r.Route.PromptTokens,
			"attempts", r.attempts, "error", e.Message)...)
	}
	r.release()
}

// abandon closes a request whose client went away while no replica was
// serving it.
func (r *Request) abandon() {
	if !r.sent.IsZero() {
		r.settleBudget(time.Now()) // a replica may have read its prompt
	} else {
		// It left the queue, or was released from it but never sent:
		// no replica saw it.
		r.grant.Refund(time.Now())
	}
	id := r.ticket.ID // "" if it never left the queue
	r.free()
	r.traceEnd(statusClientGone, time.Now(), nil)
	r.core.cfg.Metrics.ended(id, r.modelLabel, statusClientGone, noTTFT, 0)
	if log := r.core.cfg.Log; log != nil {
		// In the access log too (2026-12-06, a user's test: the requests a
		// hung replica held until their clients gave up were in the
		// metrics' 499s and nowhere in the log).
		log.Info("request", r.traceLog("replica", id, "status", statusClientGone, "stream", r.Parsed.Stream, "prompt_tokens", r.Route.PromptTokens,
			"attempts", r.attempts, "waited", time.Since(r.Received).Round(time.Millisecond), "error", "the client left before an answer began")...)
	}
	r.release()
}

// noTTFT stands for the TTFT of a request that had no first token.
const noTTFT = time.Duration(-1)

// gapTimed reports whether the stream timed its answer's token gap: one
// answer (several end with the longest, whose length the usage does not
// give) in at least two token events.
func (r *Request) gapTimed() bool { return r.tokens > 1 && r.Parsed.Answers() == 1 }

// answerTokens is the mean length of the request's answers (n of them
// for each prompt decode side by side, each its own tokens; the usage, or
// the events counted, are all of theirs, best_of's hidden ones not
// among them): what the output estimate and the token gap are learned
// from.
func (r *Request) answerTokens() int {
	n := r.outputTokens()
	if a := r.Parsed.Answers(); a > 1 {
		n = (n + a - 1) / a
	}
	return n
}

// outputTokens is the tokens the request was answered with, all its
// answers': the usage's count, else the token events relayed.
func (r *Request) outputTokens() int {
	if r.completionTokens > 0 {
		return r.completionTokens
	}
	return r.tokens
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

var statusTexts sync.Map // int -> string

// statusText is a status's label: its number where HTTP names it (and
// 499, a client gone), else its class ("4xx"): the replicas' statuses
// are passed on as they come, and one answering every number from 100 to
// 599 must not make hundreds of series per model (2026-12-07, a review).
func statusText(code int) string {
	if s, ok := statusTexts.Load(code); ok {
		return s.(string)
	}
	s := fmt.Sprint(code)
	if http.StatusText(code) == "" && code != statusClientGone {
		s = fmt.Sprintf("%dxx", min(max(code/100, 1), 9))
	}
	statusTexts.Store(code, s)
	return s
}
