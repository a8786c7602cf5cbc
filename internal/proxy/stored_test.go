package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// responseID is the id of a responses answer, streamed or not.
func responseID(t *testing.T, body string) string {
	t.Helper()
	if i := strings.Index(body, `"id":"resp_`); i >= 0 {
		id, _, _ := strings.Cut(body[i+len(`"id":"`):], `"`)
		return id
	}
	t.Fatalf("no response id in %q", body)
	return ""
}

// A conversation kept by the engines' stores (previous_response_id) goes
// on at the replica that stored its last response, whichever the policy
// would pick: each replica holds only its own (found 2026-12-05: routed by
// cost, most follow-ups were answered "not found").
func TestStoredResponsesStayWhereTheyAreStored(t *testing.T) {
	engines := []*vllmEngine{newVLLMEngine(t, "a"), newVLLMEngine(t, "b"), newVLLMEngine(t, "c")}
	_, url := startProxy(t, testConfig{}, engines[0].replica, engines[1].replica, engines[2].replica)
	prev := ""
	for i := range 24 {
		body := fmt.Sprintf(`{"model":"m","input":"turn %d","stream":%v`, i, i%2 == 1)
		if prev != "" {
			body += fmt.Sprintf(`,"previous_response_id":%q`, prev)
		}
		status, answer := do(t, "POST", url+"/v1/responses", body+"}")
		if status != http.StatusOK {
			t.Fatalf("turn %d: %d %s", i, status, answer)
		}
		prev = responseID(t, answer)
	}
	// Another conversation, another place perhaps; its own turns stay too.
	status, answer := do(t, "POST", url+"/v1/responses", `{"model":"m","input":"other","store":true}`)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, answer)
	}
	other := responseID(t, answer)

	// GET and cancel go to the replica that holds it.
	for _, id := range []string{prev, other} {
		if status, answer := do(t, "GET", url+"/v1/responses/"+id, ""); status != http.StatusOK || !strings.Contains(answer, id) {
			t.Errorf("GET %s: %d %s", id, status, answer)
		}
		if status, answer := do(t, "POST", url+"/v1/responses/"+id+"/cancel", ""); status != http.StatusOK || !strings.Contains(answer, "cancelled") {
			t.Errorf("cancel %s: %d %s", id, status, answer)
		}
	}
	if status, answer := do(t, "GET", url+"/v1/responses/resp_nowhere", ""); status != http.StatusNotFound {
		t.Errorf("GET of a response nobody holds: %d %s", status, answer)
	}
}

// When the replica that stored the response fails, the follow-up is tried
// elsewhere: a store the replicas share holds it there too, and one that
// does not answers that it does not (a failing replica must not lose a
// request another could serve).
func TestStoredResponseHolderFails(t *testing.T) {
	a := newVLLMEngine(t, "a")
	b := newVLLMEngine(t, "b")
	_, url := startProxy(t, testConfig{}, a.replica, b.replica)
	status, answer := do(t, "POST", url+"/v1/responses", `{"model":"m","input":"hi"}`)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, answer)
	}
	id := responseID(t, answer)
	holder, other := a, b
	if strings.HasPrefix(id, "resp_b") {
		holder, other = b, a
	}
	holder.mu.Lock()
	holder.next = http.StatusInternalServerError
	holder.mu.Unlock()
	other.mu.Lock()
	other.held[id] = true // a store they share
	other.mu.Unlock()
	status, answer = do(t, "POST", url+"/v1/responses", fmt.Sprintf(`{"model":"m","input":"and?","previous_response_id":%q}`, id))
	if status != http.StatusOK || !strings.Contains(answer, "resp_"+other.name) {
		t.Errorf("after its holder failed: %d %s, want the other's answer", status, answer)
	}
}

// vllmEngine is a fake engine shaped as vLLM's Responses API is: its
// answer's members in ResponsesResponse's order (id, created_at,
// incomplete_details, instructions, metadata, model, object, ...), the
// request's instructions echoed, each streamed lifecycle event carrying
// the whole response, a follow-up or GET of a response it does not hold
// answered 404 "Response with id '...' not found.", GET ?stream=true
// replaying a response's events (here: two, gap apart).
type vllmEngine struct {
	name string
	mu   sync.Mutex
	held map[string]bool
	n    int
	next int // status of the next POST /v1/responses, if not 0
	gap  time.Duration
	*replica
}

