package wire

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Peek is what a relay needs to know of one streamed chunk's data (the JSON
// after "data:"), read without decoding the chunk.
type Peek struct {
	// Token: choices[0].delta.content, .reasoning_content or .reasoning is
	// a non-empty string, or .tool_calls a non-empty array, or, for a
	// legacy completions chunk, choices[0].text is a non-empty string, or,
	// for a Responses API event whose type ends in ".delta", its delta is
	// (Event.HasToken's rule).
	Token bool
	// Finish: choices[0].finish_reason is a non-empty string (one
	// choice's end: the answer's only where it has one).
	Finish bool
	// End: the chunk is an answer's last but for [DONE]: an OpenAI
	// stream's usage chunk (a usage and no choice: not vLLM's usage on
	// every chunk), a Responses API stream's response.completed or
	// response.incomplete event.
	End bool
	// Abort: choices[0].finish_reason is "abort": the engine gave the
	// request up (vLLM shutting down or paused, SGLang's abort_request).
	Abort bool
	// Usage: the chunk has a usage that is not null.
	Usage bool
	// CompletionTokens is usage.completion_tokens.
	CompletionTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens, -1 when
	// absent or null.
	CachedTokens int
	// Error: the chunk has an "error" member that is not null, or is
	// {"object":"error",...}, or a Responses API stream's error or
	// response.failed event.
	Error bool
	// ResponseID is a Responses API event's response.id (Event's): it
	// aliases the chunk's data, to be copied if kept.
	ResponseID string
}

// PeekChunk reads one streamed chunk's data (not [DONE]) as ParseChunk
// reads it (keys match case-insensitively, a later duplicate wins, null
// leaves a string as it was), without decoding it: it walks the chunk with
// gjson and decides on the raw bytes (a JSON string is non-empty when its
// literal is longer than ""). It does not validate the chunk: for data that
// is not valid JSON (which ParseChunk refuses) the result means nothing,
// but PeekChunk does not panic.
//
// It allocates nothing, except that gjson unescapes (one or two small
// allocations) each string value holding a backslash escape it walks over,
// such as a delta's "\n".
func PeekChunk(data []byte) Peek {
	var c chunkPeek
	c.usage.reset()
	c.responseUsage.reset()
	root := gjson.Parse(bytesString(data))
	if isObject(root) {
		root.ForEach(c.member)
	}
	p := Peek{
		Token:        c.content || c.reasoningContent || c.reasoning || c.toolCalls || c.text || c.deltaType && c.delta,
		Finish:       c.finish,
		End:          c.usage.set && !c.choice || c.typeEnd,
		Abort:        c.abort,
		Usage:        c.usage.set || c.responseUsage.set,
		CachedTokens: -1,
		Error:        c.err || c.objectError || c.typeError,
		ResponseID:   c.responseID,
	}
	switch {
	case c.usage.set:
		p.CompletionTokens, p.CachedTokens = c.usage.u.tokens()
	case c.responseUsage.set: // a Responses API stream's response.completed
		p.CompletionTokens, p.CachedTokens = c.responseUsage.u.tokens()
	}
	return p
}

// chunkPeek is what PeekChunk has read so far. It mirrors how
// encoding/json fills ParseChunk's chunk struct, duplicates included: a
// later value replaces an earlier one, null leaves a string or a struct as
// it was and sets a pointer back to nil, and a second object (a second
// "choices" array's first element, a second usage) is merged into the
// first.
type chunkPeek struct {
	// choices[0]: whether each string is non-empty (tool_calls: the
	// array).
	content, reasoningContent, reasoning, toolCalls, text, finish bool
	abort                                                         bool // finish_reason is "abort"
	choice                                                        bool // choices has an element
	typeEnd                                                       bool // a Responses API stream's last event
	// A Responses API event: its type ends in ".delta"; its delta is a
	// non-empty string.
	deltaType, delta bool
	// usage, and a Responses API event's response.usage and response.id.
	usage, responseUsage usageMember
	responseID           string
	err, objectError     bool
	typeError            bool // a Responses API stream's error or response.failed event
}

