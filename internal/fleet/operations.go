package fleet

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"golang.org/x/sync/errgroup"

	"github.com/gorgo-llm/gorgo/internal/lifecycle"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// Engine operations: the engines' paths that act on one engine's state
// rather than serve a request. SGLang's /flush_cache empties its prefix
// cache (GET or POST; a 400 while it has requests), its /abort_request
// aborts a request by its rid, or all of them; vLLM's /reset_prefix_cache
// empties its prefix cache; both load and unload LoRA adapters at run
// time (vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter,
// SGLang's /load_lora_adapter and /unload_lora_adapter); SGLang's
// /update_weights_from_disk loads new weights (and empties its cache),
// its /pause_generation stops generating (by default aborting what runs
// and waits) until /continue_generation, as vLLM's /pause does until
// /resume (both in their development mode); vLLM's /sleep and SGLang's
// /release_memory_occupation free the engine's memory, its weights and
// its cache, until /wake_up or /resume_memory_occupation (the router
// passes a sleeping replica over: it serves nothing). A client of the router means
// them for the fleet behind it, whichever replica serves what: a
// benchmark flushes the caches before a cold run, a
// reinforcement-learning trainer aborts its rollouts, or pauses the
// engines while it updates their weights, a platform loads an adapter for
// the fleet to serve. Each front end sends them to every
// replica that serves requests or still finishes some (draining), at once
// (Operate); a replica without the path (its server's own 404: vLLM has no
// /flush_cache) is passed over. Where a replica's cache was emptied the
// router forgets what it held there, as it does for a restarted engine;
// where an adapter was loaded or unloaded, the router reads the replica's
// models again before the client has its answer, so that its next request
// may name the adapter.

// operations are the engine operations' paths, and the methods each is
// served by: the cache's flushes, the abort, the adapters' loads, the
// weights' update and the pause around it.
var operations = map[string]string{
	"/flush_cache": "GET POST", "/reset_prefix_cache": "POST", "/abort_request": "POST", "/abort_requests": "POST",
	"/v1/load_lora_adapter": "POST", "/v1/unload_lora_adapter": "POST", "/load_lora_adapter": "POST", "/unload_lora_adapter": "POST",
	"/update_weights_from_disk": "POST", "/pause_generation": "POST", "/continue_generation": "POST",
	"/pause": "POST", "/resume": "POST",
	"/sleep": "POST", "/wake_up": "POST", "/release_memory_occupation": "GET POST", "/resume_memory_occupation": "GET POST",
}

// abortAll is an /abort_request's body that aborts everything.
var abortAll = []byte(`{"abort_all":true}`)

// abortsAll reports whether an /abort_request's body aborts every request.
func abortsAll(body []byte) bool {
	var req struct {
		All bool `json:"abort_all"`
	}
	return json.Unmarshal(body, &req) == nil && req.All
}

// AbortOf is the client's abort that an operation (uri: its path and
// query) is, as an /abort_request's body: the abort's own; an abort of all
// for one that aborts what the engines run and hold: SGLang's
// /pause_generation in its default mode ("abort"), its
// /update_weights_from_disk with abort_all_requests, vLLM's /sleep and
// /pause in their default mode ("abort"). ok is false for the others.
func AbortOf(uri string, body []byte) (abort []byte, ok bool) {
	path, query, _ := strings.Cut(uri, "?")
	var req struct {
		Mode     string `json:"mode"`
		AbortAll bool   `json:"abort_all_requests"`
	}
	switch path {
	case "/abort_request":
		return body, true
	case "/abort_requests":
		return vllmAbort(body)
	case "/pause_generation", "/update_weights_from_disk":
		// Without a body, a pause is an abort of all: SGLang up to 0.5.5
		// takes no body and aborts all; later ones refuse it (400), and
		// the client, which meant to pause, sends it again with one.
		// Not taken for an abort, it would have the engines' aborts of
		// what they ran failed over.
		if len(bytes.TrimSpace(body)) > 0 && json.Unmarshal(body, &req) != nil {
			return nil, false // the engines will refuse it
		}
		if path == "/pause_generation" && (req.Mode == "" || req.Mode == "abort") || req.AbortAll {
			return abortAll, true
		}
	case "/sleep":
		if q, err := url.ParseQuery(query); err == nil && (q.Get("mode") == "" || q.Get("mode") == "abort") {
			return abortAll, true
		}
	case "/pause":
		// Its deprecated wait_for_inflight_requests, true, makes it mode
		// "wait" whatever the mode; a value that is not a boolean the
		// engines refuse.
		q, err := url.ParseQuery(query)
		if err != nil || (q.Get("mode") != "" && q.Get("mode") != "abort") {
			break
		}
		if w := q.Get("wait_for_inflight_requests"); w == "" || queryFalse(w) {
			return abortAll, true
		}
	}
	return nil, false
}

