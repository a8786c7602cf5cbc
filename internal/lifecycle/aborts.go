package lifecycle

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"

	"github.com/gorgo-llm/gorgo/internal/wire"
)

// Client aborts. A client aborts requests through the router as SGLang's
// /abort_request does, by rid (a prefix of one) or all of them, or as
// vLLM's /abort_requests does, by the ids its engine knows them by
// (exactly), or all of them. Such a request may be in
// three places. One an engine has: the engine ends it with finish_reason
// "abort", which before its first token is also how an engine gives up a
// request it cannot serve, and such a request the router tries on another
// replica; a request its client aborted is not to be served elsewhere, so
// the router remembers the aborts, and a front end relays an engine's
// abort of a request they cover (Request.ClientAborted). One waiting in
// the router's own queue (flow control), which no engine has: it ends at
// once, answered as SGLang answers a request aborted in its waiting queue.
// And one between its attempts, or released from the queue but not yet
// sent: it ends before its next attempt, answered the same.

// Bounds on what is remembered: an abort covers the requests it came
// after for a minute; at most 4,096 rids and vLLM ids are kept, each of
// at most 256 bytes (past that, the older than a minute go, else a quarter
// of the others).
const (
	abortMemory    = time.Minute
	maxAbortedRIDs = 4096
	maxRIDBytes    = 256
)

// aborts is what clients aborted through the router.
type aborts struct {
	last atomic.Int64 // when the latest abort came (Unix ns; 0: none), read without the lock
	mu   sync.Mutex
	all  time.Time            // the latest abort of all requests
	rids map[string]time.Time // the rids aborted, and when (the latest)
	// lengths counts the rids remembered by their length: a request's rid
	// is matched by its prefixes of those lengths alone.
	lengths map[int]int
	ids     map[string]time.Time // vLLM's request ids aborted (matched exactly), and when
	news    chan struct{}        // closed (and replaced) when an abort is noted
}

// noted returns a channel closed when the next abort is noted.
func (a *aborts) noted() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.news == nil {
		a.news = make(chan struct{})
	}
	return a.news
}

// abort is one client's abort: of all requests, of those whose rid (one
// of a batch's) begins with one of rids, or of those vLLM's engine knows
// by one of ids.
type abort struct {
	all     bool
	rids    map[string]bool
	lengths map[int]int     // of rids, as aborts.lengths
	ids     map[string]bool // vLLM's request ids, matched exactly
}

// MaxAbortRIDs bounds the rids (and the ids) of one abort read (and of
// a vLLM abort the fleet passes on: fleet.AbortOf): far more
// than a router's queue holds requests to match them against, so that an
// abort's body of max_body_bytes, millions of short rids, is not made
// into millions of map entries while it is handled (2026-12-07, a review:
// one of 8 MiB took 56 MiB and 1.6 s).
const MaxAbortRIDs = 1 << 16

// parseAbort reads an abort's body: SGLang's /abort_request's, {"rid": a
// string or a list of them} or {"abort_all": true}, or vLLM's
// /abort_requests', {"request_ids": a list of them, or one}. Rids and ids
// empty or over maxRIDBytes are left out, and those past the first
// MaxAbortRIDs of a list; ok is false if it names no request.
func parseAbort(body []byte) (ab abort, ok bool) {
	if !wire.ValidJSON(body) { // gjson's own recurses per level: a deep body would overflow the stack
		return abort{}, false
	}
	doc := gjson.ParseBytes(body)
	if !doc.IsObject() {
		return abort{}, false
	}
	ab.all = doc.Get("abort_all").Type == gjson.True
	stringOrList(doc.Get("rid"), func(rid string) {
		if ab.rids == nil {
			ab.rids, ab.lengths = map[string]bool{}, map[int]int{}
		}
		if !ab.rids[rid] {
			ab.rids[rid] = true
			ab.lengths[len(rid)]++
		}
	})
	stringOrList(doc.Get("request_ids"), func(id string) {
		if ab.ids == nil {
			ab.ids = map[string]bool{}
		}
		ab.ids[id] = true
	})
	return ab, ab.all || len(ab.rids) > 0 || len(ab.ids) > 0
}

