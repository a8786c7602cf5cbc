package emulator

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sync"
)

// The Responses API (POST /v1/responses), as vLLM serves it: the request's
// "input" (and "instructions") is the prompt, "max_output_tokens" its
// max_tokens; the answer is a response object, or its events when
// streaming. With Config.StoreResponses (vLLM's
// VLLM_ENABLE_RESPONSES_API_STORE) each response is kept in the replica's
// own memory, unless the request says "store": false: a follow-up that
// names it (previous_response_id) opens with its conversation, the
// earlier prompt and answer, which the replica's prefix cache holds, and
// GET /v1/responses/{id} returns it; a follow-up naming a response the
// replica does not hold is a 404, as vLLM's. Background mode is not
// emulated (a 400).

// The store keeps at most maxStoredResponses responses and
// maxStoredBytes of their conversations and bodies, dropping the oldest
// (vLLM's never drops: the emulator must not grow without bound).
const (
	maxStoredResponses = 4096
	maxStoredBytes     = 256 << 20
)

// responseStore is a replica's stored responses.
type responseStore struct {
	mu    sync.Mutex
	byID  map[string]storedResponse
	order []string // ids, oldest first
	bytes int
}

type storedResponse struct {
	conversation []byte // the prompt's text past its tools and instructions, and the answer's: what a follow-up's input follows
	body         []byte // the response object, as GET returns it
}

func (st *responseStore) put(id string, r storedResponse) {
	size := r.size()
	if size > maxStoredBytes {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.byID == nil {
		st.byID = make(map[string]storedResponse)
	}
	for len(st.order) > 0 && (len(st.order) >= maxStoredResponses || st.bytes+size > maxStoredBytes) {
		old := st.byID[st.order[0]]
		st.bytes -= old.size()
		delete(st.byID, st.order[0])
		st.order = st.order[1:]
	}
	st.byID[id] = r
	st.order = append(st.order, id)
	st.bytes += size
}

// size is the memory a stored response holds: its buffers' capacities.
func (r storedResponse) size() int { return cap(r.conversation) + cap(r.body) }

func (st *responseStore) get(id string) (storedResponse, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	r, ok := st.byID[id]
	return r, ok
}

// notFound answers that the replica holds no response id, as vLLM does.
func notFound(w http.ResponseWriter, id string) {
	writeError(w, http.StatusNotFound, "invalid_request_error", "Response with id '%s' not found.", id)
}

// parseResponses reads a Responses API request.
func (s *Server) parseResponses(w http.ResponseWriter, r *http.Request) (*job, bool) {
	req, body, ok := s.readRequest(w, r, s.est.ParseInput)
	if !ok {
		return nil, false
	}
	defer release(req)
	var opts struct {
		Store      *bool `json:"store"`
		Background bool  `json:"background"`
	}
	if err := json.Unmarshal(body, &opts); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "%v", err)
		return nil, false
	}
	if opts.Background {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "background mode is not emulated")
		return nil, false
	}
	j := &job{responses: true, stream: req.Stream, answers: 1, perPrompt: 1, seqs: 1,
		store: s.cfg.StoreResponses && (opts.Store == nil || *opts.Store)}
	if !s.model(w, req.Model, j) {
		return nil, false
	}
	// The request's tools and instructions open its prompt; a stored
	// conversation leaves them out (vLLM drops the earlier turns' system
	// messages: instructions do not carry over).
	head := min(req.Tools+req.Instructions, len(req.Text))
	if id := req.PreviousResponseID; id != "" {
		prev, ok := s.stored.get(id)
		if !ok {
			notFound(w, id)
			return nil, false
		}
		// The instructions, the conversation so far, then the new input.
		text := make([]byte, 0, len(req.Text)+len(prev.conversation))
		text = append(append(text, req.Text[:head]...), prev.conversation...)
		req.Text = append(text, req.Text[head:]...)
	}
	max, ok := maxTokens(w, req, "max_output_tokens")
	if !ok {
		return nil, false
	}
	req.PromptEnds, req.MinTokens = req.PromptEnds[:0], 0
	if !s.fill(w, r, j, req, max) {
		return nil, false
	}
	if j.store {
		j.text = bytes.Clone(req.Text[head:])
	}
	return j, true
}

// getResponse answers GET /v1/responses/{id} from the store.
func (s *Server) getResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	st, ok := s.stored.get(id)
	if !ok {
		notFound(w, id)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(st.body)
}

// cancelResponse answers POST /v1/responses/{id}/cancel: a stored
// response has finished (only background ones, not emulated, can be
// cancelled), so the answer is vLLM's to a synchronous one.
func (s *Server) cancelResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, ok := s.stored.get(id); !ok {
		notFound(w, id)
		return
	}
	writeError(w, http.StatusBadRequest, "invalid_request_error", "Cannot cancel a synchronous response.")
}

