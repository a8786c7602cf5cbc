package emulator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/prompt"
)

// SGLang's native API, POST /generate, as SGLang serves it by default
// (prompt.ParseGenerate reads its body; wire.PeekNative its answer): each
// streamed chunk carries the whole text so far and a meta_info counting
// the tokens, null finish_reason until the last, which is {"type":
// "length", "length": N}; then [DONE]. A whole answer is that last object,
// or for a batch (a list of prompts, or n > 1) a list of them, prompt by
// prompt. max_new_tokens is 128 when absent, as SGLang's; 0 answers none
// (the emulator refuses it: it always generates). It names no model; a
// "model" a gateway adds is checked as the OpenAI API's is. lora_path
// names an adapter (for every prompt of a batch; a batch whose prompts
// name different ones runs on the base here), refused with SGLang's 400
// when it is not loaded.

// parseGenerate reads a /generate request.
func (s *Server) parseGenerate(w http.ResponseWriter, r *http.Request) (*job, bool) {
	req, _, ok := s.readRequest(w, r, prompt.ParseGenerate)
	if !ok {
		return nil, false
	}
	defer release(req)
	switch {
	case len(req.Text) == 0:
		writeError(w, http.StatusBadRequest, "BadRequestError", "the emulator reads no input_embeds: give text or input_ids")
		return nil, false
	case req.Odd != 0:
		writeError(w, http.StatusBadRequest, "BadRequestError", "sampling_params: n must be at least 1 and min_new_tokens at least 0")
		return nil, false
	case req.HasMaxTokens && req.MaxTokens < 1:
		writeError(w, http.StatusBadRequest, "BadRequestError", "sampling_params.max_new_tokens must be at least 1 here, got %d", req.MaxTokens)
		return nil, false
	case req.HasMaxTokens && req.MinTokens > req.MaxTokens:
		writeError(w, http.StatusBadRequest, "BadRequestError", "min_new_tokens must be at most max_new_tokens=%d, got %d", req.MaxTokens, req.MinTokens)
		return nil, false
	}
	j := &job{generate: true, batch: req.Batch, stream: req.Stream, answers: req.N, perPrompt: req.N, seqs: req.Choices(), rid: req.RID}
	if !s.model(w, req.Model, j) || req.LoRAPath != "" && !s.loraPath(w, req.LoRAPath, j) {
		return nil, false
	}
	if j.seqs > maxSeqs {
		writeError(w, http.StatusBadRequest, "BadRequestError", "n times the prompts must be at most %d, got %d", maxSeqs, j.seqs)
		return nil, false
	}
	max := req.MaxTokens // -1 for none: the context left, at most the emulator's default
	return j, s.fill(w, r, j, req, max)
}

// loraPath sets j's adapter to the one a /generate's lora_path names, or
// refuses it as SGLang does when it has not loaded it: a 400, or, for a
// stream, a 200 whose only event is the error.
func (s *Server) loraPath(w http.ResponseWriter, name string, j *job) bool {
	c := s.models.Load()
	i, ok := c.byName[name]
	if !ok {
		loaded := make([]string, 0, len(c.adapters))
		for _, a := range c.adapters {
			loaded = append(loaded, a.name)
		}
		msg := fmt.Sprintf("The following requested LoRA adapters are not loaded: %s\nLoaded adapters: %s.", name, strings.Join(loaded, ", "))
		if j.stream { // SGLang's stream has begun when it finds out: a 200, then the error
			data, _ := json.Marshal(map[string]any{"error": map[string]string{"message": msg}})
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", data)
			return false
		}
		writeError(w, http.StatusBadRequest, "BadRequestError", "%s", msg)
		return false
	}
	j.model, j.adapter = name, c.adapters[i].key
	return true
}