func (c *chunkPeek) member(key, v gjson.Result) bool {
	switch k := key.Str; {
	case is(k, "choices"):
		switch {
		case v.Type == gjson.Null:
			c.resetChoice() // the slice is set to nil
		case isArray(v):
			first := true
			v.ForEach(func(_, choice gjson.Result) bool {
				first = false
				c.choice = true
				if isObject(choice) {
					choice.ForEach(c.choiceMember)
				}
				return false
			})
			if first { // [] makes a new empty slice
				c.resetChoice()
			}
		}
	case is(k, "usage"):
		c.usage.member(v)
	case is(k, "type"):
		if v.Type == gjson.String {
			c.deltaType = strings.HasSuffix(v.Str, ".delta")
			c.typeError = v.Str == "error" || v.Str == "response.failed"
			c.typeEnd = v.Str == "response.completed" || v.Str == "response.incomplete"
		}
	case is(k, "delta"): // held raw: null, or any value but a string, is no delta
		c.delta = v.Type == gjson.String && len(v.Raw) > 2
	case is(k, "response"):
		switch {
		case v.Type == gjson.Null: // the pointer is set back to nil
			c.responseUsage.reset()
			c.responseID = ""
		case isObject(v):
			v.ForEach(func(key, v gjson.Result) bool {
				switch {
				case is(key.Str, "usage"):
					c.responseUsage.member(v)
				case is(key.Str, "id") && v.Type == gjson.String:
					c.responseID = validUTF8(v.Str)
				}
				return true
			})
		}
	case is(k, "error"):
		c.err = v.Type != gjson.Null
	case is(k, "object"):
		if v.Type == gjson.String {
			// v.Str is gjson's unescaping: it can differ from
			// encoding/json's only in strings holding U+FFFD.
			c.objectError = v.Str == "error"
		}
	}
	return true
}

func (c *chunkPeek) resetChoice() {
	c.content, c.reasoningContent, c.reasoning, c.toolCalls, c.text, c.finish = false, false, false, false, false, false
	c.abort, c.choice = false, false
}

func (c *chunkPeek) choiceMember(key, v gjson.Result) bool {
	switch k := key.Str; {
	case is(k, "delta"):
		if isObject(v) {
			v.ForEach(c.deltaMember)
		}
	case is(k, "finish_reason"):
		nonEmpty(v, &c.finish)
		if v.Type != gjson.Null {
			c.abort = v.Type == gjson.String && v.Str == "abort"
		}
	case is(k, "text"):
		nonEmpty(v, &c.text)
	}
	return true
}

func (c *chunkPeek) deltaMember(key, v gjson.Result) bool {
	switch k := key.Str; {
	case is(k, "content"):
		nonEmpty(v, &c.content)
	case is(k, "reasoning_content"):
		nonEmpty(v, &c.reasoningContent)
	case is(k, "reasoning"):
		nonEmpty(v, &c.reasoning)
	case is(k, "tool_calls"):
		c.toolCalls = isArray(v) && nonEmptyArray(json.RawMessage(v.Raw))
	}
	return true
}

// usageMember is a "usage" member as encoding/json fills a pointer to a
// usage struct: null sets it back to nil, an object is merged into what
// it points to.
type usageMember struct {
	set bool
	u   usagePeek
}

func (m *usageMember) reset() { m.set = false; m.u.reset() }

// member reads the member's value v.
func (m *usageMember) member(v gjson.Result) {
	switch {
	case v.Type == gjson.Null:
		m.reset()
	case isObject(v):
		m.set = true
		m.u.read(v)
	default:
		m.u.ok = false // encoding/json refuses it
	}
}

// usagePeek is what is read of a usage object: Chat Completions'
// (completion_tokens, prompt_tokens_details) or the Responses API's
// (output_tokens, input_tokens_details).
type usagePeek struct {
	completion, output  int
	cached, inputCached cachedPeek
	ok                  bool // every field read has the type encoding/json wants
}

// cachedPeek is a details object's cached_tokens: set when not absent or
// null (encoding/json's *int).
type cachedPeek struct {
	n   int
	set bool
}

func (u *usagePeek) reset() { *u = usagePeek{ok: true} }

