package emulator

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/prefix"
	"github.com/gorgo-llm/gorgo/internal/prompt"
)

// OutputTokensHeader lets a client (the replayer) fix the output length,
// overriding max_tokens.
const OutputTokensHeader = "X-Gorgo-Output-Tokens"

// maxBody bounds a request body (a 262k-token prompt is about 1 MiB).
const maxBody = 16 << 20

// apiError is an OpenAI-style error body.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func writeError(w http.ResponseWriter, status int, typ, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]apiError{"error": {Message: fmt.Sprintf(format, args...), Type: typ, Code: status}})
}

// job is a parsed request ready for the engine.
type job struct {
	model        string // the requested name (the primary one if none)
	adapter      uint64 // the engine's Request.Adapter (0: the base model)
	chat         bool
	responses    bool // a Responses API request (see responses.go)
	generate     bool // SGLang's native /generate (see generate.go)
	batch        bool // a /generate of a list of prompts (answered with a list, even of one)
	stream       bool
	includeUsage bool
	// prompts are the request's: one, or a completion's batch, which the
	// engine answers as so many requests.
	prompts []jobPrompt
	// answers is how many the client gets per prompt (n) of the perPrompt
	// sequences the engine generates for it (best_of, when larger); seqs
	// is every prompt's.
	answers, perPrompt, seqs int
	// store says the response is kept (Config.StoreResponses), with text,
	// its prompt's past its tools and instructions.
	store bool
	text  []byte
	// rid is the request's id (prompt.Request.RID: SGLang's, on /generate,
	// chat and completions), by which its
	// client may abort it (SGLang's /abort_request).
	rid string
	// vllmID is vLLM's id of it, its answer's: "chatcmpl-" or "cmpl-"
	// before its X-Request-Id header or its body's request_id, else the
	// writer's. Its engine knows a chat by it, and a completion's prompts
	// by it and their index ("cmpl-ID-0", ...), by which a client aborts
	// them (vLLM's /abort_requests): engineIDs.
	vllmID string
}

// jobPrompt is one prompt of a job.
type jobPrompt struct {
	tokens       int
	outputTokens int // per answer
	blocks       []uint64
}

// sequence returns the prompt of the job's sequence i and the index of
// its choice in the response, or -1 for a sequence generated, not shown
// (best_of's).
func (j *job) sequence(i int) (p *jobPrompt, choice int) {
	k, a := i/j.perPrompt, i%j.perPrompt
	if a >= j.answers {
		return &j.prompts[k], -1
	}
	return &j.prompts[k], k*j.answers + a
}

// maxSeqs bounds the sequences one request may have the engine generate.
const maxSeqs = 128

func (s *Server) parseChat(w http.ResponseWriter, r *http.Request) (*job, bool) {
	return s.parse(w, r, true)
}

func (s *Server) parseCompletion(w http.ResponseWriter, r *http.Request) (*job, bool) {
	return s.parse(w, r, false)
}

// requests recycles parsed requests, whose prompt buffers can be large.
var requests = sync.Pool{New: func() any { return new(prompt.Request) }}

// readRequest reads r's body and parses it with parse into a pooled
// request (release gives it back), answering a 400 if either fails.
func (s *Server) readRequest(w http.ResponseWriter, r *http.Request, parse func(body []byte, req *prompt.Request) error) (*prompt.Request, []byte, bool) {
	body, err := readBody(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "reading the request: %v", err)
		return nil, nil, false
	}
	req := requests.Get().(*prompt.Request)
	if err := parse(body, req); err != nil {
		release(req)
		writeError(w, http.StatusBadRequest, "BadRequestError", "%v", err)
		return nil, nil, false
	}
	return req, body, true
}

// release gives a parsed request back to the pool, unless it grew large.
func release(req *prompt.Request) {
	if cap(req.Text) <= 1<<20 && cap(req.PromptEnds) <= 1<<12 {
		requests.Put(req)
	}
}

