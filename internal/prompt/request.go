package prompt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/tidwall/gjson"
)

// Request is what gorgo reads of an OpenAI chat or completion request body.
type Request struct {
	// Text is the canonical prompt bytes: for a chat, every message as
	// Chat writes it (role, newline, content, newline; at least one
	// message, each with a role); for a completion, the prompt (a string, a
	// list of one string, or a list of token ids whose JSON stands for the
	// text). ParseRequest appends them to Text[:0], so a caller that keeps
	// its Request reuses the buffer.
	Text []byte
	// Model is the "model" field.
	Model string
	// LoRAPath is the adapter SGLang's "lora_path" names (an adapter's
	// name, or a batch's list of them, null for the base), where it names
	// one for every prompt; "" otherwise. SGLang reads it on /generate,
	// and on its chat and completions too.
	LoRAPath string
	// Batch says a /generate's prompt came as a list (of one or more),
	// which SGLang answers with a list.
	Batch bool
	// RID is the request's id as SGLang's "rid" gives it (on /generate,
	// chat and completions), by which a client aborts it: a string's
	// value, or a batch's list as its JSON; "" when absent.
	RID string
	// RequestID is vLLM's "request_id" (on chat and completions, a
	// string): the id its engine knows the request by, "chatcmpl-" or
	// "cmpl-" before it, where no X-Request-Id header gives one; ""
	// when absent.
	RequestID string
	// MaxTokens is, for chat, max_completion_tokens if present and not
	// null, else max_tokens; for completions, max_tokens. HasMaxTokens is
	// false, and MaxTokens -1, when absent or null.
	MaxTokens    int
	HasMaxTokens bool
	// Stream is the "stream" field.
	Stream bool
	// IncludeUsage is set when stream_options.include_usage is true.
	IncludeUsage bool
	// User is the "user" field.
	User string
	// PreviousResponseID is a responses request's previous_response_id
	// (a string; else ""): the stored response it continues, which the
	// engine that stored it prepends to its input.
	PreviousResponseID string
	// Instructions is how many bytes of Text, after the tools, the chat's
	// opening system or developer messages take: an application's
	// instructions, which its users' messages follow. 0 when the first
	// message is neither.
	Instructions int
	// Tools is how many bytes at the start of Text a chat's (or a
	// responses request's) tools take: "tools", a newline, the "tools"
	// array as the client wrote it and a newline; 0 without tools (absent,
	// null, empty, or not an array). The engines' chat templates render
	// the tools into the prompt, near its start in most (Qwen's and
	// DeepSeek's in the system turn, after its content; Llama 3.1's in the
	// first user message; Mistral's before the last user message): here
	// they count as prompt tokens and as the prompt's first cached blocks,
	// which for one application's fixed tools gives the same reuse.
	Tools int
	// N is how many answers a chat or a completion asks for (n), and
	// BestOf how many a completion has the engine generate to answer with
	// the best N of (best_of), each up to MaxTokens long: a whole number or
	// a string of one (as vLLM's and SGLang's pydantic models read them),
	// 2^16 when more; else N is 1 and BestOf 0 (as many as N). They are
	// hints for the router, which leaves refusing them to the engine (see
	// Odd).
	N, BestOf int
	// MinTokens is the least an answer will run to: min_tokens (vLLM's and
	// SGLang's), a whole number up to 2^24, else 0 (2^24 when more): a
	// hint, as N. ignore_eos is not
	// read: load generators (gorgo replay among them) set it to reproduce
	// a trace's lengths, and a router that took it would know every
	// benchmark's answers' lengths, as it never does in production.
	MinTokens int
	// Media are where each image, audio clip and video of a chat stands
	// in Text: pairs of offsets, its line's start and its padding's end
	// (see Estimator). The keys of a prompt's opening leave them out
	// (OpeningKeys).
	Media []int
	// PromptEnds is, for a completion of several prompts (a batch, which
	// the engine answers as so many requests), where each ends in Text;
	// empty for one prompt.
	PromptEnds []int
	// Odd marks the hints (n, best_of, min_tokens) given a value that is
	// not a count (not a whole number or a string of one; less than 1, or
	// 0 for min_tokens): the router reads them as absent, and an engine
	// refuses the request (the emulator does).
	Odd Hints
}

// Prompts is how many prompts the request carries: a completion's batch,
// else 1.
func (r *Request) Prompts() int { return max(len(r.PromptEnds), 1) }

// Choices is how many sequences the engine generates for the request: N,
// or BestOf when larger, for each of its prompts.
func (r *Request) Choices() int { return max(r.N, r.BestOf, 1) * r.Prompts() }

// Answers is how many answers the request gets back, and its usage counts:
// N for each of its prompts. BestOf's other sequences are generated, not
// shown, and not counted (vLLM's usage).
func (r *Request) Answers() int { return max(r.N, 1) * r.Prompts() }

// Hints names the fields the router reads only as hints (Request.Odd).
type Hints uint8

const (
	HintN Hints = 1 << iota
	HintBestOf
	HintMinTokens
)

// Errors of ParseRequest that the old functions give too.
var (
	errNoMessages = errors.New("messages: at least one message is required")
	errContent    = errors.New("content must be a string or an array of content parts")
	errPrompt     = errors.New("prompt: want a string, a list of token ids, or a batch of them: a non-empty list of strings or of lists of token ids")
	errInput      = errors.New("input: want a string, a list of strings, a list of token ids, or a list of messages")
)