func newVLLMEngine(t *testing.T, name string) *vllmEngine {
	e := &vllmEngine{name: name, held: map[string]bool{}, gap: time.Second}
	e.replica = fakeUpstream(t, e.serve)
	return e
}

func notFound(w http.ResponseWriter, id string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":"response_id","code":404}}`, id)
}

func (e *vllmEngine) response(id, instructions, status string) string {
	ins, _ := json.Marshal(instructions)
	if instructions == "" {
		ins = []byte("null")
	}
	return fmt.Sprintf(`{"id":%q,"created_at":1,"incomplete_details":null,"instructions":%s,"metadata":null,"model":"m","object":"response","output":[],"status":%q,"usage":{"input_tokens":5,"output_tokens":1,"total_tokens":6}}`, id, ins, status)
}

func (e *vllmEngine) serve(w http.ResponseWriter, r *http.Request) {
	fl := w.(http.Flusher)
	if rest, ok := strings.CutPrefix(r.URL.Path, "/v1/responses/"); ok {
		id, cancel := strings.CutSuffix(rest, "/cancel")
		e.mu.Lock()
		held := e.held[id]
		e.mu.Unlock()
		if !held {
			notFound(w, id)
			return
		}
		if r.Method == http.MethodGet && r.URL.Query().Get("stream") == "true" {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: response.created\ndata: {\"response\":%s,\"sequence_number\":0,\"type\":\"response.created\"}\n\n", e.response(id, "", "in_progress"))
			fl.Flush()
			time.Sleep(e.gap)
			fmt.Fprintf(w, "event: response.completed\ndata: {\"response\":%s,\"sequence_number\":1,\"type\":\"response.completed\"}\n\n", e.response(id, "", "completed"))
			return
		}
		status := "completed"
		if cancel {
			status = "cancelled"
		}
		fmt.Fprint(w, e.response(id, "", status))
		return
	}
	var req struct {
		Previous     string `json:"previous_response_id"`
		Stream       bool   `json:"stream"`
		Instructions string `json:"instructions"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	if s := e.next; s != 0 {
		e.next = 0
		e.mu.Unlock()
		http.Error(w, `{"error":{"message":"busy"}}`, s)
		return
	}
	if req.Previous != "" && !e.held[req.Previous] {
		e.mu.Unlock()
		notFound(w, req.Previous)
		return
	}
	e.n++
	id := fmt.Sprintf("resp_%s%d", e.name, e.n)
	e.held[id] = true
	e.mu.Unlock()
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, e.response(id, req.Instructions, "completed"))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	// As a large event reaches the proxy: in pieces.
	created := fmt.Sprintf("event: response.created\ndata: {\"response\":%s,\"sequence_number\":0,\"type\":\"response.created\"}\n\n", e.response(id, req.Instructions, "in_progress"))
	for len(created) > 0 {
		n := min(len(created), 8<<10)
		fmt.Fprint(w, created[:n])
		fl.Flush()
		created = created[n:]
		time.Sleep(2 * time.Millisecond)
	}
	fmt.Fprint(w, "event: response.output_text.delta\ndata: {\"content_index\":0,\"delta\":\"ok\",\"item_id\":\"msg_1\",\"output_index\":0,\"sequence_number\":1,\"type\":\"response.output_text.delta\"}\n\n")
	fmt.Fprintf(w, "event: response.completed\ndata: {\"response\":%s,\"sequence_number\":2,\"type\":\"response.completed\"}\n\n", e.response(id, req.Instructions, "completed"))
}

func (e *vllmEngine) holds(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.held[id]
}

// The holder is busy (503, or 429): the follow-up goes to a replica that
// does not hold the response, whose 404 reaches the client, a permanent
// "not found" for a response that exists; the client should hear the
// holder's retryable status.
func TestBusyHolderIsNotANotFound(t *testing.T) {
	a, b := newVLLMEngine(t, "a"), newVLLMEngine(t, "b")
	_, url := startProxy(t, testConfig{}, a.replica, b.replica)
	status, answer := do(t, "POST", url+"/v1/responses", `{"model":"m","input":"hi"}`)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, answer)
	}
	id := responseID(t, answer)
	holder := a
	if b.holds(id) {
		holder = b
	}
	holder.mu.Lock()
	holder.next = http.StatusServiceUnavailable
	holder.mu.Unlock()
	status, answer = do(t, "POST", url+"/v1/responses", fmt.Sprintf(`{"model":"m","input":"and?","previous_response_id":%q}`, id))
	if status == http.StatusNotFound {
		t.Errorf("holder busy: the client was told %d %s", status, answer)
	}
}

// A router that does not know the holder (restarted, another router not in
// a mesh, or the id fell out of its memory) sends a follow-up or a cancel
// where the policy says: a replica that does not hold it answers 404 and
// that is relayed, though another replica holds it (a GET of the same id
// searches the replicas and finds it, and does not learn the holder either).
func TestUnknownHolderFollowUpAndCancel(t *testing.T) {
	a, b := newVLLMEngine(t, "a"), newVLLMEngine(t, "b")
	_, url1 := startProxy(t, testConfig{}, a.replica, b.replica)
	_, url2 := startProxy(t, testConfig{}, a.replica, b.replica) // knows nothing of url1's answers
	var ids []string
	for i := 0; len(ids) < 8 && i < 200; i++ {
		status, answer := do(t, "POST", url1+"/v1/responses", fmt.Sprintf(`{"model":"m","input":"conversation %d"}`, i))
		if status != http.StatusOK {
			t.Fatalf("%d %s", status, answer)
		}
		id := responseID(t, answer)
		// some on each replica
		if (len(ids)%2 == 0) == a.holds(id) {
			ids = append(ids, id)
		}
	}
	if len(ids) < 8 {
		t.Skip("the policy put every response on one replica")
	}
	lost := 0
	for _, id := range ids {
		if status, _ := do(t, "GET", url2+"/v1/responses/"+id, ""); status != http.StatusOK {
			t.Fatalf("GET %s: %d", id, status)
		}
		if status, answer := do(t, "POST", url2+"/v1/responses", fmt.Sprintf(`{"model":"m","input":"and?","previous_response_id":%q}`, id)); status != http.StatusOK {
			lost++
			t.Logf("follow-up of %s: %d %.120s", id, status, answer)
		}
		if status, answer := do(t, "POST", url2+"/v1/responses/"+id+"/cancel", ""); status != http.StatusOK {
			lost++
			t.Logf("cancel of %s: %d %.120s", id, status, answer)
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d follow-ups and cancels answered 404 though a replica holds the response (GET found each)", lost, 2*len(ids))
	}
}

// GET /v1/responses/{id}?stream=true (vLLM replays a stored, perhaps
// still running, background response's events) outlives header_timeout,
// which bounds only its headers (2026-12-05: the whole answer was copied
// under a context with that timeout, and cut).
func TestGetStreamOutlivesHeaderTimeout(t *testing.T) {
	a, b := newVLLMEngine(t, "a"), newVLLMEngine(t, "b")
	a.gap, b.gap = 2500*time.Millisecond, 2500*time.Millisecond // the headers come at once, the events 2.5 s apart
	_, url := startProxy(t, testConfig{Proxy: Config{HeaderTimeout: time.Second}}, a.replica, b.replica)
	status, answer := do(t, "POST", url+"/v1/responses", `{"model":"m","input":"hi"}`)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, answer)
	}
	id := responseID(t, answer)
	status, answer = do(t, "GET", url+"/v1/responses/"+id+"?stream=true", "")
	if status != http.StatusOK || !strings.Contains(answer, "response.completed") {
		t.Errorf("GET ?stream=true of a response whose events take 2.5 s (header_timeout 1 s): %d, response.completed missing: %.300q", status, answer)
	}
}

// A draining replica still holds its responses (its requests in flight,
// and a background response's generation, finish): a client polling GET
// for a background response's result, or cancelling it, reaches it (a
// cancel is forwarded as a GET is, not dispatched: a dispatch takes no
// draining replica).
func TestDrainingHolder(t *testing.T) {
	for _, method := range []string{"GET", "POST"} {
		a, b := newVLLMEngine(t, "a"), newVLLMEngine(t, "b")
		tr, url := startProxy(t, testConfig{}, a.replica, b.replica)
		status, answer := do(t, "POST", url+"/v1/responses", `{"model":"m","input":"hi","background":true}`)
		if status != http.StatusOK {
			t.Fatalf("%d %s", status, answer)
		}
		id := responseID(t, answer)
		holder := "a"
		if b.holds(id) {
			holder = "b"
		}
		if err := tr.Router().Drain(holder); err != nil {
			t.Fatal(err)
		}
		path := url + "/v1/responses/" + id
		if method == "POST" {
			path += "/cancel"
		}
		if status, answer := do(t, method, path, ""); status != http.StatusOK {
			t.Errorf("%s %s while its holder drains: %d %s", method, path, status, answer)
		}
	}
}

// Draining stops a replica's new conversations, not those it holds: a
// follow-up to a response it stored goes there (a user's test, 2026-12-07:
// every follow-up of a conversation whose replica drained was a 404, a
// rolling deploy's drain would break every open conversation); a new
// conversation does not.
func TestDrainingHolderTakesFollowUps(t *testing.T) {
	a, b := newVLLMEngine(t, "a"), newVLLMEngine(t, "b")
	tr, url := startProxy(t, testConfig{}, a.replica, b.replica)
	status, answer := do(t, "POST", url+"/v1/responses", `{"model":"m","input":"hi"}`)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, answer)
	}
	id := responseID(t, answer)
	holder, other := "a", "b"
	if b.holds(id) {
		holder, other = "b", "a"
	}
	if err := tr.Router().Drain(holder); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		status, answer := do(t, "POST", url+"/v1/responses", fmt.Sprintf(`{"model":"m","input":"turn %d","previous_response_id":%q}`, i, id))
		if status != http.StatusOK {
			t.Fatalf("follow-up %d while its holder drains: %d %s", i, status, answer)
		}
		id = responseID(t, answer)
	}
	for range 3 {
		status, answer := do(t, "POST", url+"/v1/responses", `{"model":"m","input":"a new one"}`)
		if status != http.StatusOK {
			t.Fatalf("%d %s", status, answer)
		}
		if (map[string]*vllmEngine{"a": a, "b": b})[other].holds(responseID(t, answer)) == false {
			t.Errorf("a new conversation went to the draining replica")
		}
	}
}

// An id the engine's 404 quotes ("Response with id 'resp_model_1' not
// found.") contains "model": the proxy takes the 404 for "the replica
// does not serve the model", tells the client the model does not exist,
// and has the replica lose the model (Health.ModelMissing); ids are the
// client's choice (vLLM takes a request_id that begins with "resp").
func TestNotFoundIDMentioningModel(t *testing.T) {
	a, b := newVLLMEngine(t, "a"), newVLLMEngine(t, "b")
	_, url := startProxy(t, testConfig{}, a.replica, b.replica)
	status, answer := do(t, "POST", url+"/v1/responses", `{"model":"m","input":"hi","previous_response_id":"resp_model_1"}`)
	if status != http.StatusNotFound || strings.Contains(answer, "model_not_found") || !strings.Contains(answer, "resp_model_1") {
		t.Errorf("follow-up of an unknown id: %d %s; want the engine's 404 about the response", status, answer)
	}
}

// The replica known to have stored a response answers that it does not
// hold it (its store is off, as vLLM's is by default, or was lost with a
// restart): that is the last word, as no other replica holds it either
// (a store they shared would have answered it); before, each follow-up
// and cancel was tried on every other replica, each a 404.
func TestHolderNotFoundIsTheLastWord(t *testing.T) {
	engines := []*vllmEngine{newVLLMEngine(t, "a"), newVLLMEngine(t, "b"), newVLLMEngine(t, "c")}
	_, url := startProxy(t, testConfig{}, engines[0].replica, engines[1].replica, engines[2].replica)
	status, answer := do(t, "POST", url+"/v1/responses", `{"model":"m","input":"hi"}`)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, answer)
	}
	id := responseID(t, answer)
	posts := func() (n int64) {
		for _, e := range engines {
			n += e.Served()
		}
		return n
	}
	for _, e := range engines {
		e.mu.Lock()
		delete(e.held, id) // the holder's store lost it
		e.mu.Unlock()
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/responses", fmt.Sprintf(`{"model":"m","input":"and?","previous_response_id":%q}`, id)},
		{"/v1/responses/" + id + "/cancel", ""},
	} {
		before := posts()
		if status, answer := do(t, "POST", url+c.path, c.body); status != http.StatusNotFound || !strings.Contains(answer, id) {
			t.Errorf("POST %s: %d %s, want the holder's 404", c.path, status, answer)
		}
		if n := posts() - before; n != 1 {
			t.Errorf("POST %s reached %d replicas, want the holder alone", c.path, n)
		}
	}
	if status, answer := do(t, "GET", url+"/v1/responses/"+id, ""); status != http.StatusNotFound || !strings.Contains(answer, id) {
		t.Errorf("GET: %d %s, want the holder's 404", status, answer)
	}
}