// tokens are the answer's tokens (completion_tokens, or output_tokens: a
// server sends one of them) and the cached prompt tokens (-1: none said).
func (u *usagePeek) tokens() (completion, cached int) {
	switch {
	case u.cached.set:
		cached = u.cached.n
	case u.inputCached.set:
		cached = u.inputCached.n
	default:
		cached = -1
	}
	return u.completion + u.output, cached
}

// read merges the usage object v into u, as encoding/json merges a
// duplicate into the struct a pointer already points to.
func (u *usagePeek) read(v gjson.Result) {
	v.ForEach(func(key, v gjson.Result) bool {
		switch k := key.Str; {
		case is(k, "completion_tokens"):
			u.ok = intValue(v, &u.completion) && u.ok
		case is(k, "output_tokens"):
			u.ok = intValue(v, &u.output) && u.ok
		case is(k, "prompt_tokens_details"):
			u.details(v, &u.cached)
		case is(k, "input_tokens_details"):
			u.details(v, &u.inputCached)
		}
		return true
	})
}

// details reads a usage's details object v: its cached_tokens into
// *cached (null: not set).
func (u *usagePeek) details(v gjson.Result, cached *cachedPeek) {
	switch {
	case v.Type == gjson.Null:
		*cached = cachedPeek{}
	case isObject(v):
		v.ForEach(func(key, v gjson.Result) bool {
			if is(key.Str, "cached_tokens") {
				if v.Type == gjson.Null {
					*cached = cachedPeek{}
				} else {
					cached.set = true
					u.ok = intValue(v, &cached.n) && u.ok
				}
			}
			return true
		})
	default:
		u.ok = false
	}
}

// PeekBody reads a non-streaming response body's usage: its completion
// tokens and cached prompt tokens (-1 when not reported), as the proxy's
// scanBody reads them with encoding/json: a body that is not valid JSON,
// or whose usage fields have the wrong type, gives (0, -1).
func PeekBody(data []byte) (completionTokens, cachedTokens int) {
	if !ValidJSON(data) {
		return 0, -1
	}
	root := gjson.Parse(bytesString(data))
	if root.Type == gjson.Null {
		return 0, -1
	}
	if !isObject(root) {
		return 0, -1
	}
	var m usageMember
	m.reset()
	root.ForEach(func(key, v gjson.Result) bool {
		if is(key.Str, "usage") {
			m.member(v)
		}
		return m.u.ok // a wrong type fails the whole body, as it does encoding/json's
	})
	if !m.u.ok || !m.set {
		return 0, -1
	}
	return m.u.tokens()
}

// AbortedUnanswered reports whether a non-streaming answer's body says the
// engine gave the request up before its first token: choices[0]'s
// finish_reason is "abort" and usage.completion_tokens is 0 (vLLM answers
// so, with a 200, a request it aborts as it shuts down or pauses;
// SGLang one aborted by its abort_request).
func AbortedUnanswered(body []byte) bool {
	if !bytes.Contains(body, []byte(`"abort"`)) || !ValidJSON(body) {
		return false
	}
	root := gjson.Parse(bytesString(body))
	if !isObject(root) || root.Get("choices.0.finish_reason").Str != "abort" {
		return false
	}
	completion, _ := PeekBody(body)
	return completion == 0
}

// validUTF8 is s as encoding/json decodes a string: each byte that is not
// part of valid UTF-8 replaced by U+FFFD (gjson keeps it). It allocates
// only then.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// nonEmpty sets *dst to whether the string v is non-empty (its literal is
// longer than ""); null leaves *dst as it was.
func nonEmpty(v gjson.Result, dst *bool) {
	if v.Type == gjson.String {
		*dst = len(v.Raw) > 2
	}
}

// intValue reads an integer as encoding/json reads one into an int: a JSON
// number with no fraction or exponent that fits. null leaves *dst as it
// was.
func intValue(v gjson.Result, dst *int) bool {
	switch v.Type {
	case gjson.Null:
		return true
	case gjson.Number:
		if n, ok := parseInt(v.Raw); ok {
			*dst = n
			return true
		}
	}
	return false
}