// nativeChunk appends choice's streamed chunk: its text so far and its
// meta_info (finished with its last token).
func (o *writer) nativeChunk(choice int, p *jobPrompt, generated, cached int) {
	var finish any
	if generated == p.outputTokens {
		finish = lengthFinish(generated)
	}
	o.buf.WriteString("data: ")
	o.buf.Write(o.nativeAnswer(choice, p, generated, cached, finish))
	o.buf.WriteString("\n\n")
}

// lengthFinish is the finish_reason of an answer of its length; abortFinish
// that of one its client aborted, as SGLang reports them.
func lengthFinish(generated int) any { return map[string]any{"type": "length", "length": generated} }

var abortFinish = map[string]any{"type": "abort", "message": "Abort in waiting queue"}

// nativeAnswer is one answer in SGLang's native shape, finish its
// finish_reason (nil while it goes on); a batch's carry their index.
func (o *writer) nativeAnswer(choice int, p *jobPrompt, generated, cached int, finish any) []byte {
	id := o.id
	if len(o.content) > 1 {
		id = fmt.Sprintf("%s_%d", o.id, choice)
	}
	a := map[string]any{"text": o.content[choice].String(), "meta_info": map[string]any{
		"id": id, "finish_reason": finish, "prompt_tokens": p.tokens, "completion_tokens": generated, "cached_tokens": cached}}
	if len(o.content) > 1 {
		a["index"] = choice
	}
	data, _ := json.Marshal(a)
	return data
}

// nativeToken records choice's cached prompt tokens, which every native
// chunk reports.
func (o *writer) nativeToken(choice int, ev engine.Event) {
	if ev.CachedTokens > 0 || o.cachedOf[choice] == 0 {
		o.cachedOf[choice] = ev.CachedTokens
	}
}

// flushCache empties the prefix cache, as SGLang's /flush_cache does: not
// while requests run or wait (a 400, in its words).
func (s *Server) flushCache(w http.ResponseWriter, _ *http.Request) {
	status := http.StatusOK
	if !s.drv.flush() {
		status = http.StatusBadRequest
	}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n")
}

// errAborted is why a request ended: its client aborted it.
var errAborted = errors.New("aborted by its client (/abort_request, /abort_requests)")

// abortable is the requests the engine has or holds at its door, each
// with what ends it, so that a client may abort them as SGLang's
// /abort_request and vLLM's /abort_requests do.
type abortable struct {
	mu   sync.Mutex
	jobs map[*job]context.CancelCauseFunc
}

// enter registers j until the returned func is called.
func (a *abortable) enter(j *job, abort context.CancelCauseFunc) (leave func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.jobs == nil {
		a.jobs = make(map[*job]context.CancelCauseFunc)
	}
	a.jobs[j] = abort
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		delete(a.jobs, j)
	}
}

// abort ends the requests whose rid (one of a batch's) begins with rid,
// as SGLang matches them, or all of them.
func (a *abortable) abort(rid string, all bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for j, abort := range a.jobs {
		if all {
			abort(errAborted)
			continue
		}
		rids := []string{j.rid}
		if strings.HasPrefix(j.rid, "[") {
			rids = nil
			_ = json.Unmarshal([]byte(j.rid), &rids)
		}
		for _, r := range rids {
			if rid != "" && strings.HasPrefix(r, rid) {
				abort(errAborted)
				break
			}
		}
	}
}

// name sets vLLM's id of j, where its client gave none.
func (a *abortable) name(j *job, id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	j.vllmID = id
}

// engineIDs are the ids vLLM's engine knows j by: a chat's, its id; a
// completion's prompts', its id and their index.
func (j *job) engineIDs() []string {
	if j.vllmID == "" || j.responses || j.generate {
		return nil
	}
	if j.chat {
		return []string{j.vllmID}
	}
	ids := make([]string, len(j.prompts))
	for i := range ids {
		ids[i] = j.vllmID + "-" + strconv.Itoa(i)
	}
	return ids
}