// vllmAbort is vLLM's /abort_requests ({"request_ids": a list of ids, or
// one}) as the client's abort: of the requests vLLM's engines know by
// those ids, {"request_ids": [...]} (matched exactly: lifecycle reads
// it), or of all where request_ids is missing or reads as false in
// Python (null, "", [], {}, false, 0), as vLLM's "if request_ids" reads
// it. Nothing else in the body counts.
func vllmAbort(body []byte) ([]byte, bool) {
	if !wire.ValidJSON(body) { // gjson's own recurses per level: a deep body would overflow the stack
		return nil, false // the engines will refuse it
	}
	doc := gjson.ParseBytes(body)
	if doc.Type == gjson.Null {
		return abortAll, true
	}
	if !doc.IsObject() {
		return nil, false
	}
	v := doc.Get("request_ids")
	var ids []string
	switch {
	case !v.Exists(), v.Type == gjson.Null, v.Type == gjson.False:
		return abortAll, true
	case v.Type == gjson.Number:
		if v.Num == 0 {
			return abortAll, true
		}
	case v.Type == gjson.String:
		if v.Str == "" {
			return abortAll, true
		}
		ids = []string{v.Str}
	case v.IsObject(), v.IsArray():
		n := 0
		v.ForEach(func(_, id gjson.Result) bool {
			if n++; id.Type == gjson.String && id.Str != "" && v.IsArray() {
				ids = append(ids, id.Str)
			}
			return n < lifecycle.MaxAbortRIDs
		})
		if n == 0 {
			return abortAll, true
		}
	}
	if len(ids) == 0 {
		return nil, false // it names no request the router knows of
	}
	abort, _ := json.Marshal(map[string][]string{"request_ids": ids})
	return abort, true
}

// queryFalse reports whether a query parameter reads as false, as the
// engines' servers (FastAPI) read a boolean.
func queryFalse(v string) bool {
	switch strings.ToLower(v) {
	case "0", "false", "off", "no", "f", "n":
		return true
	}
	return false
}

// long reports whether path may take a model's load time
// (Operation.LongWait), not a header's: it loads, offloads or frees
// weights, an adapter's or the model's, or may wait for the requests the
// engines run to end (vLLM's /pause in mode "wait").
func long(path string) bool {
	switch path {
	case "/update_weights_from_disk", "/sleep", "/wake_up", "/release_memory_occupation", "/resume_memory_occupation", "/pause":
		return true
	}
	return ChangesAdapters(path)
}

// sleeps reports whether path puts an engine to sleep (frees its memory).
func sleeps(path string) bool { return path == "/sleep" || path == "/release_memory_occupation" }

// wakes reports whether path wakes an engine, in whole or in part.
func wakes(path string) bool { return path == "/wake_up" || path == "/resume_memory_occupation" }

// wholeFleet reports whether path goes to every replica, up or down: the
// engines' sleep and what a trainer does around it (a sleeping engine may
// fail its probes, and must still be woken, given its new weights, and
// let go on).
func wholeFleet(path string) bool {
	switch path {
	case "/update_weights_from_disk", "/pause_generation", "/continue_generation", "/pause", "/resume":
		return true
	}
	return sleeps(path) || wakes(path)
}

// memoryTags are what SGLang's /release_memory_occupation and
// /resume_memory_occupation act on when their body names none.
var memoryTags = []string{"weights", "kv_cache", "cuda_graph"}

// tagsOf is the memory an SGLang release or resume names: those of its
// "tags" that are memoryTags (what a replica is remembered to have
// released is bounded so), all of them when it names none.
func tagsOf(body []byte) []string {
	var req struct {
		Tags []string `json:"tags"`
	}
	if json.Unmarshal(body, &req) != nil || len(req.Tags) == 0 {
		return memoryTags
	}
	var tags []string
	for _, t := range memoryTags {
		if slices.Contains(req.Tags, t) {
			tags = append(tags, t)
		}
	}
	return tags
}

// IsOperation reports whether method and path name an engine operation.
func IsOperation(method, path string) bool {
	methods, ok := operations[path]
	return ok && slices.Contains(strings.Fields(methods), method)
}

