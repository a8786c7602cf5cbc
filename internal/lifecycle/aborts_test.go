package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// What the router remembers of aborts is bounded: 4,096 rids and vLLM ids, of at most
// 256 bytes, those over a minute old forgotten first; a body it cannot
// read is no abort.
func TestAbortsAreBounded(t *testing.T) {
	var a aborts
	now := time.Unix(1000, 0)
	noteBody(&a, []byte(`{"rid":"old"}`), now.Add(-2*time.Minute))
	for i := range 2 * maxAbortedRIDs {
		noteBody(&a, fmt.Appendf(nil, `{"rid":"r%d"}`, i), now)
	}
	noteBody(&a, []byte(`{"rid":"`+strings.Repeat("x", maxRIDBytes+1)+`"}`), now)
	noteBody(&a, []byte(`{"rid":`), now)
	noteBody(&a, []byte(`{"abort_all":"yes"}`), now)
	for i := range maxAbortedRIDs {
		noteBody(&a, fmt.Appendf(nil, `{"request_ids":["cmpl-%d-0"]}`, i), now)
	}
	if len(a.rids)+len(a.ids) > maxAbortedRIDs || len(a.ids) == 0 || len(a.rids) == 0 || !a.all.IsZero() {
		t.Errorf("%d rids and %d ids remembered, all at %v: want at most %d, of both kinds (a flood of one kind does not empty the other)", len(a.rids), len(a.ids), a.all, maxAbortedRIDs)
	}
	if _, ok := a.rids["old"]; ok {
		t.Error("the rid over a minute old outlived the bound")
	}
}