// ParseRequest reads an OpenAI chat (chat set) or legacy completion request
// body into r in one pass: a jsontext decoder validates the body as it
// tokenizes it, the fields routing needs are picked out, and only the
// strings kept are decoded, into r.Text and small scratch buffers; nothing
// else is decoded and no tree is built. It reads what encoding/json would
// read into the structs the emulator and the proxy used (model, messages or
// prompt, max_tokens, max_completion_tokens for chat, stream,
// stream_options, user; and as hints, never refused: n, best_of for
// completions, min_tokens), with the same rules: keys match
// case-insensitively, a later duplicate key wins (null leaves a string or
// bool as it was, and sets a pointer field back to absent), other fields
// are ignored whatever their type, a field of the wrong type is an error,
// invalid UTF-8 and unpaired surrogates decode to U+FFFD. The one
// difference: for a duplicated "messages" key the last array wins (the
// others must be arrays or null), where encoding/json merges the arrays
// element by element.
//
// The body must be one valid JSON object (nothing after it); nesting
// deeper than 10000 levels is refused.
//
// Model, User and PreviousResponseID do not alias body. With a reused r
// whose Model, User and PreviousResponseID do not change, parsing
// allocates nothing.
func ParseRequest(body []byte, chat bool, r *Request) error {
	return Estimator{}.ParseRequest(body, chat, r)
}

// ParseRequest is the package's ParseRequest, each image, audio clip and
// video standing for as many bytes of the prompt as e says.
func (e Estimator) ParseRequest(body []byte, chat bool, r *Request) error {
	mode := modeCompletion
	if chat {
		mode = modeChat
	}
	return parseMode(body, mode, e, r)
}

// ParseInput reads the body of another OpenAI request that carries its
// text in "input" (embeddings, responses) as ParseRequest reads a chat:
// the input's text becomes r.Text: a string; a list of strings, each
// followed by a newline; a list of token ids, whose JSON stands for the
// text; or a list of messages ({"role", "content"}, content a string or
// parts of type "text" or "input_text"), as a chat's; a responses
// request's "instructions" (a string) come first, as a system message, as
// the engine puts them, and its "tools" before them, as a chat's; its
// "function_call" items are an assistant's tool call (the function's name
// and arguments on a line after an empty content) and its
// "function_call_output" items a tool's message, as the engine renders
// them; other items that are not messages add nothing. A body without either gives an empty Text (the
// request is routed by load alone). A responses request's
// max_output_tokens is its MaxTokens, and its previous_response_id (a
// string) its PreviousResponseID.
func ParseInput(body []byte, r *Request) error { return Estimator{}.ParseInput(body, r) }

// ParseInput is the package's ParseInput, each image, audio clip and
// video standing for as many bytes of the prompt as e says.
func (e Estimator) ParseInput(body []byte, r *Request) error {
	return parseMode(body, modeInput, e, r)
}

// What a body is read as.
const (
	modeChat = iota
	modeCompletion
	modeInput
)

func parseMode(body []byte, mode int, e Estimator, r *Request) error {
	p := parsers.Get().(*parser)
	p.est, p.imageBytes, p.videoBytes = e, e.ImageBytes(), e.VideoBytes()
	err := p.parse(body, mode, r)
	if len(body) <= 1<<20 { // a parser that read a huge body keeps huge buffers
		parsers.Put(p)
	}
	return err
}

// parser is the reusable state of ParseRequest.
type parser struct {
	dec                jsontext.Decoder
	in                 bytes.Reader
	key, str           []byte // scratch: an object key, a string value
	role, content      []byte // scratch: a message's
	calls              []byte // scratch: a message's tool calls, raw
	itemType, fname    []byte // scratch: a responses input item's type, function name,
	args, output       []byte // arguments and output
	text               []byte // scratch: a content part's text
	inputParts         bool   // "input_text" parts count as text (responses)
	est                Estimator
	imageBytes         int     // what an image stands for (Estimator.ImageBytes)
	videoBytes         int     // and a video (Estimator.VideoBytes)
	mediaLeft          int     // the bytes media may still take (maxMediaBytes)
	contentMedia       int     // of which the message's content read so far took
	spans              []int   // its media, as Request.Media, in p.content
	media              decoder // re-read a media part's value
	model, user, prev  []byte
	hasModel, hasUser  bool
	hasPrev            bool
	instr              []byte // a responses request's "instructions"
	hasInstr           bool
	tools              []byte // a chat's or a responses request's "tools" array, raw
	hasTools           bool
	list               []byte // the completion prompt's raw value
	listKind           jsontext.Kind
	messages, hasMsgs  bool
	maxTok, maxCompTok int64
	hasMax, hasMaxComp bool
	n, bestOf          int
	minTok             int
	odd                Hints
	batch, item        decoder // re-read a completion prompt's list, and one of its items
}

// decoder is a JSON decoder over a byte slice, kept for reuse.
type decoder struct {
	in  bytes.Reader
	dec jsontext.Decoder
	key []byte // scratch: an object's key, unquoted
	val []byte // scratch: a string value, unquoted (mediaKey)
}

// reset points the decoder at v and returns it.
func (s *decoder) reset(v []byte) *jsontext.Decoder {
	s.in.Reset(v)
	s.dec.Reset(&s.in, decodeOptions...)
	return &s.dec
}

var parsers = sync.Pool{New: func() any { return new(parser) }}

// decodeOptions keep what encoding/json accepts: duplicate keys and invalid
// UTF-8 (which decodes to U+FFFD).
var decodeOptions = []jsontext.Options{jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)}