// ChangesAdapters reports whether path loads or unloads a LoRA adapter.
func ChangesAdapters(path string) bool {
	return strings.HasSuffix(path, "_lora_adapter") && operations[path] != ""
}

// loads reports whether path loads a LoRA adapter.
func loads(path string) bool {
	return ChangesAdapters(path) && strings.HasSuffix(path, "/load_lora_adapter")
}

// flushes reports whether an operation (uri: its path and query) empties
// a replica's prefix cache (new weights make what it held worthless:
// SGLang empties it by default; a sleeping engine frees it; vLLM's /pause
// clears it but with clear_cache=false or in mode "keep").
func flushes(uri string) bool {
	path, query, _ := strings.Cut(uri, "?")
	if path == "/pause" {
		q, err := url.ParseQuery(query)
		return err == nil && q.Get("mode") != "keep" && !queryFalse(q.Get("clear_cache"))
	}
	return path == "/flush_cache" || path == "/reset_prefix_cache" || path == "/update_weights_from_disk" || sleeps(path)
}

// maxOperationFanOut bounds the replicas asked at once.
const maxOperationFanOut = 32

// maxOperationAnswer bounds what is read of a replica's answer.
const maxOperationAnswer = 64 << 10

// An Operation is an engine operation a client sent, for every replica.
type Operation struct {
	Method string
	// URI is the path and query, as the client sent them.
	URI  string
	Body []byte
	// Header returns the headers to send replica u (the client's less
	// the hop-by-hop ones, with the replica's credentials).
	Header func(u *Upstream) http.Header
	// Wait bounds the whole fan-out (default 30 s), LongWait that of an
	// operation that moves weights (default 5 min).
	Wait, LongWait time.Duration
	// Received is when the client's operation came: an abort (or an
	// operation that aborts) covers the requests received before it.
	Received time.Time
	// Allowed, if set, restricts it to the replicas it accepts (a
	// gateway's subset hint).
	Allowed func(id string) bool
}

// An OperationAnswer is one replica's answer to an engine operation.
type OperationAnswer struct {
	ID     string // the replica's
	Status int
	Header http.Header
	Body   []byte // at most 64 KiB of it
	// Missed are, on an adapter's load that succeeded, the replicas that
	// refused it or could not be reached: they do not serve it.
	Missed []string
	err    error // not reached, or its answer broke off
	lacks  bool  // it has no such path
	// stillAsleep: woken, the replica's /is_sleeping says it sleeps yet
	// (a wake of its weights alone).
	stillAsleep bool
}