// parse reads a chat (chat set) or legacy completion request.
func (s *Server) parse(w http.ResponseWriter, r *http.Request, chat bool) (*job, bool) {
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "BadRequestError", "use POST")
		return nil, false
	}
	req, _, ok := s.readRequest(w, r, func(body []byte, req *prompt.Request) error { return s.est.ParseRequest(body, chat, req) })
	if !ok {
		return nil, false
	}
	defer release(req)
	if err := checkSampling(chat, req); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "%v", err)
		return nil, false
	}
	j := &job{chat: chat, stream: req.Stream, includeUsage: req.IncludeUsage,
		answers: req.N, perPrompt: max(req.N, req.BestOf), seqs: req.Choices(), rid: strings.Clone(req.RID)}
	if base := cmp.Or(r.Header.Get("X-Request-Id"), req.RequestID); base != "" {
		j.vllmID = "cmpl-" + base
		if chat {
			j.vllmID = "chatcmpl-" + base
		}
	}
	if !s.model(w, req.Model, j) {
		return nil, false
	}
	if j.seqs > maxSeqs {
		writeError(w, http.StatusBadRequest, "BadRequestError", "n and best_of times the prompts must be at most %d, got %d", maxSeqs, j.seqs)
		return nil, false
	}
	max, ok := maxTokens(w, req, "max_tokens")
	return j, ok && s.fill(w, r, j, req, max)
}

// model sets j's model (the served one, when the request names none) and
// adapter from the request's model, or answers 404 if it is not served.
func (s *Server) model(w http.ResponseWriter, name string, j *job) bool {
	a, ok := s.models.Load().lookup(name)
	if !ok {
		writeError(w, http.StatusNotFound, "NotFoundError", "The model `%s` does not exist.", name)
		return false
	}
	j.model = name
	if j.model == "" {
		j.model = s.cfg.Model
	}
	if a != nil {
		j.adapter = a.key
	}
	return true
}

// maxTokens is the request's output limit (its field, named so in an
// error), -1 for none; a limit under 1 is a 400.
func maxTokens(w http.ResponseWriter, req *prompt.Request, field string) (int, bool) {
	if !req.HasMaxTokens {
		return -1, true
	}
	if req.MaxTokens < 1 {
		writeError(w, http.StatusBadRequest, "BadRequestError", "%s must be at least 1, got %d", field, req.MaxTokens)
		return 0, false
	}
	return req.MaxTokens, true
}

// checkSampling refuses what vLLM's SamplingParams refuses of the sampling
// parameters the router reads only as hints (prompt.Request.Odd): n or
// best_of not a whole number of at least 1, best_of less than n,
// min_tokens not a whole number of at least 0, or more than max_tokens.
func checkSampling(chat bool, req *prompt.Request) error {
	switch {
	case req.Odd&prompt.HintN != 0:
		return errors.New("n must be an integer of at least 1")
	case chat:
	case req.Odd&prompt.HintBestOf != 0:
		return errors.New("best_of must be an integer of at least 1")
	case req.BestOf != 0 && req.BestOf < req.N:
		return fmt.Errorf("best_of must be greater than or equal to n, got n=%d and best_of=%d", req.N, req.BestOf)
	}
	switch {
	case req.Odd&prompt.HintMinTokens != 0:
		return errors.New("min_tokens must be an integer of at least 0")
	case req.HasMaxTokens && req.MaxTokens >= 1 && req.MinTokens > req.MaxTokens: // below 1, max_tokens's own error comes first, as vLLM's does
		return fmt.Errorf("min_tokens must be less than or equal to max_tokens=%d, got %d", req.MaxTokens, req.MinTokens)
	}
	return nil
}