// parseInt is strconv.ParseInt(s, 10, 64) for what a JSON number can be,
// without allocating on failure.
func parseInt(s string) (int, bool) {
	neg := len(s) > 0 && s[0] == '-'
	if neg {
		s = s[1:]
	}
	if len(s) == 0 || len(s) > 19 {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0') // 19 digits cannot overflow a uint64
	}
	switch {
	case neg && n <= 1<<63:
		return int(-n), true
	case !neg && n < 1<<63:
		return int(n), true
	}
	return 0, false
}

// is reports whether an object's key names field as encoding/json matches
// keys to struct fields: exactly, else by Unicode case folding.
func is(key, field string) bool {
	return key == field || strings.EqualFold(key, field)
}

func isObject(v gjson.Result) bool { return v.Type == gjson.JSON && v.Raw[0] == '{' }
func isArray(v gjson.Result) bool  { return v.Type == gjson.JSON && v.Raw[0] == '[' }

// bytesString views b as a string, without copying.
func bytesString(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// ValidJSON reports whether data is valid JSON. gjson's validator recurses once
// per level of nesting (a few million '[' overflow the stack, which kills
// the process), so data that might nest deeper than encoding/json allows
// (10000) is checked by encoding/json's validator, which does not recurse.
func ValidJSON(data []byte) bool {
	if bytes.Count(data, []byte{'['})+bytes.Count(data, []byte{'{'}) <= 10000 {
		return gjson.ValidBytes(data)
	}
	return json.Valid(data)
}

// PeekTail reads the usage of a non-streaming answer too long to hold
// from its last bytes: the last "usage" member whose value is a whole
// JSON object in tail (OpenAI-compatible servers write usage after the
// choices, at the end). It gives (0, -1) when tail holds none. Unlike
// PeekBody it cannot check the body is valid JSON, nor that the member is
// the top-level usage: a long answer's string that ends in a usage-like
// object could fool it, which costs a budget's accuracy, not its bound.
func PeekTail(tail []byte) (completionTokens, cachedTokens int) {
	completionTokens, cachedTokens = 0, -1
	lastObject(tail, `"usage"`, func(v gjson.Result) bool {
		var u usagePeek
		u.reset()
		u.read(v)
		if u.ok {
			completionTokens, cachedTokens = u.tokens()
		}
		return u.ok
	})
	return completionTokens, cachedTokens
}

// TailBytes is how much of the end of an answer, or of a streamed event,
// too long to hold a relay keeps to read its counts from (PeekTail,
// PeekNativeTail): a usage object with its details, or SGLang's
// meta_info, is a few hundred bytes.
const TailBytes = 4 << 10

// KeepTail appends b to tail and keeps the last TailBytes of them.
func KeepTail(tail, b []byte) []byte {
	if len(b) >= TailBytes {
		return append(tail[:0], b[len(b)-TailBytes:]...)
	}
	tail = append(tail, b...)
	if over := len(tail) - TailBytes; over > 0 {
		tail = tail[:copy(tail, tail[over:])]
	}
	return tail
}

// lastObject calls read with the values of the members of tail named key
// (quoted) that are whole JSON objects, the last first, until read
// accepts one.
func lastObject(tail []byte, key string, read func(v gjson.Result) bool) {
	for end := len(tail); end > 0; {
		i := bytes.LastIndex(tail[:end], []byte(key))
		if i < 0 {
			return
		}
		end = i
		rest := bytes.TrimLeft(tail[i+len(key):], " \t\r\n")
		if len(rest) == 0 || rest[0] != ':' {
			continue
		}
		rest = bytes.TrimLeft(rest[1:], " \t\r\n")
		n := objectEnd(rest)
		if n < 0 || !ValidJSON(rest[:n]) {
			continue
		}
		if read(gjson.Parse(bytesString(rest[:n]))) {
			return
		}
	}
}

// objectEnd returns the length of the JSON object b begins with (through
// its closing brace), or -1 if b does not begin with one or it is not
// whole. Braces inside strings do not count.
func objectEnd(b []byte) int {
	if len(b) == 0 || b[0] != '{' {
		return -1
	}
	depth, inString := 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inString && c == '\\':
			i++ // the escaped character
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth--; depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// ResponseID is the id of the Responses API response a non-streaming
// answer's body holds (its top-level "id" where its "object" is
// "response"; another answer, an embedding's say, has an id but is not
// stored), or "" for none. It reads as far as it can in a body cut short
// (the first bytes of an answer too long to hold): SGLang writes the id
// and the object first, vLLM the id first and the object after the
// request's instructions and metadata, so in a body cut short before any
// "object" a whole "id" that another member follows counts. The id does
// not alias body.
func ResponseID(body []byte) string {
	root := gjson.Parse(bytesString(body))
	if !isObject(root) {
		return ""
	}
	var id string
	response, object, after := false, false, false
	root.ForEach(func(key, v gjson.Result) bool {
		switch {
		case is(key.Str, "id") && v.Type == gjson.String:
			id, after = v.Str, false
		case is(key.Str, "object") && v.Type == gjson.String:
			response, object = v.Str == "response", true
		default:
			after = after || id != ""
		}
		return !(response && id != "")
	})
	switch {
	case response:
	case !object && after && !ValidJSON(body): // cut short before its object
	default:
		return ""
	}
	return strings.Clone(id)
}

// StoredID is the id of the Responses API response a request's path names
// (/v1/responses/{id}, and its /cancel and /input_items), "" for another
// path; a query is not part of it.
func StoredID(path string) string {
	path, _, _ = strings.Cut(path, "?")
	rest, ok := strings.CutPrefix(path, "/v1/responses/")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "/")
	return id
}

// Counts finds the last "completion_tokens" and "cached_tokens" in the
// bytes fed to it, in pieces of any size: the counts of an SGLang chunk
// too long to hold, whose meta_info may end in the log-probabilities of
// every token so far (return_logprob), more than its last TailBytes hold.
// A key cannot occur in a JSON string unescaped, so every match is a
// member's. The zero value has seen nothing.
type Counts struct {
	completion, cached       int
	hasCompletion, hasCached bool
	carry, joint             []byte // the last countsWindow bytes fed; carry and the next piece's start
}

// countsWindow is enough for a key and its number split between pieces.
const countsWindow = 48

var (
	completionKey = []byte(`"completion_tokens":`)
	cachedKey     = []byte(`"cached_tokens":`)
)

// Reset forgets what was fed, keeping the buffers.
func (c *Counts) Reset() {
	c.hasCompletion, c.hasCached = false, false
	c.carry = c.carry[:0]
}

// Last returns the last completion count fed (ok false if none), and the
// last cached count (-1 if none).
func (c *Counts) Last() (completion, cached int, ok bool) {
	cached = -1
	if c.hasCached {
		cached = c.cached
	}
	return c.completion, cached, c.hasCompletion
}

// Feed reads the next piece.
func (c *Counts) Feed(b []byte) {
	if len(c.carry) > 0 { // a key split between the last piece and this
		c.joint = append(append(c.joint[:0], c.carry...), b[:min(len(b), countsWindow)]...)
		c.scan(c.joint)
	}
	c.scan(b)
	if len(b) >= countsWindow {
		c.carry = append(c.carry[:0], b[len(b)-countsWindow:]...)
		return
	}
	c.carry = append(c.carry, b...)
	if over := len(c.carry) - countsWindow; over > 0 {
		c.carry = c.carry[:copy(c.carry, c.carry[over:])]
	}
}

// scan records the counts in b, in order.
func (c *Counts) scan(b []byte) {
	for {
		i, j := bytes.Index(b, completionKey), bytes.Index(b, cachedKey)
		if i < 0 && j < 0 {
			return
		}
		if i >= 0 && (j < 0 || i < j) {
			b = b[i+len(completionKey):]
			if n, ok := leadingInt(b); ok {
				c.completion, c.hasCompletion = n, true
			}
			continue
		}
		b = b[j+len(cachedKey):]
		if n, ok := leadingInt(b); ok {
			c.cached, c.hasCached = n, true
		}
	}
}

// leadingInt reads the non-negative integer b begins with, after spaces.
func leadingInt(b []byte) (int, bool) {
	b = bytes.TrimLeft(b, " \t\r\n")
	n, digits := 0, 0
	for _, ch := range b {
		if ch < '0' || ch > '9' || digits == 18 {
			break
		}
		n = n*10 + int(ch-'0')
		digits++
	}
	return n, digits > 0
}