// Operate takes the client's abort an operation is (AbortOf: Abort), then
// sends op to every healthy replica that serves or drains (a
// draining replica still finishes its requests: an abort is for them too,
// and its cache is still read by them), at most 32 at once, and returns
// the answer the client is to have: the first that is not a success, else,
// if a replica could not be reached, an error naming it, else the first
// success. A replica that had already done what an adapter's load or
// unload asks (it had the adapter, or did not) is not a refusal. An
// adapter's load that a replica took is a success whatever the others
// said (a replica of another base model refuses it; the router sends
// requests for the adapter only where it is listed), with those that did
// not take it its Missed. The error
// is the router's own answer: no replica to ask (503), one not reached
// (502), none with the path (404).
func (f *Fleet) Operate(ctx context.Context, op Operation) (*OperationAnswer, *wire.Error) {
	path, _, _ := strings.Cut(op.URI, "?")
	var reps []router.ReplicaState
	for _, st := range f.rt.Replicas() {
		// The engines' sleep, and what a trainer does around it, reach
		// every replica, up or not (a sleeping engine may fail its
		// probes); the others, those up.
		up := st.Healthy && st.Probed || wholeFleet(path)
		if up && (st.State == router.Active || st.State == router.Draining) && (op.Allowed == nil || op.Allowed(st.ID)) {
			reps = append(reps, st)
		}
	}
	if len(reps) == 0 {
		e := wire.Errorf(http.StatusServiceUnavailable, "no available replica")
		e.RetryAfter = "5"
		return nil, e
	}
	if abort, ok := AbortOf(op.URI, op.Body); ok && (op.Allowed == nil || !abortsAll(abort)) {
		// Before any replica ends a request it names (an abort of all
		// within a gateway's subset aborts the subset's engines'
		// requests, not this router's every one).
		f.Abort(abort, op.Received)
	}
	wait := cmp.Or(op.Wait, 30*time.Second)
	if long(path) {
		wait = cmp.Or(op.LongWait, 5*time.Minute)
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var tags []string // an SGLang release's or resume's
	if path == "/release_memory_occupation" || path == "/resume_memory_occupation" {
		tags = tagsOf(op.Body)
	}
	answers := make([]OperationAnswer, len(reps))
	var g errgroup.Group
	g.SetLimit(maxOperationFanOut)
	for i, st := range reps {
		g.Go(func() error {
			answers[i] = f.operate(ctx, op, path, st.ID)
			return nil
		})
	}
	_ = g.Wait()
	var failed, unreached, succeeded, settled *OperationAnswer
	var missed []string
	reached, lacking := 0, 0
	for i := range answers {
		a := &answers[i]
		ok := a.Status >= 200 && a.Status < 300
		switch {
		case a.lacks:
			lacking++
			continue
		case a.err != nil:
			if unreached == nil {
				unreached = a
			}
			missed = append(missed, a.ID)
			continue
		case !ok && alreadyDone(path, a):
			if settled == nil {
				settled = a
			}
		case !ok:
			if failed == nil {
				failed = a
			}
			missed = append(missed, a.ID)
		default:
			if succeeded == nil {
				succeeded = a
			}
			if flushes(op.URI) {
				_ = f.rt.ClearCache(a.ID) // its cache is empty: the router's index of it too
				if f.bus != nil {
					f.bus.Flushed(a.ID) // and the other routers'
				}
			}
			switch {
			case path == "/sleep":
				f.setAsleep(a.ID, true)
			case path == "/wake_up":
				f.setAsleep(a.ID, a.stillAsleep)
			case path == "/release_memory_occupation":
				f.release(a.ID, tags)
			case path == "/resume_memory_occupation":
				f.resume(a.ID, tags)
			}
		}
		reached++
	}
	f.log.Info("engine operation", "path", path, "replicas", len(reps), "answered", reached, "without_it", lacking, "unreached", len(reps)-reached-lacking)
	if unreached != nil { // its error may name an internal address: the log's, not the client's
		f.log.Warn("engine operation did not reach a replica", "path", path, "replica", unreached.ID, "error", unreached.err)
	}
	switch {
	case (succeeded != nil || settled != nil) && loads(path) && missed != nil:
		// Loaded, now or before, where it could be.
		f.log.Warn("an adapter's load was refused by some replicas", "path", path, "replicas", missed)
		a := cmp.Or(succeeded, settled)
		a.Missed = missed
		return a, nil
	case failed != nil:
		return failed, nil
	case unreached != nil:
		return nil, wire.Errorf(http.StatusBadGateway, "%s reached %d of the replicas that serve it, not %s", path, reached, unreached.ID)
	case succeeded != nil:
		return succeeded, nil
	case settled != nil:
		return settled, nil
	}
	return nil, wire.Errorf(http.StatusNotFound, "no replica tried serves %s %s", op.Method, path)
}

// operate sends op, body and all, to replica id.
func (f *Fleet) operate(ctx context.Context, op Operation, path, id string) OperationAnswer {
	a := OperationAnswer{ID: id}
	u := f.Upstream(id)
	if u == nil {
		a.err = fmt.Errorf("it left the fleet")
		return a
	}
	req, err := http.NewRequestWithContext(ctx, op.Method, u.URL()+op.URI, bytes.NewReader(op.Body))
	if err != nil {
		a.err = err
		return a
	}
	if op.Header != nil {
		req.Header = op.Header(u)
	}
	if wholeFleet(path) {
		defer u.operating()() // the engine may hold its requests meanwhile: no stall
	}
	resp, err := f.forward.Do(req)
	if err != nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	a.Status, a.Header = resp.StatusCode, resp.Header
	a.Body, a.err = io.ReadAll(io.LimitReader(resp.Body, maxOperationAnswer))
	switch {
	case a.err != nil:
	case a.Status >= 500:
		a.err = fmt.Errorf("it answered %d: %s", a.Status, wire.ErrorMessage(a.Body))
	case a.Status >= 300 && a.Status < 400: // where it points may be an internal host: not relayed
		a.err = fmt.Errorf("it answered %d, a redirect, which gorgo does not follow", a.Status)
	case a.Status == http.StatusNotFound && wire.NoRoute(a.Body):
		a.lacks = true
	case a.Status >= 200 && a.Status < 300 && ChangesAdapters(path):
		f.ModelsChanged(ctx, id)
	case a.Status >= 200 && a.Status < 300 && path == "/wake_up":
		a.stillAsleep, _, _ = f.sleeping(ctx, u) // a wake of its weights alone
	case a.Status >= 200 && a.Status < 300 && (path == "/pause_generation" || path == "/pause" || path == "/continue_generation" || path == "/resume"):
		// Held from its own answer on (not the fan-out's end: another
		// replica's pause may take minutes), here and at the others.
		held := path == "/pause_generation" || path == "/pause"
		f.setHeld(id, held)
		if f.bus != nil {
			f.bus.Held(id, held)
		}
	}
	return a
}

// sleeping asks a replica whether it sleeps (vLLM's GET /is_sleeping,
// beside /sleep in its development mode), waiting at most maxModelsWait;
// known is false if it did not say: answered says whether it answered at
// all (SGLang answers it has no such path).
func (f *Fleet) sleeping(ctx context.Context, u *Upstream) (asleep, known, answered bool) {
	ctx, cancel := context.WithTimeout(ctx, maxModelsWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.URL()+"/is_sleeping", nil)
	if err != nil {
		return false, false, false
	}
	if key := u.APIKey(); key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := f.forward.Do(req)
	if err != nil {
		return false, false, false
	}
	defer resp.Body.Close()
	var answer struct {
		Sleeping *bool `json:"is_sleeping"`
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK || dec.Decode(&answer) != nil || answer.Sleeping == nil {
		return false, false, ctx.Err() == nil
	}
	return *answer.Sleeping, true, true
}

// setAsleep records that replica id sleeps, or not, here and at the other
// routers of a mesh. Woken, it comes back at its next good probe, whatever
// its health while it slept.
func (f *Fleet) setAsleep(id string, asleep bool) {
	if f.rt.SetAsleep(id, asleep) == nil {
		f.slept(id, asleep)
	}
}

// slept does what replica id's new mark, asleep or not, entails: the
// other routers of a mesh told, a woken replica's ejections forgotten, a
// sleeping one's released memory forgotten.
func (f *Fleet) slept(id string, asleep bool) {
	if f.bus != nil {
		f.bus.Slept(id, asleep)
	}
	if u := f.Upstream(id); u != nil {
		u.mu.Lock()
		if !asleep {
			u.health.until, u.health.ejections, u.health.probeFail = time.Time{}, 0, 0
		} else {
			u.released = nil
		}
		u.mu.Unlock()
	}
	f.log.Info("replica asleep", "replica", id, "asleep", asleep)
}

// release records that an SGLang replica freed the memory tags name: it
// sleeps until they are all resumed, or the KV cache is (a trainer resumes
// the weights first, to load new ones, then the cache, and serves).
func (f *Fleet) release(id string, tags []string) {
	u := f.Upstream(id)
	if u == nil {
		return
	}
	u.mu.Lock()
	if u.released == nil {
		u.released = map[string]bool{}
	}
	for _, t := range tags {
		u.released[t] = true
	}
	u.mu.Unlock()
	if err := f.rt.SetAsleep(id, true); err == nil && f.bus != nil {
		f.bus.Slept(id, true)
	}
	f.log.Info("replica asleep", "replica", id, "asleep", true, "released", tags)
}

// resume records that an SGLang replica took back the memory tags name,
// and wakes it when nothing it released is left, or the KV cache is back.
func (f *Fleet) resume(id string, tags []string) {
	u := f.Upstream(id)
	if u == nil {
		return
	}
	u.mu.Lock()
	for _, t := range tags {
		delete(u.released, t)
	}
	awake := len(u.released) == 0 || slices.Contains(tags, "kv_cache")
	u.mu.Unlock()
	if awake {
		f.setAsleep(id, false)
	}
}

// alreadyDone reports whether a replica's refusal of an adapter's load or
// unload says it had already done it: it had the adapter loaded (vLLM's
// "has already been loaded"), or had none of that name to unload ("cannot
// be found", "not found", "not loaded").
func alreadyDone(path string, a *OperationAnswer) bool {
	if !ChangesAdapters(path) || a.Status != http.StatusBadRequest && a.Status != http.StatusNotFound {
		return false
	}
	msg := strings.ToLower(wire.ErrorMessage(a.Body))
	if strings.HasSuffix(path, "/load_lora_adapter") {
		return strings.Contains(msg, "already")
	}
	return strings.Contains(msg, "cannot be found") || strings.Contains(msg, "not found") || strings.Contains(msg, "not loaded")
}