// fill estimates the prompts, decides the output length (max, or the
// default when max is -1) and checks the context length.
func (s *Server) fill(w http.ResponseWriter, r *http.Request, j *job, req *prompt.Request, max int) bool {
	output := -1
	if h := r.Header.Get(OutputTokensHeader); h != "" {
		n, err := strconv.Atoi(h)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, "BadRequestError", "%s must be a positive integer, got %q", OutputTokensHeader, h)
			return false
		}
		output = n
	}
	j.prompts = make([]jobPrompt, req.Prompts())
	start := 0
	for k := range j.prompts {
		end := len(req.Text)
		if len(req.PromptEnds) > 0 {
			end = req.PromptEnds[k]
		}
		if !s.fillPrompt(w, j, &j.prompts[k], req.Text[start:end], max, output, req.MinTokens) {
			return false
		}
		start = end + 1 // past the newline that ends it
	}
	return true
}

// fillPrompt estimates one prompt of j and its answers' length: output
// when set (the header's), else max, else the default (at least least,
// min_tokens).
func (s *Server) fillPrompt(w http.ResponseWriter, j *job, p *jobPrompt, text []byte, max, output, least int) bool {
	if len(text) == 0 {
		writeError(w, http.StatusBadRequest, "BadRequestError", "the prompt is empty")
		return false
	}
	p.tokens = s.est.Tokens(text)
	// An adapter's prefix cache is its own, as the engines key theirs.
	p.blocks = prefix.Keyed(s.est.Blocks(text, s.page, nil), j.adapter)
	limit := s.prof.MaxContextTokens
	// Without max_tokens the engines cap the answer at the context left
	// (max_model_len − prompt); the emulator answers DefaultMaxTokens at
	// most, or min_tokens when more.
	switch {
	case output != -1:
		p.outputTokens = output
	case max != -1 && j.responses:
		// vLLM's Responses API: min(max_output_tokens, the context left).
		p.outputTokens = min(max, limit-p.tokens) // a prompt past it is refused below
	case max != -1:
		p.outputTokens = max
	default:
		p.outputTokens = min(s.cfg.DefaultMaxTokens, limit-p.tokens)
		if least > p.outputTokens {
			p.outputTokens = min(least, limit-p.tokens)
		}
	}
	if p.tokens >= limit || p.outputTokens > limit-p.tokens {
		writeError(w, http.StatusBadRequest, "BadRequestError",
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			limit, p.tokens+min(p.outputTokens, math.MaxInt-p.tokens), p.tokens, p.outputTokens) // the sum saturates: a huge output would wrap it
		return false
	}
	return true
}

// maxBatchShare is how many earlier prompts of a batch a prompt's
// opening is compared with (sharedWith).
const maxBatchShare = 64

// sharedWith returns the earlier prompt of a batch (among the
// maxBatchShare before it) that shares the most full blocks with prompt k
// (a prompt's last block may be partly filled, and is never shared), the
// first of them on a tie, or -1 for none: prompt k enters once it has its
// first token, and finds those blocks cached.
func sharedWith(prompts []jobPrompt, k int) int {
	best, most := -1, 0
	for j := max(k-maxBatchShare, 0); j < k; j++ {
		a, b := prompts[k].blocks, prompts[j].blocks
		if n := min(prefix.CommonPrefix(a, b), len(a)-1, len(b)-1); n > most {
			best, most = j, n
		}
	}
	return best
}

func readBody(r *http.Request) ([]byte, error) {
	var buf bytes.Buffer
	_, err := buf.ReadFrom(http.MaxBytesReader(nil, r.Body, maxBody))
	return buf.Bytes(), err
}