// The writer's part: a response object and its events.

// responseObject is the response as vLLM's non-streaming answer has it,
// and as its events carry it (status "in_progress" before the end, with
// no output or usage).
func (o *writer) responseObject(status string, output []any, usage map[string]any) responseJSON {
	return responseJSON{ID: o.id, CreatedAt: o.created, Model: o.model, Object: "response", Output: output,
		ParallelToolCalls: true, Status: status, ToolChoice: "auto", Tools: []any{}, Usage: usage}
}

// responseJSON is a response object's fields, in vLLM's order (its id
// first).
type responseJSON struct {
	ID                string         `json:"id"`
	CreatedAt         int64          `json:"created_at"`
	Model             string         `json:"model"`
	Object            string         `json:"object"`
	Output            []any          `json:"output"`
	ParallelToolCalls bool           `json:"parallel_tool_calls"`
	Status            string         `json:"status"`
	ToolChoice        string         `json:"tool_choice"`
	Tools             []any          `json:"tools"`
	Usage             map[string]any `json:"usage"`
}

// itemID is the id of the answer's output item.
func (o *writer) itemID() string { return "msg_" + o.id[len("resp_"):] }

// message is the answer's output item.
func (o *writer) message(status string, text *string) map[string]any {
	content := []any{}
	if text != nil {
		content = append(content, map[string]any{"type": "output_text", "text": *text, "annotations": []any{}})
	}
	return map[string]any{"id": o.itemID(), "type": "message", "role": "assistant", "status": status, "content": content}
}

// event appends one named SSE event of a streamed response.
func (o *writer) event(typ string, fields map[string]any) {
	fields["type"] = typ
	fields["sequence_number"] = o.seq
	o.seq++
	data, _ := json.Marshal(fields)
	o.buf.WriteString("event: ")
	o.buf.WriteString(typ)
	o.buf.WriteString("\ndata: ")
	o.buf.Write(data)
	o.buf.WriteString("\n\n")
}

// startResponse writes a streamed response's opening events, sent at
// once, before the request's wait in the queue.
func (o *writer) startResponse() {
	o.event("response.created", map[string]any{"response": o.responseObject("in_progress", []any{}, nil)})
	o.event("response.in_progress", map[string]any{"response": o.responseObject("in_progress", []any{}, nil)})
	o.flush()
}

// startItem appends the events that open the answer's output item, which
// vLLM sends with the first delta.
func (o *writer) startItem() {
	o.event("response.output_item.added", map[string]any{"output_index": 0, "item": o.message("in_progress", nil)})
	o.event("response.content_part.added", map[string]any{"output_index": 0, "content_index": 0, "item_id": o.itemID(),
		"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
}

// finishResponse ends a response, with status "completed" or, its
// generation aborted, "incomplete" (vLLM's shape of an aborted response
// not confirmed): its body, or its closing events; and stores it when the
// job says so.
func (o *writer) finishResponse(status string) {
	text := o.content[0].String()
	usage := map[string]any{"input_tokens": o.j.prompts[0].tokens, "output_tokens": o.generated,
		"total_tokens":          o.j.prompts[0].tokens + o.generated,
		"input_tokens_details":  map[string]any{"cached_tokens": o.cached},
		"output_tokens_details": map[string]any{"reasoning_tokens": 0}}
	resp := o.responseObject(status, []any{o.message(status, &text)}, usage)
	body, _ := json.Marshal(resp)
	if o.store != nil {
		conv := append(o.j.text, "\nassistant\n"...)
		o.store(o.id, storedResponse{conversation: append(conv, text...), body: body})
	}
	if !o.j.stream {
		o.w.Header().Set("Content-Type", "application/json")
		_, _ = o.w.Write(append(body, '\n'))
		return
	}
	o.buf.Reset()
	if o.generated == 0 { // aborted before its first token: its item was never opened
		o.startItem()
	}
	itemID := o.itemID()
	o.event("response.output_text.done", map[string]any{"output_index": 0, "content_index": 0, "item_id": itemID, "text": text})
	o.event("response.content_part.done", map[string]any{"output_index": 0, "content_index": 0, "item_id": itemID,
		"part": map[string]any{"type": "output_text", "text": text, "annotations": []any{}}})
	o.event("response.output_item.done", map[string]any{"output_index": 0, "item": o.message(status, &text)})
	o.event("response."+status, map[string]any{"response": resp})
	o.flush()
}

// delta appends a streamed response's event of one token.
func (o *writer) delta(word string) {
	o.event("response.output_text.delta", map[string]any{"output_index": 0, "content_index": 0,
		"item_id": o.itemID(), "delta": word, "logprobs": []any{}})
}