func (p *parser) parse(body []byte, mode int, r *Request) error {
	chat := mode == modeChat
	p.inputParts = false
	model, user, prev := r.Model, r.User, r.PreviousResponseID
	*r = Request{Text: r.Text[:0], PromptEnds: r.PromptEnds[:0], Media: r.Media[:0], MaxTokens: -1}
	p.n, p.bestOf = 1, 0
	p.minTok, p.odd = 0, 0
	p.in.Reset(body)
	p.dec.Reset(&p.in, decodeOptions...)
	p.hasModel, p.hasUser, p.messages, p.hasMsgs, p.hasMax, p.hasMaxComp = false, false, false, false, false, false
	p.hasInstr, p.hasTools, p.hasPrev = false, false, false
	p.listKind = 0
	d := &p.dec
	if d.PeekKind() != '{' {
		if _, err := d.ReadValue(); err != nil {
			return malformed(err)
		}
		return errors.New("malformed JSON: the body must be a JSON object")
	}
	d.ReadToken()
	for d.PeekKind() != '}' {
		f, err := p.field(topNames[1:])
		if err != nil {
			return malformed(err)
		}
		switch {
		case f == fModel:
			err = p.stringField(&p.model, &p.hasModel, "model")
		case f == fUser:
			err = p.stringField(&p.user, &p.hasUser, "user")
		case f == fMessages && chat:
			err = p.readMessages(r)
		case f == fPrompt && mode == modeCompletion, f == fInput && mode == modeInput:
			err = p.readPrompt()
		case f == fInstructions && mode == modeInput && d.PeekKind() == '"':
			// A string; anything else (the engine's business) is skipped.
			err = p.stringField(&p.instr, &p.hasInstr, "instructions")
		case f == fTools && mode != modeCompletion:
			err = p.readTools()
		case f == fMaxTokens:
			p.maxTok, p.hasMax, err = p.intField("max_tokens")
		case f == fMaxCompletionTokens && chat:
			p.maxCompTok, p.hasMaxComp, err = p.intField("max_completion_tokens")
		case f == fMaxOutputTokens && mode == modeInput:
			p.maxTok, p.hasMax, err = p.intField("max_output_tokens")
		case f == fPreviousResponseID && mode == modeInput && d.PeekKind() == '"':
			// A string; anything else (the engine's business) is skipped.
			err = p.stringField(&p.prev, &p.hasPrev, "previous_response_id")
		case f == fStream:
			err = p.boolField(&r.Stream, "stream")
		case f == fStreamOptions:
			err = p.streamOptions(&r.IncludeUsage)
		case f == fN && mode != modeInput:
			p.n, err = p.hint(HintN, 1, maxChoices, 1)
		case f == fBestOf && mode == modeCompletion:
			p.bestOf, err = p.hint(HintBestOf, 1, maxChoices, 0)
		case f == fMinTokens && mode != modeInput:
			p.minTok, err = p.hint(HintMinTokens, 0, maxHintTokens, 0)
		case f == fLoRAPath && mode != modeInput:
			err = p.extension(&r.LoRAPath, loraPath)
		case f == fRID && mode != modeInput:
			err = p.extension(&r.RID, ridOf)
		case f == fRequestID && mode != modeInput:
			err = p.extension(&r.RequestID, stringOf)
		default:
			err = d.SkipValue()
		}
		if err != nil {
			return syntaxOr(err)
		}
	}
	if _, err := d.ReadToken(); err != nil {
		return malformed(err)
	}
	if _, err := d.ReadToken(); err != io.EOF {
		if err == nil {
			err = errors.New("data after the top-level object")
		}
		return malformed(err)
	}
	switch {
	case p.hasMaxComp:
		r.MaxTokens, r.HasMaxTokens = int(p.maxCompTok), true
	case p.hasMax:
		r.MaxTokens, r.HasMaxTokens = int(p.maxTok), true
	}
	r.N, r.BestOf = p.n, p.bestOf
	r.MinTokens, r.Odd = p.minTok, p.odd
	r.Model = keep(p.model, p.hasModel, model)
	r.User = keep(p.user, p.hasUser, user)
	r.PreviousResponseID = keep(p.prev, p.hasPrev, prev)
	switch mode {
	case modeChat:
		if !p.messages {
			return errNoMessages
		}
		p.prependTools(r)
		return nil
	case modeInput:
		if err := p.appendInput(r); err != nil {
			return err
		}
		p.prependTools(r)
		return nil
	}
	return p.appendPrompt(r)
}

// malformed wraps a syntax error, without the Go package's name in the
// message a client reads.
func malformed(err error) error {
	return &syntaxError{err: err}
}

type syntaxError struct{ err error }

func (e *syntaxError) Error() string {
	return "malformed JSON: " + strings.TrimPrefix(e.err.Error(), "jsontext: ")
}

func (e *syntaxError) Unwrap() error { return e.err }

// syntaxOr reports a field's error: a syntax error as malformed JSON,
// another as is.
func syntaxOr(err error) error {
	var se *jsontext.SyntacticError
	if errors.As(err, &se) || err == io.ErrUnexpectedEOF {
		return malformed(err)
	}
	return err
}

// keep returns b as a string, old itself when equal (no allocation).
func keep(b []byte, ok bool, old string) string {
	switch {
	case !ok:
		return ""
	case string(b) == old:
		return old
	}
	return string(b)
}