// serve runs a parsed job through the engine and writes the response.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, j *job) {
	// Its client may abort it (generate.go), from when it arrives: while
	// it waits at a held engine's door, and as an abort of all finds it.
	ctx, abort := context.WithCancelCause(r.Context())
	defer s.aborts.enter(j, abort)()
	if err := s.enter(ctx); err != nil { // held (hold.go)
		switch {
		case errors.Is(err, errAsleep):
			writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "%v", err)
		case context.Cause(ctx) == errAborted: // an id of its own, in a range the engine's do not reach
			s.writer(w, j, 1<<63|s.unentered.Add(1)).finishAborted()
		}
		return
	}
	reqs := make([]engine.Request, 0, j.seqs)
	after := make([]int, 0, j.seqs) // what each sequence enters after (driver.submit)
	for k, p := range j.prompts {
		wait := -1
		if e := sharedWith(j.prompts, k); e >= 0 {
			wait = e * j.perPrompt // the earlier prompt's first answer
		}
		leader := len(reqs)
		for range j.perPrompt {
			reqs = append(reqs, engine.Request{PromptTokens: p.tokens, OutputTokens: p.outputTokens, Blocks: p.blocks, Adapter: j.adapter})
			after = append(after, wait)
			wait = leader // the prompt's other answers, its first
		}
	}
	st, first, err := s.drv.submit(reqs, after)
	switch {
	case errors.Is(err, engine.ErrQueueFull):
		writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "the server is overloaded: its waiting queue is full")
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, "BadRequestError", "%v", err)
		return
	}
	left := j.seqs // sequences not finished
	defer func() {
		if left > 0 {
			s.drv.cancel(first, j.seqs) // the client went away, or aborted it
		}
	}()
	out := s.writer(w, j, first)
	var evs []engine.Event
	for left > 0 {
		evs, err = st.take(ctx, evs)
		if err != nil {
			if context.Cause(ctx) == errAborted {
				out.finishAborted()
			}
			return
		}
		for _, ev := range evs {
			i := int(ev.ID - first)
			switch ev.Kind {
			case engine.EventFirstToken, engine.EventToken:
				out.token(i, ev)
			case engine.EventFinish:
				out.token(i, ev)
				out.ended(i, ev)
				if left--; left == 0 {
					out.finish()
				}
			}
		}
	}
}

// writer produces a response as the tokens come: SSE chunks when
// streaming, one JSON body at the end otherwise.
type writer struct {
	w       http.ResponseWriter
	fl      http.Flusher
	j       *job
	id      string
	model   string
	created int64
	sent    []int             // tokens written, per sequence
	content []strings.Builder // per choice
	// generated and cached are the usage's: the answers' tokens (not
	// best_of's others), and the last prompt's cached tokens (its first
	// sequence's), as vLLM reports them.
	generated, cached int
	buf               bytes.Buffer
	head              []byte // the start of every token chunk, to its choice's index
	seq               int    // a streamed response's next event's sequence_number
	cachedOf          []int  // a native answer's cached prompt tokens, per choice
	store             func(id string, r storedResponse)
}

// newWriter starts a response; its id carries the engine's request id
// ("chatcmpl-<engine id>-<start time>"), which ties a client's stream to
// the model's events when measuring the emulator.
func newWriter(w http.ResponseWriter, model string, j *job, engineID uint64) *writer {
	out := &writer{w: w, j: j, model: model, created: time.Now().Unix(), sent: make([]int, j.seqs)}
	if !j.stream || j.responses || j.generate { // a response's text is in its last events too; a native chunk's is the whole so far
		out.content = make([]strings.Builder, j.answers*len(j.prompts))
	}
	if j.generate {
		out.cachedOf = make([]int, len(out.content))
	}
	out.fl, _ = w.(http.Flusher)
	prefix := "cmpl-"
	if j.chat {
		prefix = "chatcmpl-"
	}
	out.id = cmp.Or(j.vllmID, prefix+strconv.FormatUint(engineID, 10)+"-"+strconv.FormatInt(startedAt, 36))
	if j.responses { // 32 hex digits, as vLLM's
		out.id = fmt.Sprintf("resp_%016x%016x", engineID, uint64(startedAt))
	}
	if j.generate { // a uuid's hex, as SGLang's rid
		out.id = fmt.Sprintf("%016x%016x", engineID, uint64(startedAt))
	}
	if j.stream {
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		if out.fl != nil {
			out.fl.Flush()
		}
		if j.responses {
			out.startResponse()
		}
	}
	return out
}