// stringOrList calls each with a string, or with each string of a list
// (its first MaxAbortRIDs), leaving out those empty or over maxRIDBytes
// (and anything not a string). Each is a copy: gjson's strings are slices
// of its copy of the whole body, which a rid kept (aborts.note) would
// keep alive (2026-12-07, a review: 32 aborts of 4 MiB naming a short
// rid each kept 124 MiB).
func stringOrList(v gjson.Result, each func(string)) {
	ok := func(r gjson.Result) bool { return r.Type == gjson.String && r.Str != "" && len(r.Str) <= maxRIDBytes }
	if !v.IsArray() {
		if ok(v) {
			each(strings.Clone(v.Str))
		}
		return
	}
	n := 0
	v.ForEach(func(_, r gjson.Result) bool {
		if n++; ok(r) {
			each(strings.Clone(r.Str))
		}
		return n < MaxAbortRIDs
	})
}

// note records ab, received at. Aborts may be noted out of the order they
// came in (a mesh's are heard late, a client's slow body): each time kept
// is the latest.
func (a *aborts) note(ab abort, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ab.all && at.After(a.all) {
		a.all = at
	}
	for rid := range ab.rids {
		if a.rids == nil {
			a.rids, a.lengths = make(map[string]time.Time), map[int]int{}
		}
		prev, ok := a.rids[rid]
		if !ok && len(a.rids)+len(a.ids) >= maxAbortedRIDs {
			a.forget(at)
		}
		switch {
		case !ok:
			a.lengths[len(rid)]++
			a.rids[rid] = at
		case at.After(prev):
			a.rids[rid] = at
		}
	}
	for id := range ab.ids {
		if a.ids == nil {
			a.ids = make(map[string]time.Time)
		}
		prev, ok := a.ids[id]
		if !ok && len(a.rids)+len(a.ids) >= maxAbortedRIDs {
			a.forget(at)
		}
		if !ok || at.After(prev) {
			a.ids[id] = at
		}
	}
	for {
		last := a.last.Load()
		if at.UnixNano() <= last || a.last.CompareAndSwap(last, at.UnixNano()) {
			break
		}
	}
	if a.news != nil {
		close(a.news)
		a.news = nil
	}
}

// forget drops the rids and ids aborted over abortMemory before now, or,
// if too few are that old, a quarter of each set (so that a flood of
// aborts scans the sets once per thousand of them, not once each, and a
// flood of one kind does not empty the other).
func (a *aborts) forget(now time.Time) {
	n := len(a.rids) + len(a.ids)
	for rid, at := range a.rids {
		if now.Sub(at) > abortMemory {
			a.drop(rid)
		}
	}
	for id, at := range a.ids {
		if now.Sub(at) > abortMemory {
			delete(a.ids, id)
		}
	}
	if len(a.rids)+len(a.ids) <= n-n/4 {
		return
	}
	k := len(a.rids) / 4
	for rid := range a.rids {
		if k--; k < 0 {
			break
		}
		a.drop(rid)
	}
	k = len(a.ids) / 4
	for id := range a.ids {
		if k--; k < 0 {
			break
		}
		delete(a.ids, id)
	}
}

// drop forgets an aborted rid.
func (a *aborts) drop(rid string) {
	delete(a.rids, rid)
	if a.lengths[len(rid)]--; a.lengths[len(rid)] == 0 {
		delete(a.lengths, len(rid))
	}
}