// Top-level fields ParseRequest reads.
const (
	fOther = iota
	fModel
	fMessages
	fPrompt
	fMaxTokens
	fMaxCompletionTokens
	fStream
	fStreamOptions
	fUser
	fInput
	fInstructions
	fN
	fBestOf
	fMinTokens
	fTools
	fMaxOutputTokens
	fPreviousResponseID
	fLoRAPath
	fRID
	fRequestID
)

var topNames = [...]string{
	fModel:               "model",
	fMessages:            "messages",
	fPrompt:              "prompt",
	fMaxTokens:           "max_tokens",
	fMaxCompletionTokens: "max_completion_tokens",
	fStream:              "stream",
	fStreamOptions:       "stream_options",
	fUser:                "user",
	fInput:               "input",
	fInstructions:        "instructions",
	fN:                   "n",
	fBestOf:              "best_of",
	fMinTokens:           "min_tokens",
	fTools:               "tools",
	fMaxOutputTokens:     "max_output_tokens",
	fPreviousResponseID:  "previous_response_id",
	fLoRAPath:            "lora_path",
	fRID:                 "rid",
	fRequestID:           "request_id",
}

// field reads an object's next key and returns 1 + the index of the name
// it matches as encoding/json matches a key to a struct field (exactly,
// else by Unicode case folding), 0 for none.
func (p *parser) field(names []string) (int, error) {
	raw, err := p.dec.ReadValue()
	if err != nil {
		return 0, err
	}
	key := raw[1 : len(raw)-1]
	if bytes.IndexByte(key, '\\') >= 0 || !utf8.Valid(key) {
		p.key, _ = jsontext.AppendUnquote(p.key[:0], raw)
		key = p.key
	}
	for i, n := range names {
		if string(key) == n {
			return i + 1, nil
		}
	}
	for i, n := range names {
		if len(key) >= len(n)/2 && bytes.EqualFold(key, []byte(n)) {
			return i + 1, nil
		}
	}
	return 0, nil
}

// extension reads a field of SGLang's extensions of the OpenAI API
// (lora_path, rid: as its /generate has them) into dst, by what of takes
// of its value.
func (p *parser) extension(dst *string, of func(gjson.Result) string) error {
	raw, err := p.dec.ReadValue()
	if err != nil {
		return err
	}
	*dst = of(gjson.ParseBytes(raw)) // a copy: raw is the decoder's
	return nil
}

// stringValue decodes a string value into dst[:0]; null reports false.
func (p *parser) stringValue(dst *[]byte, name string) (bool, error) {
	switch p.dec.PeekKind() {
	case 'n':
		_, err := p.dec.ReadToken()
		return false, err
	case '"':
		raw, err := p.dec.ReadValue()
		if err != nil {
			return false, err
		}
		*dst = unquote((*dst)[:0], raw)
		return true, nil
	}
	if err := p.dec.SkipValue(); err != nil {
		return false, err
	}
	return false, fmt.Errorf("%s must be a string", name)
}

// stringField reads a string field; null leaves it as it was (as
// encoding/json leaves a string field).
func (p *parser) stringField(dst *[]byte, has *bool, name string) error {
	ok, err := p.stringValue(&p.str, name)
	if ok {
		*dst, *has = append((*dst)[:0], p.str...), true
	}
	return err
}

// unquote appends the decoded JSON string raw (already validated): invalid
// UTF-8 and unpaired surrogates become U+FFFD, as encoding/json decodes them.
func unquote(dst []byte, raw jsontext.Value) []byte {
	s := raw[1 : len(raw)-1]
	if bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
		return append(dst, s...)
	}
	out, _ := jsontext.AppendUnquote(dst, raw) // only reports invalid UTF-8, replaced
	return out
}

// intField reads an integer field as encoding/json reads a *int: null is
// absent, a number must be an integer (no fraction or exponent) that fits.
func (p *parser) intField(name string) (int64, bool, error) {
	kind := p.dec.PeekKind()
	raw, err := p.dec.ReadValue()
	switch {
	case err != nil:
		return -1, false, err
	case kind == 'n':
		return -1, false, nil
	case kind == '0':
		if n, err := strconv.ParseInt(string(raw), 10, strconv.IntSize); err == nil {
			return n, true, nil
		}
	}
	return -1, false, fmt.Errorf("%s must be an integer", name)
}

// maxChoices bounds N and BestOf: no engine generates more answers for
// one request (vLLM caps n far lower).
const maxChoices = 1 << 16

// maxHintTokens bounds MinTokens: more than any context.
const maxHintTokens = 1 << 24

// hint reads a number the router only takes as a hint (the field h): a
// whole number from lo to hi (hi when more), or a string of one (vLLM's
// and SGLang's pydantic models take "2" for 2), else def; a value other
// than null that is none of these marks h in p.odd (the last value of a
// repeated field counts, as it does for the engines).
func (p *parser) hint(h Hints, lo, hi, def int) (int, error) {
	kind := p.dec.PeekKind()
	raw, err := p.dec.ReadValue()
	if err != nil {
		return def, err
	}
	p.odd &^= h
	v, ok := def, kind == 'n'
	switch kind {
	case '0':
		if f, err := strconv.ParseFloat(string(raw), 64); err == nil && f == math.Trunc(f) && f >= float64(lo) {
			v, ok = int(min(f, float64(hi))), true
		}
	case '"':
		if text, err := jsontext.AppendUnquote(nil, raw); err == nil {
			if n, err := strconv.ParseInt(string(text), 10, 64); err == nil && n >= int64(lo) {
				v, ok = int(min(n, int64(hi))), true
			}
		}
	}
	if !ok {
		p.odd |= h
	}
	return v, nil
}