// writer is the writer of j's answer (engineID: its first sequence's, or
// one of its own if it never entered the engine), which knows the answer
// by vLLM's id of it from then on (aborts).
func (s *Server) writer(w http.ResponseWriter, j *job, engineID uint64) *writer {
	out := newWriter(w, j.model, j, engineID)
	if j.store {
		out.store = s.stored.put
	}
	if j.vllmID == "" && !j.responses && !j.generate {
		s.aborts.name(j, out.id)
	}
	return out
}

// startedAt makes response ids unique across runs of the emulator.
var startedAt = time.Now().UnixNano()

// words make the filler text, one per token.
var words = strings.Fields("the quick brown fox jumps over a lazy dog while seven wise owls watch from an old oak tree near the quiet river bank")

// token writes sequence i's tokens up to ev's. The sequences past the n
// answers of a prompt (best_of's) are generated, not shown.
func (o *writer) token(i int, ev engine.Event) {
	p, choice := o.j.sequence(i)
	if choice < 0 {
		o.sent[i] = ev.Generated
		return
	}
	if o.j.generate {
		o.nativeToken(choice, ev)
	}
	for o.sent[i] < ev.Generated {
		word := " " + words[o.sent[i]%len(words)]
		o.sent[i]++
		if o.content != nil {
			o.content[choice].WriteString(word)
		}
		if !o.j.stream {
			continue
		}
		o.buf.Reset()
		if o.j.generate {
			o.nativeChunk(choice, p, o.sent[i], o.cachedOf[choice])
			o.flush()
			continue
		}
		if o.j.responses {
			if o.sent[i] == 1 {
				o.startItem()
			}
			o.delta(word)
			o.flush()
			continue
		}
		if o.sent[i] == 1 && o.j.chat {
			o.chunk(map[string]any{"index": choice, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}, nil)
		}
		o.tokenChunk(choice, word, o.sent[i] == p.outputTokens)
		o.flush()
	}
}

// ended counts sequence i's finish in the usage: an answer's tokens, and
// for the first sequence of the last prompt the prompt's cached tokens.
func (o *writer) ended(i int, ev engine.Event) {
	if _, choice := o.j.sequence(i); choice >= 0 {
		o.generated += ev.Generated
	}
	if i == (len(o.j.prompts)-1)*o.j.perPrompt {
		o.cached = ev.CachedTokens
	}
}

// tokenChunk appends the SSE event of one token without going through
// encoding/json: it is the hot path (one per token per stream), and the
// filler words need no escaping.
func (o *writer) tokenChunk(i int, word string, last bool) {
	if o.head == nil {
		object := "text_completion"
		if o.j.chat {
			object = "chat.completion.chunk"
		}
		id, _ := json.Marshal(o.id)
		model, _ := json.Marshal(o.model)
		o.head = fmt.Appendf(nil, `data: {"id":%s,"object":%q,"created":%d,"model":%s,"choices":[{"index":`, id, object, o.created, model)
	}
	o.buf.Write(o.head)
	o.buf.Write(strconv.AppendInt(o.buf.AvailableBuffer(), int64(i), 10))
	o.buf.WriteByte(',')
	if o.j.chat {
		o.buf.WriteString(`"delta":{"content":"`)
		o.buf.WriteString(word)
		o.buf.WriteString(`"},`)
	} else {
		o.buf.WriteString(`"text":"`)
		o.buf.WriteString(word)
		o.buf.WriteString(`",`)
	}
	if last {
		o.buf.WriteString(`"logprobs":null,"finish_reason":"length"}]}` + "\n\n")
	} else {
		o.buf.WriteString(`"logprobs":null,"finish_reason":null}]}` + "\n\n")
	}
}

