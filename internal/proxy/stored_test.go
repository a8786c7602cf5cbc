package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// responsesEngine is a fake engine serving the Responses API with its
// store on, as vLLM's: each response it answers is kept in its own
// memory, a follow-up naming another's (previous_response_id) and a GET
// of one it does not hold are answered 404. failNext makes its next POST
// fail with 500.
type responsesEngine struct {
	name string
	mu   sync.Mutex
	held map[string]bool
	n    int
	fail bool
	*replica
}

func newResponsesEngine(t *testing.T, name string) *responsesEngine {
	e := &responsesEngine{name: name, held: map[string]bool{}}
	e.replica = fakeUpstream(t, e.serve)
	return e
}

func (e *responsesEngine) serve(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if id := strings.TrimPrefix(r.URL.Path, "/v1/responses/"); id != r.URL.Path {
		id, cancel := strings.CutSuffix(id, "/cancel")
		if !e.held[id] {
			http.Error(w, `{"error":{"message":"Response with id '`+id+`' not found.","type":"invalid_request_error","code":404}}`, http.StatusNotFound)
			return
		}
		status := "completed"
		if cancel {
			status = "cancelled"
		}
		fmt.Fprintf(w, `{"id":%q,"object":"response","status":%q}`, id, status)
		return
	}
	var req struct {
		Previous string `json:"previous_response_id"`
		Stream   bool   `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if e.fail {
		e.fail = false
		http.Error(w, `{"error":{"message":"engine died"}}`, http.StatusInternalServerError)
		return
	}
	if req.Previous != "" && !e.held[req.Previous] {
		http.Error(w, `{"error":{"message":"Response with id '`+req.Previous+`' not found.","type":"invalid_request_error","code":404}}`, http.StatusNotFound)
		return
	}
	e.n++
	id := fmt.Sprintf("resp_%s%d", e.name, e.n)
	e.held[id] = true
	if !req.Stream {
		fmt.Fprintf(w, `{"id":%q,"created_at":1,"model":"m","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"ok"}]}],"status":"completed","usage":{"input_tokens":5,"output_tokens":1}}`, id)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":%q,\"status\":\"in_progress\"}}\n\n", id)
	fmt.Fprintf(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"ok\"}\n\n")
	fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":%q,\"status\":\"completed\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n", id)
}

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
	engines := []*responsesEngine{newResponsesEngine(t, "a"), newResponsesEngine(t, "b"), newResponsesEngine(t, "c")}
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
	a := newResponsesEngine(t, "a")
	b := newResponsesEngine(t, "b")
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
	holder.fail = true
	holder.mu.Unlock()
	other.mu.Lock()
	other.held[id] = true // a store they share
	other.mu.Unlock()
	status, answer = do(t, "POST", url+"/v1/responses", fmt.Sprintf(`{"model":"m","input":"and?","previous_response_id":%q}`, id))
	if status != http.StatusOK || !strings.Contains(answer, "resp_"+other.name) {
		t.Errorf("after its holder failed: %d %s, want the other's answer", status, answer)
	}
}