// boolField reads a boolean; null leaves it as it was.
func (p *parser) boolField(dst *bool, name string) error {
	kind := p.dec.PeekKind()
	if _, err := p.dec.ReadValue(); err != nil {
		return err
	}
	switch kind {
	case 't', 'f':
		*dst = kind == 't'
	case 'n':
	default:
		return fmt.Errorf("%s must be a boolean", name)
	}
	return nil
}

// streamOptions reads stream_options as encoding/json reads it into a
// pointer to a struct: null sets it back to absent, an object is merged
// into what earlier duplicates set.
func (p *parser) streamOptions(includeUsage *bool) error {
	d := &p.dec
	switch d.PeekKind() {
	case 'n':
		*includeUsage = false
		_, err := d.ReadToken()
		return err
	case '{':
	default:
		if err := d.SkipValue(); err != nil {
			return err
		}
		return errors.New("stream_options must be an object or null")
	}
	d.ReadToken()
	for d.PeekKind() != '}' {
		f, err := p.field(optionFields)
		if err != nil {
			return err
		}
		if f == 0 {
			err = d.SkipValue()
		} else if err = p.boolField(includeUsage, "stream_options.include_usage"); err != nil {
			return err
		}
		if err != nil {
			return err
		}
	}
	_, err := d.ReadToken()
	return err
}

// readTools reads a chat's or a responses request's "tools": an array, kept raw (the last of
// duplicated keys wins); null, an empty array or another value is none.
func (p *parser) readTools() error {
	d := &p.dec
	switch d.PeekKind() {
	case 'n':
		p.hasTools = false
		_, err := d.ReadToken()
		return err
	case '[':
	default: // the engine's to refuse (an embeddings body's to ignore)
		p.hasTools = false
		return d.SkipValue()
	}
	raw, err := d.ReadValue()
	if err != nil {
		return err
	}
	p.tools = append(p.tools[:0], raw...)
	p.hasTools = !emptyArray(raw)
	return nil
}

// emptyArray reports whether raw, a JSON array, has no elements.
func emptyArray(raw []byte) bool { return len(bytes.TrimSpace(raw[1:len(raw)-1])) == 0 }

// toolsHead opens a chat's tools in its canonical bytes.
const toolsHead = "tools\n"

// prependTools puts the tools read (toolsHead, the raw array, a newline)
// before the rest of r.Text, in its own storage when it has room, and
// sets r.Tools. A request whose Text is empty (routed by load) stays so.
func (p *parser) prependTools(r *Request) {
	if !p.hasTools || len(r.Text) == 0 {
		return
	}
	n := len(toolsHead) + len(p.tools) + 1
	text := slices.Grow(r.Text, n)[:len(r.Text)+n]
	copy(text[n:], text[:len(text)-n])
	copy(text, toolsHead)
	copy(text[len(toolsHead):], p.tools)
	text[n-1] = '\n'
	r.Text, r.Tools = text, n
	for i := range r.Media {
		r.Media[i] += n
	}
}

// readMessages reads the messages array into r.Text: every message as its
// role, a newline, its content's text and a newline. A later "messages"
// key replaces what an earlier one gave.
func (p *parser) readMessages(r *Request) error {
	d := &p.dec
	r.Text, r.Instructions, r.Media = r.Text[:0], 0, r.Media[:0]
	p.mediaLeft = maxMediaBytes
	switch d.PeekKind() {
	case 'n':
		p.messages = false
		_, err := d.ReadToken()
		return err
	case '[':
	default:
		if err := d.SkipValue(); err != nil {
			return err
		}
		return errors.New("messages must be an array")
	}
	d.ReadToken()
	i := 0
	for ; d.PeekKind() != ']'; i++ {
		if err := p.readMessage(r, i); err != nil {
			return err
		}
	}
	p.messages = i > 0
	_, err := d.ReadToken()
	return err
}

// messageFields are a message's fields read; the last four only in a
// responses request's input items (a function call and its output).
var messageFields = []string{"role", "content", "tool_calls", "type", "name", "arguments", "output"}