// An abort covers the requests that arrived before it, for a minute; an
// aborted rid covers the rids it begins, as SGLang matches them (a
// batch's prompts run as rid_0, rid_1, ...).
func TestAbortsCover(t *testing.T) {
	t0 := time.Unix(1000, 0)
	request := func(rid string, received time.Time) *Request {
		var r Request
		r.Parsed.RID, r.Received = rid, received
		r.readRIDs()
		return &r
	}
	var a aborts
	noteBody(&a, []byte(`{"rid":"r1"}`), t0)
	noteBody(&a, []byte(`{"rid":["b"]}`), t0)
	for _, c := range []struct {
		name string
		req  *Request
		now  time.Time
		want bool
	}{
		{"its rid", request("r1", t0.Add(-time.Second)), t0.Add(time.Second), true},
		{"a batch's prompt", request("r1_0", t0.Add(-time.Second)), t0.Add(time.Second), true},
		{"one of a batch's rids", request(`["a","b"]`, t0.Add(-time.Second)), t0.Add(time.Second), true},
		{"another rid", request("r2", t0.Add(-time.Second)), t0.Add(time.Second), false},
		{"arrived after the abort", request("r1", t0.Add(time.Second)), t0.Add(2 * time.Second), false},
		{"an abort long ago", request("r1", t0.Add(-time.Second)), t0.Add(2 * abortMemory), false},
		{"no rid", request("", t0.Add(-time.Second)), t0.Add(time.Second), false},
	} {
		if got := a.covers(c.req, c.now); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	noteBody(&a, []byte(`{"abort_all":true}`), t0)
	if !a.covers(request("", t0.Add(-time.Second)), t0.Add(time.Second)) || a.covers(request("", t0.Add(time.Second)), t0.Add(2*time.Second)) {
		t.Error("an abort of all covers the requests before it, and only those")
	}
}

// vLLM's /abort_requests names requests by the ids its engine knows them
// by, matched exactly: a chat is "chatcmpl-" before its X-Request-Id
// (else its body's request_id), a completion's prompts "cmpl-ID-0",
// "cmpl-ID-1", ... (review, 2026-12-06: a completion was known as
// "cmpl-ID", and the ids were matched as rids, by prefix, so that an
// abort of chatcmpl-roll-1 ended chatcmpl-roll-10).
func TestAbortsByVLLMIDs(t *testing.T) {
	t0 := time.Unix(1000, 0)
	request := func(kind Kind, header, body string, prompts ...int) *Request {
		r := Request{kind: kind, Received: t0.Add(-time.Second)}
		r.Parsed.RequestID = body
		r.Parsed.PromptEnds = prompts
		r.readEngineIDs(header)
		return &r
	}
	var a aborts
	noteBody(&a, []byte(`{"request_ids":["chatcmpl-roll-1","cmpl-roll-2-0","cmpl-roll-3-1","roll-4","cmpl-roll-5"]}`), t0)
	noteBody(&a, []byte(`{"request_ids":"chatcmpl-roll-6"}`), t0)
	for _, c := range []struct {
		name string
		req  *Request
		want bool
	}{
		{"a chat by its header", request(Chat, "roll-1", "other"), true},
		{"a chat by its body", request(Chat, "", "roll-1"), true},
		{"a chat whose id the abort's begins", request(Chat, "roll-10", ""), false},
		{"a completion's one prompt", request(Completion, "roll-2", ""), true},
		{"a completion's second prompt", request(Completion, "roll-3", "", 5, 9), true},
		{"a completion named without its prompt's index", request(Completion, "roll-5", ""), false},
		{"an id without its prefix", request(Chat, "roll-4", ""), false},
		{"one id, not a list", request(Chat, "roll-6", ""), true},
		{"a /generate", request(Generate, "roll-1", ""), false},
		{"no id", request(Chat, "", ""), false},
	} {
		if got := a.covers(c.req, t0.Add(time.Second)); got != c.want {
			t.Errorf("%s (ids %q): remembered abort covers it %v, want %v", c.name, c.req.engineIDs, got, c.want)
		}
		ab, _ := parseAbort([]byte(`{"request_ids":["chatcmpl-roll-1","cmpl-roll-2-0","cmpl-roll-3-1","roll-4","cmpl-roll-5","chatcmpl-roll-6"]}`))
		if got := ab.covers(c.req, t0); got != c.want {
			t.Errorf("%s (ids %q): the abort covers it %v, want %v", c.name, c.req.engineIDs, got, c.want)
		}
	}
	if r := request(Completion, "", strings.Repeat("x", 10), make([]int, 2*maxRequestRIDs)...); len(r.engineIDs) != maxRequestRIDs {
		t.Errorf("a batch of %d prompts has %d ids, want at most %d", 2*maxRequestRIDs, len(r.engineIDs), maxRequestRIDs)
	}
}

// noteBody notes an /abort_request's body, if it names requests.
func noteBody(a *aborts, body []byte, at time.Time) {
	if ab, ok := parseAbort(body); ok {
		a.note(ab, at)
	}
}

// serveAsync serves body on c in the background; the channel has its
// status once Serve returns, and fe what the client was answered.
func serveAsync(c *Core, body string, kind Kind) (*frontEnd, <-chan int) {
	fe, done := &frontEnd{}, make(chan int, 1)
	go func() {
		done <- c.Serve(context.Background(), Incoming{Body: []byte(body), Kind: kind, Received: time.Now()}, fe)
	}()
	return fe, done
}

// waitQueued waits until n requests wait in c's queue.
func waitQueued(t *testing.T, c *Core, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.adm.mu.Lock()
		held := c.adm.gate.Len()
		c.adm.mu.Unlock()
		if held == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued, want %d", held, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A client's abort ends the requests it names that wait in the router's
// queue, which no engine has to abort, at once: each answered as SGLang
// answers a request aborted in its waiting queue (a 200 of no tokens,
// finish_reason abort), none sent to a replica (2026-12-06: they stayed
// queued, and ran once released). What arrives after the abort waits on.
func TestAbortEndsQueuedRequests(t *testing.T) {
	c, _ := admissionCore(t, admit.ModeQueue)
	// Two 7.5k-token prompts: 75 s of backlog on each replica.
	big := []*Request{begin(t, c, chatOf(6000, "one")), begin(t, c, chatOf(6000, "two"))}
	r1, done1 := serveAsync(c, `{"text":"one","rid":"r1","stream":true}`, Generate)
	waitQueued(t, c, 1)
	r2, done2 := serveAsync(c, `{"text":["two","three"],"rid":["r2a","r2b"]}`, Generate)
	waitQueued(t, c, 2)
	chat, done3 := serveAsync(c, string(chatOf(10, "four")), Chat)
	waitQueued(t, c, 3)

	if n, _ := c.Abort([]byte(`{"rid":"r1"}`), time.Now()); n != 1 {
		t.Fatalf("abort of r1 ended %d queued requests, want 1", n)
	}
	if st := <-done1; st != statusClientGone || r1.refused == nil || len(r1.sent) != 0 {
		t.Fatalf("r1: status %d, answered %+v, sent to %v", st, r1.refused, r1.sent)
	}
	want := "data: {\"meta_info\":{\"cached_tokens\":0,\"completion_tokens\":0,\"finish_reason\":{\"message\":\"Abort in waiting queue\",\"type\":\"abort\"},\"id\":\"r1\",\"prompt_tokens\":0},\"output_ids\":[],\"text\":\"\"}\n\ndata: [DONE]\n\n"
	if e := r1.refused; e.Status != 200 || e.AnswerType != "text/event-stream" || string(e.Answer) != want {
		t.Errorf("r1 answered %d %s %q, want SGLang's abort %q", e.Status, e.AnswerType, e.Answer, want)
	}
	waitQueued(t, c, 2)

	abortAt := time.Now()
	time.Sleep(time.Millisecond) // the next request arrives after the abort
	later, doneLater := serveAsync(c, `{"text":"five","rid":"r5"}`, Generate)
	waitQueued(t, c, 3)
	if n, _ := c.Abort([]byte(`{"abort_all":true}`), abortAt); n != 2 {
		t.Fatalf("abort of all ended %d queued requests, want the 2 before it", n)
	}
	<-done2
	<-done3
	var batch []map[string]any
	if e := r2.refused; e == nil || e.Status != 200 || e.AnswerType != "application/json" || json.Unmarshal(e.Answer, &batch) != nil || len(batch) != 2 {
		t.Fatalf("the batch answered %+v, want a list of two answers", e)
	}
	for i, id := range []string{"r2a", "r2b"} {
		meta := batch[i]["meta_info"].(map[string]any)
		if meta["id"] != id || meta["finish_reason"].(map[string]any)["type"] != "abort" || batch[i]["index"] != float64(i) {
			t.Errorf("batch answer %d: %v", i, batch[i])
		}
	}
	if e := chat.refused; e == nil || e.Status != 200 || !strings.Contains(string(e.Answer), `"object":"chat.completion.chunk"`) ||
		!strings.Contains(string(e.Answer), `"finish_reason":"abort"`) || !strings.HasSuffix(string(e.Answer), "data: [DONE]\n\n") {
		t.Errorf("the chat answered %+v", e)
	}
	if len(r2.sent)+len(chat.sent) != 0 {
		t.Errorf("aborted requests sent to %v and %v", r2.sent, chat.sent)
	}
	waitQueued(t, c, 1) // the one that came after the abort
	select {
	case st := <-doneLater:
		t.Fatalf("a request after the abort ended %d (%+v)", st, later.refused)
	default:
	}
	// Its backlog gone, the later request is served.
	for _, b := range big {
		b.sendAt(time.Now())
		b.Chunk(&wire.Peek{Token: true}, time.Now())
	}
	if st := <-doneLater; st != 200 || len(later.sent) != 1 {
		t.Errorf("the request after the abort: %d, sent to %v", st, later.sent)
	}
}

// An abort that comes while an attempt is out ends the request there if
// that attempt fails: it is not tried on the next replica, which the
// abort passed before the request reached it.
func TestAbortBetweenAttempts(t *testing.T) {
	c, _, _, _ := setup(t)
	tap := &tapRec{}
	c.cfg.Tap = tap
	fe := &abortingFrontEnd{c: c}
	st := c.Serve(context.Background(), Incoming{Body: []byte(`{"text":"hi","rid":"x1"}`), Kind: Generate, Received: time.Now()}, fe)
	if st != statusClientGone || len(fe.sent) != 1 || fe.refused == nil || !strings.Contains(string(fe.refused.Answer), `"id":"x1"`) {
		t.Errorf("status %d after attempts on %v, answered %+v; want the abort after one", st, fe.sent, fe.refused)
	}
	if len(tap.decided) != 1 || len(tap.ended) != 1 {
		t.Errorf("the live view heard of %d decisions and %d ends, want one of each", len(tap.decided), len(tap.ended))
	}
	c.cfg.Tap = nil
	for _, id := range []string{"a", "b", "c"} {
		if st, _ := c.cfg.Router.Replica(id); st.InFlight != 0 {
			t.Errorf("%s keeps %d in flight", id, st.InFlight)
		}
	}
	// Through a gateway, the next attempt is one the gateway already made:
	// not ended here (review, 2026-12-06).
	fe = &abortingFrontEnd{c: c}
	in := Incoming{Body: []byte(`{"text":"hi","rid":"x1"}`), Kind: Generate, Received: time.Now(), GatewaySends: true}
	if st := c.Serve(context.Background(), in, fe); st != 200 || len(fe.sent) != 2 {
		t.Errorf("through a gateway: status %d after attempts on %v, want 200 after two", st, fe.sent)
	}
	// Another rid's request is tried on.
	fe = &abortingFrontEnd{c: c}
	if st := c.Serve(context.Background(), Incoming{Body: []byte(`{"text":"hi","rid":"y1"}`), Kind: Generate, Received: time.Now()}, fe); st != 200 || len(fe.sent) != 2 {
		t.Errorf("y1: status %d after attempts on %v, want 200 after two", st, fe.sent)
	}
}

// abortingFrontEnd's first attempt sees its client abort x1, then fails;
// the others are served.
type abortingFrontEnd struct {
	frontEnd
	c *Core
}

func (f *abortingFrontEnd) Send(ctx context.Context, r *Request, id string) (int, *AttemptError) {
	if len(f.sent) == 0 {
		f.sent = append(f.sent, id)
		f.c.Abort([]byte(`{"rid":"x1"}`), time.Now())
		return 0, &AttemptError{Error: *wire.Errorf(502, "cut"), Broken: true}
	}
	return f.frontEnd.Send(ctx, r, id)
}

// Aborts may be noted out of the order they came in (a mesh's are heard
// late, a slow client's body): an earlier one does not undo a later one
// (2026-12-06, review: each time was overwritten, and the latest abort's
// time with it, which hid every later abort from the requests between).
func TestEarlierAbortDoesNotUndoALaterOne(t *testing.T) {
	t0 := time.Unix(1000, 0)
	between := func(rid string) *Request { // arrived between the two aborts
		var r Request
		r.Parsed.RID, r.Received = rid, t0.Add(time.Second)
		r.readRIDs()
		return &r
	}
	now := t0.Add(3 * time.Second)
	for _, c := range []struct{ name, later, earlier, rid string }{
		{"another rid", `{"rid":"x"}`, `{"rid":"y"}`, "x"},
		{"all", `{"abort_all":true}`, `{"abort_all":true}`, ""},
		{"the same rid", `{"rid":"x"}`, `{"rid":"x"}`, "x"},
	} {
		var a aborts
		noteBody(&a, []byte(c.later), t0.Add(2*time.Second))
		noteBody(&a, []byte(c.earlier), t0)
		if !a.covers(between(c.rid), now) {
			t.Errorf("%s: the earlier abort undid the later one", c.name)
		}
	}
}

// What a request's match against the aborts costs does not grow with the
// aborts remembered: each of its rid's prefixes is looked up.
func BenchmarkAbortCovers(b *testing.B) {
	t0 := time.Unix(1000, 0)
	var a aborts
	for i := range maxAbortedRIDs {
		noteBody(&a, fmt.Appendf(nil, `{"rid":"rollout-%d"}`, i), t0.Add(time.Second))
	}
	reqs := make([]*Request, 1024)
	for i := range reqs {
		reqs[i] = &Request{Received: t0}
		reqs[i].Parsed.RID = fmt.Sprintf("other-%d", i)
		reqs[i].readRIDs()
	}
	b.ResetTimer()
	for range b.N {
		for _, r := range reqs {
			a.covers(r, t0.Add(2*time.Second))
		}
	}
}

// The answer to a request aborted before a replica had it is in the
// request's own shape: a batch's a list, even of one; a stream's usage,
// asked for, in a chunk of its own.
func TestAbortAnswerShapes(t *testing.T) {
	c, _, _, _ := setup(t)
	for _, tc := range []struct {
		body, want string
		kind       Kind
	}{
		{`{"text":["one"],"rid":["r"]}`, `[{"meta_info":{"cached_tokens":0,"completion_tokens":0,"finish_reason":{"message":"Abort in waiting queue","type":"abort"},"id":"r","prompt_tokens":0},"output_ids":[],"text":""}]` + "\n", Generate},
		{`{"text":"one","rid":"r","sampling_params":{"n":2}}`, `[{"index":0,`, Generate},
		{`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`, `"choices":[],`, Chat},
		{`{"model":"m","prompt":"hi"}`, `"choices":[{"finish_reason":"abort","index":0,"text":""}],`, Completion},
	} {
		r, e := c.begin([]byte(tc.body), tc.kind, "", time.Now(), false)
		if e != nil {
			t.Fatal(e.Message)
		}
		body, _ := r.abortAnswer(time.Now())
		if !strings.Contains(string(body), tc.want) {
			t.Errorf("%s: answered %s, want %s in it", tc.body, body, tc.want)
		}
		r.release()
	}
}

// A router waits a while for the news of an abort (a mesh's may come
// after the engine's answer): one noted meanwhile is seen at once, none
// within the wait is none.
func TestAwaitClientAbort(t *testing.T) {
	c, _, _, _ := setup(t)
	r, e := c.begin([]byte(`{"text":"hi","rid":"r9"}`), Generate, "", time.Now(), false)
	if e != nil {
		t.Fatal(e.Message)
	}
	defer r.release()
	if r.AwaitClientAbort(context.Background(), 10*time.Millisecond) {
		t.Fatal("no abort came, yet one was seen")
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		c.Abort([]byte(`{"rid":"other"}`), time.Now()) // news, but not of r9
		time.Sleep(20 * time.Millisecond)
		c.Abort([]byte(`{"rid":"r9"}`), time.Now())
	}()
	gone, leave := context.WithCancel(context.Background())
	leave()
	if r.AwaitClientAbort(gone, time.Minute) {
		t.Fatal("a client gone: an abort seen")
	}
	start := time.Now()
	if !r.AwaitClientAbort(context.Background(), time.Minute) {
		t.Fatal("the abort noted during the wait was not seen")
	}
	if waited := time.Since(start); waited > 30*time.Second {
		t.Errorf("waited %v for an abort noted after about 40 ms", waited)
	}
}

// A batch's rids are matched up to its 4,096th (review, 2026-12-06: only
// its first 4,096 were, then every one, then a hostile list of 2M rids
// held the locks for seconds and its request tens of MB): what a request
// keeps, and what matching it costs, are bounded.
func TestAbortOfABigBatch(t *testing.T) {
	rids := make([]string, 5000)
	for i := range rids {
		rids[i] = fmt.Sprintf("rollout-%d", i)
	}
	list, _ := json.Marshal(rids)
	t0 := time.Unix(1000, 0)
	r := &Request{Received: t0}
	r.Parsed.RID = string(list)
	r.readRIDs()
	if len(r.rids) != maxRequestRIDs {
		t.Fatalf("%d rids kept, want %d", len(r.rids), maxRequestRIDs)
	}
	for _, c := range []struct {
		rid  string
		want bool
	}{{"rollout-4095", true}, {"rollout-4999", false}} {
		ab, _ := parseAbort([]byte(`{"rid":"` + c.rid + `"}`))
		if got := ab.covers(r, t0.Add(time.Second)); got != c.want {
			t.Errorf("an abort of %s covers the batch in the queue: %v, want %v", c.rid, got, c.want)
		}
		var a aborts
		a.note(ab, t0.Add(time.Second))
		if got := a.covers(r, t0.Add(2*time.Second)); got != c.want {
			t.Errorf("an abort of %s covers the batch (ClientAborted): %v, want %v", c.rid, got, c.want)
		}
	}
	// Every length aborted, against the batch: the lookups stop.
	var every strings.Builder
	every.WriteString(`{"rid":[`)
	for n := 1; n <= maxRIDBytes; n++ {
		if n > 1 {
			every.WriteByte(',')
		}
		every.WriteString(`"` + strings.Repeat("z", n) + `"`)
	}
	every.WriteString(`]}`)
	ab, _ := parseAbort([]byte(every.String()))
	lookups := 0
	matchRIDs(r.rids, ab.lengths, func(string) bool { lookups++; return false })
	if lookups > maxMatchLookups {
		t.Errorf("%d lookups for one request, want at most %d", lookups, maxMatchLookups)
	}
}

// What a hostile batch's rids cost an abort is its rids times the
// lengths of the rids aborted, not their prefixes.
func BenchmarkAbortCoversBigBatch(b *testing.B) {
	rids := make([]string, 4096)
	for i := range rids {
		rids[i] = strings.Repeat("x", 250) + fmt.Sprint(i)
	}
	list, _ := json.Marshal(rids)
	t0 := time.Unix(1000, 0)
	r := &Request{Received: t0}
	r.Parsed.RID = string(list)
	r.readRIDs()
	var a aborts
	noteBody(&a, []byte(`{"rid":"rollout-1"}`), t0.Add(time.Second))
	b.ResetTimer()
	for range b.N {
		a.covers(r, t0.Add(2*time.Second))
	}
}

// An abort's body is read in bounded memory: a list of rids (or ids)
// past MaxAbortRIDs is read as its first MaxAbortRIDs, and a body of
// millions of short rids is not made into millions of map entries
// (2026-12-07, a review: an abort of 8 MiB, 944,411 rids, took 56 MiB
// and 1.6 s to read). Its parse allocates less than three times its size
// (1.8 measured, 6.3 before the fix; the runtime's counters are the
// process's, so other goroutines' allocations count too: room for them).
func TestAbortBodyIsReadInBoundedMemory(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"rid":[`)
	const n = 900_000
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"r%d"`, i)
	}
	b.WriteString(`]}`)
	body := []byte(b.String())
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	ab, ok := parseAbort(body)
	runtime.ReadMemStats(&after)
	if !ok || len(ab.rids) != MaxAbortRIDs || !ab.rids["r0"] || ab.rids[fmt.Sprint("r", MaxAbortRIDs)] {
		t.Fatalf("an abort of %d rids read as %d (ok %v), want its first %d", n, len(ab.rids), ok, MaxAbortRIDs)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 3*uint64(len(body)) {
		t.Errorf("reading an abort of %d bytes allocated %d", len(body), alloc)
	}
	// The same for vLLM's ids, and a short list read whole.
	ab, _ = parseAbort([]byte(strings.Replace(string(body), `"rid"`, `"request_ids"`, 1)))
	if len(ab.ids) != MaxAbortRIDs {
		t.Errorf("an abort of %d ids read as %d, want %d", n, len(ab.ids), MaxAbortRIDs)
	}
	if ab, ok := parseAbort([]byte(`{"rid":["a","",7,"b"],"request_ids":"c"}`)); !ok || len(ab.rids) != 2 || !ab.ids["c"] || ab.all {
		t.Errorf("a short abort: %+v, %v", ab, ok)
	}
	for _, bad := range []string{`[1]`, `"rid"`, `null`, `{"rid":`, `{}`, `{"abort_all":false}`} {
		if _, ok := parseAbort([]byte(bad)); ok {
			t.Errorf("%s read as an abort", bad)
		}
	}
	if ab, ok := parseAbort([]byte(`{"abort_all":true}`)); !ok || !ab.all {
		t.Errorf("an abort of all: %+v, %v", ab, ok)
	}
}

// A rid an abort names, remembered, keeps only itself: not the abort's
// body it was read from (2026-12-07, a review: gjson's strings are slices
// of its copy of the body; 32 aborts of 4 MiB naming a short rid each
// kept 124 MiB).
func TestRememberedRIDKeepsNotItsBody(t *testing.T) {
	pad := strings.Repeat("x", 4<<20)
	var a aborts
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	for i := range 32 {
		noteBody(&a, []byte(fmt.Sprintf(`{"rid":"r%d","pad":"%s"}`, i, pad)), time.Now())
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	if len(a.rids) != 32 {
		t.Fatalf("%d rids remembered, want 32", len(a.rids))
	}
	if ms.HeapAlloc > before && ms.HeapAlloc-before > 16<<20 {
		t.Errorf("32 remembered rids keep %d MiB of heap", (ms.HeapAlloc-before)>>20)
	}
	runtime.KeepAlive(&a)
}

// An abort body nested deeper than a validator that recurses can take
// (8 MiB of '[', the default max_body_bytes) is refused, not a crash: the
// router's goroutine stack would pass Go's limit (2026-12-07, a review).
func TestDeepAbortBodyIsRefused(t *testing.T) {
	if _, ok := parseAbort(bytes.Repeat([]byte{'['}, 8<<20)); ok {
		t.Error("a body of 8 MiB of '[' read as an abort")
	}
}