// usage counts each prompt once and every answer's tokens, as vLLM does.
func (o *writer) usage() map[string]any {
	prompt := 0
	for _, p := range o.j.prompts {
		prompt += p.tokens
	}
	return map[string]any{
		"prompt_tokens":         prompt,
		"completion_tokens":     o.generated,
		"total_tokens":          prompt + o.generated,
		"prompt_tokens_details": map[string]any{"cached_tokens": o.cached},
	}
}

// finish ends the response when every sequence has.
func (o *writer) finish() {
	if o.j.responses {
		o.finishResponse("completed")
		return
	}
	if o.j.generate {
		o.finishNative(false)
		return
	}
	if !o.j.stream {
		o.finishWhole(func(int) string { return "length" })
		return
	}
	o.buf.Reset()
	if o.j.includeUsage {
		o.chunk(nil, o.usage())
	}
	o.buf.WriteString("data: [DONE]\n\n")
	o.flush()
}

// finishAborted ends a response its client aborted (SGLang's
// /abort_request) before it ended: the answers not ended yet end with
// their tokens so far and finish_reason "abort" (SGLang's abort object
// for /generate).
func (o *writer) finishAborted() {
	if o.j.responses {
		o.finishResponse("incomplete")
		return
	}
	if o.j.generate {
		o.finishNative(true)
		return
	}
	n := o.j.answers * len(o.j.prompts)
	ended := func(i int) bool {
		return o.sent[i/o.j.answers*o.j.perPrompt+i%o.j.answers] >= o.j.prompts[i/o.j.answers].outputTokens
	}
	if !o.j.stream {
		o.finishWhole(func(i int) string {
			if ended(i) {
				return "length"
			}
			return "abort"
		})
		return
	}
	o.buf.Reset()
	for i := range n {
		if !ended(i) {
			delta := "text"
			var v any = ""
			if o.j.chat {
				delta, v = "delta", map[string]any{}
			}
			o.chunk(map[string]any{"index": i, delta: v, "logprobs": nil, "finish_reason": "abort"}, nil)
		}
	}
	if o.j.includeUsage {
		o.chunk(nil, o.usage())
	}
	o.buf.WriteString("data: [DONE]\n\n")
	o.flush()
}

// finishWhole writes a whole chat or completion, choice i's finish_reason
// finish(i).
func (o *writer) finishWhole(finish func(i int) string) {
	o.w.Header().Set("Content-Type", "application/json")
	choices := make([]any, len(o.content))
	for i := range o.content {
		if o.j.chat {
			choices[i] = map[string]any{"index": i, "message": map[string]any{"role": "assistant", "content": o.content[i].String()}, "logprobs": nil, "finish_reason": finish(i)}
		} else {
			choices[i] = map[string]any{"index": i, "text": o.content[i].String(), "logprobs": nil, "finish_reason": finish(i)}
		}
	}
	object := "text_completion"
	if o.j.chat {
		object = "chat.completion"
	}
	_ = json.NewEncoder(o.w).Encode(map[string]any{"id": o.id, "object": object, "created": o.created, "model": o.model,
		"choices": choices, "usage": o.usage()})
}

// chunk appends one SSE event: a chunk with one choice, or (choice nil)
// the usage chunk with no choices.
func (o *writer) chunk(choice map[string]any, usage map[string]any) {
	object := "text_completion"
	if o.j.chat {
		object = "chat.completion.chunk"
	}
	c := map[string]any{"id": o.id, "object": object, "created": o.created, "model": o.model, "choices": []any{}}
	if choice != nil {
		c["choices"] = []any{choice}
	}
	if usage != nil {
		c["usage"] = usage
	}
	data, _ := json.Marshal(c)
	o.buf.WriteString("data: ")
	o.buf.Write(data)
	o.buf.WriteString("\n\n")
}

func (o *writer) flush() {
	_, _ = o.w.Write(o.buf.Bytes())
	o.buf.Reset()
	if o.fl != nil {
		o.fl.Flush()
	}
}