// readMessage reads message i and appends it to r.Text.
func (p *parser) readMessage(r *Request, i int) error {
	d := &p.dec
	p.role, p.content, p.calls, p.spans = p.role[:0], p.content[:0], p.calls[:0], p.spans[:0]
	p.contentMedia = 0
	p.itemType, p.fname, p.args, p.output = p.itemType[:0], p.fname[:0], p.args[:0], p.output[:0]
	hasRole := false
	switch d.PeekKind() {
	case 'n': // a zero message: no role
		if _, err := d.ReadToken(); err != nil {
			return err
		}
	case '{':
		d.ReadToken()
		for d.PeekKind() != '}' {
			f, err := p.field(messageFields)
			if err != nil {
				return err
			}
			switch f {
			case 1:
				ok, err := p.stringValue(&p.str, "role")
				if err != nil {
					return syntaxOr2(err, fmt.Errorf("messages[%d].role must be a string", i))
				}
				if ok {
					p.role, hasRole = append(p.role[:0], p.str...), true
				}
			case 2:
				if err := p.readContent(); err != nil {
					return syntaxOr2(err, fmt.Errorf("messages[%d]: %w", i, err))
				}
			case 3:
				// An assistant's tool calls, which the chat template
				// renders after its content: kept raw (a non-empty
				// array; anything else is the engine's to refuse).
				kind := d.PeekKind()
				raw, err := d.ReadValue()
				if err != nil {
					return err
				}
				p.calls = p.calls[:0]
				if kind == '[' && !emptyArray(raw) {
					p.calls = append(p.calls, raw...)
				}
			case 4, 5, 6, 7:
				if !p.inputParts || d.PeekKind() != '"' { // a chat's, or not a string: the engine's
					if err := d.SkipValue(); err != nil {
						return err
					}
					continue
				}
				dst := [...]*[]byte{&p.itemType, &p.fname, &p.args, &p.output}[f-4]
				if _, err := p.stringValue(dst, messageFields[f-1]); err != nil {
					return err
				}
			default:
				if err := d.SkipValue(); err != nil {
					return err
				}
			}
		}
		d.ReadToken()
	default:
		if err := d.SkipValue(); err != nil {
			return err
		}
		return fmt.Errorf("messages[%d] must be an object", i)
	}
	if (!hasRole || len(p.role) == 0) && p.inputParts {
		// A responses request's function call and its output are an
		// assistant's tool call and a tool's message, as the engine
		// renders them; another item that is not a message adds nothing.
		p.mediaLeft += p.contentMedia
		p.content, p.spans, p.calls = p.content[:0], p.spans[:0], p.calls[:0]
		switch string(p.itemType) {
		case "function_call":
			p.role, hasRole = append(p.role[:0], "assistant"...), true
			p.calls = append(append(append(p.calls, p.fname...), ' '), p.args...)
		case "function_call_output":
			p.role, hasRole = append(p.role[:0], "tool"...), true
			p.content = append(p.content, p.output...)
		default:
			return nil
		}
	}
	if !hasRole || len(p.role) == 0 {
		return fmt.Errorf("messages[%d].role is required", i)
	}
	opening := r.Instructions == len(r.Text) // no other message before it
	r.Text = append(append(r.Text, p.role...), '\n')
	for _, at := range p.spans {
		r.Media = append(r.Media, len(r.Text)+at)
	}
	r.Text = append(append(r.Text, p.content...), '\n')
	if len(p.calls) > 0 {
		r.Text = append(append(r.Text, p.calls...), '\n')
	}
	if opening && (string(p.role) == "system" || string(p.role) == "developer") {
		r.Instructions = len(r.Text)
	}
	return nil
}

// syntaxOr2 returns a syntax error as is, else the field's error.
func syntaxOr2(err, fieldErr error) error {
	var se *jsontext.SyntacticError
	if errors.As(err, &se) || err == io.ErrUnexpectedEOF {
		return err
	}
	return fieldErr
}

var (
	partFields   = []string{"type", "text", "image_url", "input_audio", "audio_url", "video_url"}
	optionFields = []string{"include_usage"}
)

// readContent reads a message's content into p.content: a string, null,
// or an array of parts whose "text" parts' texts are concatenated and
// whose images, audio clips and videos stand for their tokens (see
// appendMedia).
func (p *parser) readContent() error {
	d := &p.dec
	// A later "content" key replaces an earlier one: its media's bytes
	// are given back.
	p.content, p.spans = p.content[:0], p.spans[:0]
	p.mediaLeft += p.contentMedia
	p.contentMedia = 0
	switch d.PeekKind() {
	case 'n':
		_, err := d.ReadToken()
		return err
	case '"':
		raw, err := d.ReadValue()
		if err != nil {
			return err
		}
		p.content = unquote(p.content, raw)
		return nil
	case '[':
	default:
		if err := d.SkipValue(); err != nil {
			return err
		}
		return errContent
	}
	d.ReadToken()
	for d.PeekKind() != ']' {
		switch d.PeekKind() {
		case 'n':
			if _, err := d.ReadToken(); err != nil {
				return err // "nul", say: PeekKind saw only its first byte
			}
			continue
		case '{':
		default:
			if err := d.SkipValue(); err != nil {
				return err
			}
			return errContent
		}
		d.ReadToken()
		isText, hasText, start := false, false, len(p.content)
		kind := 0 // the part's type: 0 text or other, else a media field's number
		// Each media field's value: its hash (0 for none) and, for an
		// audio clip, the bytes it stands for.
		var hashes [4]uint64
		var audio [4]int
		p.text = p.text[:0]
		for d.PeekKind() != '}' {
			f, err := p.field(partFields)
			if err != nil {
				return err
			}
			switch f {
			case 1:
				ok, err := p.stringValue(&p.key, "type")
				if err != nil {
					return syntaxOr2(err, errContent)
				}
				if ok {
					isText = string(p.key) == "text" || p.inputParts && string(p.key) == "input_text"
					kind = mediaKind(p.key, p.inputParts)
				}
			case 2:
				ok, err := p.stringValue(&p.str, "text")
				if err != nil {
					return syntaxOr2(err, errContent)
				}
				if ok {
					p.text, hasText = append(p.text[:0], p.str...), true
				}
			case 3, 4, 5, 6:
				vk := d.PeekKind()
				raw, err := d.ReadValue()
				if err != nil {
					return err
				}
				hashes[f-3], audio[f-3] = 0, 0
				if vk == '"' || vk == '{' { // a URL, or {"url": …} (else the engine's to refuse)
					isAudio := f == 4 || f == 5
					h, length := mediaKey(raw, &p.media, isAudio)
					hashes[f-3] = h
					if isAudio {
						audio[f-3] = p.est.AudioBytes(length)
					}
				}
			default:
				if err := d.SkipValue(); err != nil {
					return err
				}
			}
		}
		d.ReadToken()
		p.content = p.content[:start]
		switch {
		case isText && hasText:
			p.content = append(p.content, p.text...)
		case kind != 0 && hashes[kind-3] != 0:
			full := [...]int{p.imageBytes, audio[1], audio[2], p.videoBytes}[kind-3]
			size := 0 // past the request's allowance, the media's line alone
			if p.mediaLeft >= full {
				size, p.mediaLeft = full, p.mediaLeft-full
				p.contentMedia += size
			}
			p.spans = append(p.spans, len(p.content))
			p.content = appendMedia(p.content, mediaNames[kind-3], hashes[kind-3], size)
			p.spans = append(p.spans, len(p.content))
		}
	}
	_, err := d.ReadToken()
	return err
}