// covers reports whether a client aborted req, now: all requests since it
// arrived, or its rid (one of its batch's), within the last abortMemory.
func (a *aborts) covers(req *Request, now time.Time) bool {
	if last := a.last.Load(); last == 0 || last < req.Received.UnixNano() {
		return false // no abort since it arrived: the lock is not taken
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.all.IsZero() && !a.all.Before(req.Received) && now.Sub(a.all) <= abortMemory {
		return true
	}
	for _, id := range req.engineIDs {
		if at, ok := a.ids[id]; ok && !at.Before(req.Received) && now.Sub(at) <= abortMemory {
			return true
		}
	}
	if len(a.rids) == 0 {
		return false
	}
	return matchRIDs(req.ridList(), a.lengths, func(prefix string) bool {
		at, ok := a.rids[prefix]
		return ok && !at.Before(req.Received) && now.Sub(at) <= abortMemory
	})
}

// covers reports whether ab, received at, covers req.
func (ab abort) covers(req *Request, at time.Time) bool {
	if req.Received.After(at) {
		return false
	}
	if ab.all || slices.ContainsFunc(req.engineIDs, func(id string) bool { return ab.ids[id] }) {
		return true
	}
	return matchRIDs(req.ridList(), ab.lengths, func(prefix string) bool { return ab.rids[prefix] })
}

// maxMatchLookups bounds the lookups of one request's match against the
// aborts: far above a request's few rids times the aborted rids' few
// lengths, so that a hostile batch of rids, against an abort of rids of
// every length, costs no more than that under the locks it is matched in.
const maxMatchLookups = 1 << 14

// matchRIDs reports whether aborted holds a prefix of one of rids (a
// request's), as SGLang matches an aborted rid (a batch's prompts under
// one rid run as rid_0, rid_1, ...): the prefixes of the lengths the
// aborted rids have are looked up, so that the cost is the request's rids
// times those lengths (at most maxMatchLookups), whatever the number of
// aborts remembered.
func matchRIDs(rids []string, lengths map[int]int, aborted func(prefix string) bool) bool {
	lookups := 0
	for _, r := range rids {
		for n := range lengths {
			if lookups++; lookups > maxMatchLookups {
				return false
			}
			if n <= len(r) && aborted(r[:n]) {
				return true
			}
		}
	}
	return false
}

// ridList is the request's rids (its batch's), read from its RID when the
// request began (readRIDs).
func (r *Request) ridList() []string { return r.rids }

// maxRequestRIDs bounds the rids of one request kept (a batch's, past it,
// are not matched against the aborts).
const maxRequestRIDs = 4096

// readRIDs reads the request's rids from its RID: one, or a batch's list
// as JSON (its first maxRequestRIDs strings of at most maxRIDBytes; the
// others are not matched).
func (r *Request) readRIDs() {
	switch rid := r.Parsed.RID; {
	case rid == "":
	case rid[0] == '[':
		gjson.Parse(rid).ForEach(func(_, v gjson.Result) bool {
			if v.Type == gjson.String && len(v.Str) <= maxRIDBytes {
				r.rids = append(r.rids, v.Str)
			}
			return len(r.rids) < maxRequestRIDs
		})
	default:
		r.rids = []string{rid}
	}
}

// readEngineIDs reads the ids a vLLM engine knows the request by, by
// which a client aborts it through vLLM's /abort_requests (matched
// exactly): the client's X-Request-Id header, else its body's request_id,
// with "chatcmpl-" before it (a chat), or with "cmpl-" before it and each
// prompt's index after it (a completion's prompts are the engine's
// requests "cmpl-ID-0", "cmpl-ID-1", ...). Without either, the engine's
// id is a random one the router cannot know.
func (r *Request) readEngineIDs(header string) {
	base := cmp.Or(header, r.Parsed.RequestID)
	if base == "" || len(base) > maxRIDBytes {
		return
	}
	switch r.kind {
	case Chat:
		r.engineIDs = []string{"chatcmpl-" + base}
	case Completion:
		n := min(r.Parsed.Prompts(), maxRequestRIDs)
		r.engineIDs = make([]string, n)
		for i := range n {
			r.engineIDs[i] = "cmpl-" + base + "-" + strconv.Itoa(i)
		}
	}
}

// Abort takes a client's abort (the body of SGLang's /abort_request:
// {"rid": ...}, a list of rids, or {"abort_all": true}; or vLLM's ids,
// {"request_ids": [...]}, as fleet.AbortOf reads them), received at. The
// requests it covers that wait in the router's queue end at once; the
// others are aborted by the engines the front end sends the abort to, and
// their aborts are relayed (ClientAborted). It returns how many requests
// left the queue, and whether the body named any. Call it before the abort
// reaches any replica.
func (c *Core) Abort(body []byte, at time.Time) (ended int, named bool) {
	ab, ok := parseAbort(body)
	if !ok {
		return 0, false
	}
	c.aborts.note(ab, at)
	if c.adm == nil {
		return 0, true
	}
	a := c.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.gate.DropIf(func(r *Request) bool { return r.abortable() && ab.covers(r, at) },
		func(r *Request) { r.held <- verdict{aborted: true} })
	if n > 0 {
		c.cfg.Metrics.queued(a.gate.Len())
	}
	return n, true
}

// ClientAborted reports whether the request's client aborted it through
// the router since it arrived: an engine's abort of it is the client's,
// to be relayed, not tried on another replica.
func (r *Request) ClientAborted(now time.Time) bool { return r.core.aborts.covers(r, now) }

// AwaitClientAbort reports whether the request's client aborted it, as
// ClientAborted does, waiting up to d for the news of one: the engines end
// a request that an abort sent through another router of a mesh covers,
// and that engine's answer may come before the bus's news of the abort.
// A client that leaves ends the wait (ctx is the client's).
func (r *Request) AwaitClientAbort(ctx context.Context, d time.Duration) bool {
	a := &r.core.aborts
	deadline := time.Now().Add(d)
	for {
		news := a.noted() // before the check: an abort noted after it closes news
		if a.covers(r, time.Now()) {
			return true
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return false
		}
		t := time.NewTimer(wait)
		select {
		case <-news:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
			return a.covers(r, time.Now())
		}
	}
}

// abortable reports whether the router ends the request itself when its
// client aborts it before a replica has it: a generation, which SGLang's
// abort ends (chat, completion, /generate). Others (embeddings, a
// Responses API request, a body gorgo does not read) go on to their
// replica, which aborts them if it may.
func (r *Request) abortable() bool {
	return r.kind == Chat || r.kind == Completion || r.kind == Generate
}

// abortedInQueue is SGLang's finish_reason for a request aborted before an
// engine ran it.
var abortedInQueue = map[string]any{"type": "abort", "message": "Abort in waiting queue"}

// endAborted ends a request its client aborted before any replica had it,
// answering as SGLang answers a request aborted in its waiting queue: a
// 200 of no tokens whose finish_reason is an abort (an error status would
// have a trainer's client retry it). It is counted as a 499 (its client
// ended it), and its tenant is charged as for a client that left.
func (r *Request) endAborted(fe FrontEnd) int {
	e := &wire.Error{Status: statusOK, Message: "aborted by its client (/abort_request, /abort_requests) before a replica had it"}
	e.Answer, e.AnswerType = r.abortAnswer(time.Now())
	if !r.sent.IsZero() {
		r.settleBudget(time.Now()) // an attempt that failed may have read its prompt
	} else {
		r.refund(time.Now())
	}
	r.free() // released from the queue or between attempts: its ticket is in a ledger
	r.traceEnd(statusClientGone, time.Now(), e)
	r.core.cfg.Metrics.ended("", r.modelLabel, statusClientGone, noTTFT, 0)
	if tap := r.core.cfg.Tap; tap != nil && r.tapID != 0 { // decided, released from the queue
		tap.Ended(r.tapID, r.ticket.ID, statusClientGone, 0, time.Since(r.Received))
	}
	if log := r.core.cfg.Log; log != nil {
		log.Info("request", r.traceLog("replica", "", "status", statusClientGone, "stream", r.Parsed.Stream, "prompt_tokens", r.Route.PromptTokens,
			"attempts", r.attempts, "error", e.Message)...)
	}
	r.release()
	fe.Refuse(e)
	return statusClientGone
}

// abortAnswer is the answer to a request aborted before any engine ran it,
// in its own shape: SGLang's native one for /generate (one answer per
// prompt and n, a batch's or several as a list), the OpenAI API's otherwise (every
// choice empty, its finish_reason "abort", as SGLang's OpenAI server
// answers); streamed (each answer as an event, then [DONE]) if the
// request streams.
func (r *Request) abortAnswer(now time.Time) (body []byte, contentType string) {
	n, seq := r.Parsed.Answers(), r.core.ids.Add(1) // seq: an id of its own
	var answers []any
	if r.kind == Generate {
		rids := r.answerIDs(n, seq)
		for i := range n {
			a := map[string]any{"text": "", "output_ids": []int{}, "meta_info": map[string]any{
				"id": rids[i], "finish_reason": abortedInQueue, "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}}
			if n > 1 {
				a["index"] = i
			}
			answers = append(answers, a)
		}
	} else {
		object, choice := "chat.completion", func(i int) map[string]any {
			return map[string]any{"index": i, "message": map[string]any{"role": "assistant", "content": ""}, "finish_reason": "abort"}
		}
		if r.Parsed.Stream {
			object, choice = "chat.completion.chunk", func(i int) map[string]any {
				return map[string]any{"index": i, "delta": map[string]any{"role": "assistant", "content": ""}, "finish_reason": "abort"}
			}
		}
		if r.kind == Completion {
			object = "text_completion"
			choice = func(i int) map[string]any { return map[string]any{"index": i, "text": "", "finish_reason": "abort"} }
		}
		choices := make([]map[string]any, n)
		for i := range choices {
			choices[i] = choice(i)
		}
		id := fmt.Sprintf("gorgo-aborted-%d", seq)
		a := map[string]any{"id": id, "object": object, "created": now.Unix(), "model": r.Parsed.Model, "choices": choices}
		usage := map[string]int{"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
		switch {
		case !r.Parsed.Stream:
			a["usage"] = usage
		case r.Parsed.IncludeUsage: // its own chunk, of no choices
			answers = append(answers, a)
			a = map[string]any{"id": id, "object": object, "created": now.Unix(), "model": r.Parsed.Model, "choices": []any{}, "usage": usage}
		}
		answers = append(answers, a)
	}
	if r.Parsed.Stream {
		var b []byte
		for _, a := range answers {
			data, _ := json.Marshal(a)
			b = append(append(append(b, "data: "...), data...), "\n\n"...)
		}
		return append(b, "data: [DONE]\n\n"...), "text/event-stream"
	}
	var v any = answers
	if len(answers) == 1 && !r.Parsed.Batch { // a batch's, even of one, is a list
		v = answers[0]
	}
	data, _ := json.Marshal(v)
	return append(data, '\n'), "application/json"
}

// answerIDs are the ids of a /generate's n answers: its rids (a batch's list),
// a batch's under one rid numbered as SGLang numbers them, or the
// router's own (seq: the request's number).
func (r *Request) answerIDs(n int, seq uint64) []string {
	rids := make([]string, n)
	var list []string
	if rid := r.Parsed.RID; rid != "" && rid[0] == '[' {
		_ = json.Unmarshal([]byte(rid), &list)
	}
	for i := range rids {
		switch {
		case i < len(list):
			rids[i] = list[i]
		case r.Parsed.RID != "" && len(list) == 0 && n == 1:
			rids[i] = r.Parsed.RID
		case r.Parsed.RID != "" && len(list) == 0:
			rids[i] = fmt.Sprintf("%s_%d", r.Parsed.RID, i)
		default:
			rids[i] = fmt.Sprintf("gorgo-aborted-%d-%d", seq, i)
		}
	}
	return rids
}