// abortIDs ends the requests vLLM's engine knows by one of ids (exactly,
// as vLLM matches them) and returns how many of the engine's requests
// (a completion's prompts apart) it named. A completion of several
// prompts ends whole where one of them is named (vLLM ends that one
// alone).
func (a *abortable) abortIDs(ids []string) (n int) {
	named := make(map[string]bool, len(ids))
	for _, id := range ids {
		named[id] = true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for j, abort := range a.jobs {
		hit := 0
		for _, id := range j.engineIDs() {
			if named[id] {
				hit++
			}
		}
		if hit > 0 {
			abort(errAborted)
			n += hit
		}
	}
	return n
}

// abortRequests is vLLM's /abort_requests (its development mode's):
// {"request_ids": a list of ids, or one}, all requests where it is
// missing or reads as false in Python (null, "", [], {}, false, 0), as
// vLLM's "if request_ids" reads it.
func (s *Server) abortRequests(w http.ResponseWriter, r *http.Request) {
	var req struct {
		IDs any `json:"request_ids"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"detail": "Invalid JSON format"})
		return
	}
	var ids []string
	all := false
	switch v := req.IDs.(type) {
	case nil:
		all = true
	case bool:
		all = !v
	case float64:
		all = v == 0
	case map[string]any:
		all = len(v) == 0
	case string:
		all, ids = v == "", []string{v}
	case []any:
		all = len(v) == 0
		for _, id := range v {
			if s, ok := id.(string); ok {
				ids = append(ids, s)
			}
		}
	}
	var n int
	if all {
		s.aborts.mu.Lock()
		n = len(s.aborts.jobs)
		s.aborts.mu.Unlock()
		s.aborts.abort("", true)
	} else {
		n = s.aborts.abortIDs(ids)
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "aborted", "aborted": n})
}

// abortRequest is SGLang's /abort_request: {"rid": ...} or {"abort_all":
// true}; always a 200, as SGLang answers.
func (s *Server) abortRequest(w http.ResponseWriter, r *http.Request) {
	var req struct {
		RID      string `json:"rid"`
		AbortAll bool   `json:"abort_all"`
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil || json.Unmarshal(body, &req) != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "the body must be {\"rid\": \"...\"} or {\"abort_all\": true}")
		return
	}
	s.aborts.abort(req.RID, req.AbortAll)
	w.WriteHeader(http.StatusOK)
}

// finishNative ends a /generate: each answer with its finish_reason, of
// its length, or, when its client aborted it (SGLang's /abort_request)
// before it ended, {"type": "abort"} with its tokens so far; streamed (the
// answers not ended yet, then [DONE]) or whole (a batch's as a list).
func (o *writer) finishNative(aborted bool) {
	finishOf := func(i int) (p *jobPrompt, generated int, finish any) {
		p = &o.j.prompts[i/o.j.answers]
		seq := i/o.j.answers*o.j.perPrompt + i%o.j.answers
		if generated = o.sent[seq]; !aborted || generated >= p.outputTokens {
			return p, generated, lengthFinish(generated)
		}
		return p, generated, abortFinish
	}
	if o.j.stream {
		o.buf.Reset()
		for i := range o.content {
			if p, generated, finish := finishOf(i); generated < p.outputTokens {
				o.buf.WriteString("data: ")
				o.buf.Write(o.nativeAnswer(i, p, generated, o.cachedOf[i], finish))
				o.buf.WriteString("\n\n")
			}
		}
		o.buf.WriteString("data: [DONE]\n\n")
		o.flush()
		return
	}
	o.w.Header().Set("Content-Type", "application/json")
	answers := make([]json.RawMessage, len(o.content))
	for i := range answers {
		p, generated, finish := finishOf(i)
		answers[i] = o.nativeAnswer(i, p, generated, o.cachedOf[i], finish)
	}
	if len(answers) == 1 && !o.j.batch { // a batch's, even of one, is a list
		_, _ = o.w.Write(append(answers[0], '\n'))
		return
	}
	_ = json.NewEncoder(o.w).Encode(answers)
}