// appendInput appends an "input" value's text (see ParseInput).
func (p *parser) appendInput(r *Request) error {
	if p.hasInstr {
		// The engine puts them before the input as a system message.
		r.Text = append(append(append(r.Text[:0], "system\n"...), p.instr...), '\n')
		r.Instructions = len(r.Text)
	}
	switch p.listKind {
	case 0, 'n':
		return nil
	case '"':
		r.Text = unquote(r.Text, p.list)
		return nil
	case '[':
	default:
		return errInput
	}
	e := parsers.Get().(*parser)
	defer func() {
		e.inputParts = false
		parsers.Put(e)
	}()
	e.inputParts = true
	e.est, e.imageBytes, e.videoBytes, e.mediaLeft = p.est, p.imageBytes, p.videoBytes, maxMediaBytes
	e.in.Reset(p.list)
	e.dec.Reset(&e.in, decodeOptions...)
	d := &e.dec
	d.ReadToken()
	for i := 0; d.PeekKind() != ']'; i++ {
		switch d.PeekKind() {
		case '"':
			v, err := d.ReadValue()
			if err != nil {
				return err
			}
			r.Text = append(unquote(r.Text, v), '\n')
		case '0': // token ids: the list's JSON stands for the text
			r.Text, r.Instructions, r.Media = append(r.Text[:0], p.list...), 0, r.Media[:0]
			return nil
		case '{', 'n':
			if err := e.readMessage(r, i); err != nil {
				return fmt.Errorf("input: %w", err)
			}
		default:
			return errInput
		}
	}
	return nil
}

// readPrompt keeps a completion's prompt value (its kind and raw JSON).
func (p *parser) readPrompt() error {
	p.listKind = p.dec.PeekKind()
	raw, err := p.dec.ReadValue()
	p.list = append(p.list[:0], raw...)
	return err
}

// appendPrompt appends a completion request's prompt: a string, or a
// non-empty list of token ids, whose JSON stands for the text; or a batch
// of several: a list of strings, or of lists of token ids, each followed
// by a newline, where each ends recorded (a list of one string is that
// string). As with encoding/json, a null in a list reads as "" or 0.
func (p *parser) appendPrompt(r *Request) error {
	switch p.listKind {
	case '"':
		r.Text = unquote(r.Text, p.list)
		return nil
	case '[':
	default:
		return errPrompt
	}
	d := p.batch.reset(p.list)
	d.ReadToken()
	n, strs, ids, lists := 0, true, true, true
	for d.PeekKind() != ']' {
		kind := d.PeekKind()
		v, err := d.ReadValue()
		if err != nil {
			return err
		}
		n++
		switch kind {
		case 'n':
			lists = false
		case '"':
			ids, lists = false, false
		case '0':
			strs, lists = false, false
			if _, err := strconv.ParseInt(string(v), 10, 64); err != nil {
				ids = false
			}
		case '[':
			strs, ids = false, false
			lists = lists && p.isIDList(v)
		default:
			strs, ids, lists = false, false, false
		}
	}
	switch {
	case n == 0:
	case ids && !strs: // a list of nulls is of strings, as encoding/json reads it first
		r.Text = append(r.Text, p.list...)
		return nil
	case strs, lists:
		d = p.batch.reset(p.list)
		d.ReadToken()
		for d.PeekKind() != ']' {
			kind := d.PeekKind()
			v, err := d.ReadValue() // read once above
			if err != nil {
				return err
			}
			switch kind {
			case '"':
				r.Text = unquote(r.Text, v)
			case '[':
				r.Text = append(r.Text, v...)
			}
			if n > 1 {
				r.PromptEnds = append(r.PromptEnds, len(r.Text))
				r.Text = append(r.Text, '\n')
			}
		}
		return nil
	}
	return errPrompt
}

// isIDList reports whether v is a non-empty list of token ids (a null
// reads as 0).
func (p *parser) isIDList(v jsontext.Value) bool {
	d := p.item.reset(v)
	d.ReadToken()
	n := 0
	for d.PeekKind() != ']' {
		kind := d.PeekKind()
		raw, err := d.ReadValue()
		if err != nil {
			return false
		}
		switch kind {
		case 'n':
		case '0':
			if _, err := strconv.ParseInt(string(raw), 10, 64); err != nil {
				return false
			}
		default:
			return false
		}
		n++
	}
	return n > 0
}

func isObject(v gjson.Result) bool { return v.Type == gjson.JSON && v.Raw[0] == '{' }
func isArray(v gjson.Result) bool  { return v.Type == gjson.JSON && v.Raw[0] == '[' }

// bytesString views b as a string, without copying.
func bytesString(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// WithIncludeUsage returns body with stream_options.include_usage set to
// true, appended to dst[:0]; the rest of the body is byte-for-byte
// unchanged. It edits the last "stream_options" member (keys match exactly,
// as the Python engines read them): absent, it inserts
// "stream_options":{"include_usage":true} right after the body's opening
// brace; null (or not an object), it replaces its value; an object, it
// sets the last "include_usage" member's value to true, or inserts that
// member first.
//
// body must be a valid JSON object, as ParseRequest accepted it: it is not
// validated again. For anything else the result means nothing (what is not
// an object comes back as it was), but WithIncludeUsage does not panic.
//
// When the body holds neither "_options" nor a \u00XX escape (which could
// spell "stream_options"), no key can be "stream_options": that costs two
// fast scans (for bytes rare in text, '_' and '0') and one copy of the
// body. Otherwise gjson walks the body's top level.
func WithIncludeUsage(body, dst []byte) []byte {
	dst = dst[:0]
	open := skipSpace(body, 0)
	if open == len(body) || body[open] != '{' {
		return append(dst, body...)
	}
	if !bytes.Contains(body, []byte("_options")) && !asciiEscape(body) {
		next := skipSpace(body, open+1)
		return splice(dst, body, open+1, open+1, `"stream_options":{"include_usage":true}`, next < len(body) && body[next] != '}')
	}
	root := gjson.Parse(bytesString(body))
	var opts gjson.Result
	members := 0
	root.ForEach(func(key, v gjson.Result) bool {
		members++
		if key.Str == "stream_options" {
			opts = v
		}
		return true
	})
	switch {
	case !opts.Exists():
		return splice(dst, body, open+1, open+1, `"stream_options":{"include_usage":true}`, members > 0)
	case !isObject(opts):
		return splice(dst, body, opts.Index, opts.Index+len(opts.Raw), `{"include_usage":true}`, false)
	}
	var iu gjson.Result
	members = 0
	opts.ForEach(func(key, v gjson.Result) bool {
		members++
		if key.Str == "include_usage" {
			iu = v
		}
		return true
	})
	switch {
	case !iu.Exists():
		return splice(dst, body, opts.Index+1, opts.Index+1, `"include_usage":true`, members > 0)
	case iu.Type == gjson.True:
		return append(dst, body...)
	}
	return splice(dst, body, iu.Index, iu.Index+len(iu.Raw), "true", false)
}

// asciiEscape reports whether b may hold a \u escape of an ASCII character
// (\u00XX). It looks for "00" rather than for the backslash, which chat
// bodies are full of.
func asciiEscape(b []byte) bool {
	for {
		i := bytes.Index(b, []byte("00"))
		switch {
		case i < 0:
			return false
		case i >= 2 && b[i-2] == '\\' && b[i-1] == 'u':
			return true
		}
		b = b[i+1:]
	}
}

// skipSpace returns the index of the first byte of b from i on that is not
// JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// splice appends body with body[from:to] replaced by s (and a comma).
func splice(dst, body []byte, from, to int, s string, comma bool) []byte {
	if from < 0 || to < from || to > len(body) { // body was not valid JSON
		return append(dst, body...)
	}
	dst = append(dst, body[:from]...)
	dst = append(dst, s...)
	if comma {
		dst = append(dst, ',')
	}
	return append(dst, body[to:]...)
}

// WithModel returns body with its model set to model, appended to dst[:0];
// the rest of the body is byte-for-byte unchanged. Every top-level member
// whose key ParseRequest reads as "model" (keys match case-insensitively)
// gets the new value, and when none is spelled exactly "model" (as the
// Python engines read it) one is inserted right after the opening brace.
//
// body must be a valid JSON object, as ParseRequest accepted it: it is not
// validated again (for anything else the result means nothing, but
// WithModel does not panic).
func WithModel(body []byte, model string, dst []byte) []byte {
	dst = dst[:0]
	open := skipSpace(body, 0)
	if open == len(body) || body[open] != '{' {
		return append(dst, body...)
	}
	value, _ := json.Marshal(model) // a string always marshals
	root := gjson.Parse(bytesString(body))
	exact, members, prev := false, 0, 0
	root.ForEach(func(key, v gjson.Result) bool {
		members++
		if !strings.EqualFold(key.Str, "model") || v.Index < prev || v.Index+len(v.Raw) > len(body) {
			return true
		}
		exact = exact || key.Str == "model"
		dst = append(dst, body[prev:v.Index]...)
		dst = append(dst, value...)
		prev = v.Index + len(v.Raw)
		return true
	})
	dst = append(dst, body[prev:]...)
	if exact {
		return dst
	}
	// Insert "model" first: shift what was built after the brace.
	ins := make([]byte, 0, len(value)+10)
	ins = append(append(ins, `"model":`...), value...)
	if members > 0 {
		ins = append(ins, ',')
	}
	dst = slices.Insert(dst, open+1, ins...)
	return dst
}

// Model is the top-level "model" string of a JSON object body ("" when the
// body is not a JSON object or names none): how a body gorgo does not
// otherwise read is routed by model.
func Model(body []byte) string {
	i := 0
	for i < len(body) && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n') {
		i++
	}
	if i == len(body) || body[i] != '{' {
		return ""
	}
	if v := gjson.GetBytes(body, "model"); v.Type == gjson.String {
		return v.String()
	}
	return ""
}
