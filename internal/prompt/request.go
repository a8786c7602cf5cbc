package prompt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

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
	// MaxTokens is, for chat, max_completion_tokens if present and not
	// null, else max_tokens; for completions, max_tokens. It is -1 when
	// absent or null.
	MaxTokens int
	// Stream is the "stream" field.
	Stream bool
	// IncludeUsage is set when stream_options.include_usage is true.
	IncludeUsage bool
	// User is the "user" field.
	User string
}

// Errors of ParseRequest that the old functions give too.
var (
	errNoMessages = errors.New("messages: at least one message is required")
	errContent    = errors.New("content must be a string or an array of content parts")
	errPrompt     = errors.New("prompt: one prompt is required: a string, a list of one string, or a list of token ids")
)

// ParseRequest reads an OpenAI chat (chat set) or legacy completion request
// body into r without decoding the body into Go values: once gjson has
// validated the body, it walks it once with gjson and decodes only the
// strings it keeps, straight into r.Text. It reads what encoding/json would read into the structs the
// emulator and the proxy used (model, messages or prompt, max_tokens,
// max_completion_tokens for chat, stream, stream_options, user), with the
// same rules: keys match case-insensitively, a later duplicate key wins
// (null leaves a string or bool as it was, and sets a pointer field back to
// absent), other fields are ignored whatever their type, and a field of the
// wrong type is an error. The one difference: for a duplicated "messages"
// key the last array wins (the others must be arrays or null), where
// encoding/json merges the arrays element by element.
//
// The body must be a valid JSON object; nesting deeper than encoding/json's
// limit (10000) is refused too.
//
// Model and User do not alias body. With a reused r whose Model and User do
// not change, parsing allocates only for strings that hold escapes (gjson
// unescapes every string value it walks over).
func ParseRequest(body []byte, chat bool, r *Request) error {
	model, user := r.Model, r.User
	*r = Request{Text: r.Text[:0], MaxTokens: -1}
	if !valid(body) {
		return malformed(body)
	}
	root := gjson.Parse(bytesString(body))
	if !isObject(root) {
		return errors.New("malformed JSON: the body must be a JSON object")
	}

	var (
		err                           error
		mdl, usr, list                gjson.Result
		maxTokens, maxCompletion      int64 = -1, -1
		hasMaxTokens, hasMaxCompleted bool
	)
	root.ForEach(func(key, v gjson.Result) bool {
		switch f := topField(key.Str); {
		case f == fModel:
			err = stringField(v, &mdl, "model")
		case f == fUser:
			err = stringField(v, &usr, "user")
		case f == fMessages && chat:
			if v.Type != gjson.Null && !isArray(v) {
				err = errors.New("messages must be an array")
			}
			list = v
		case f == fPrompt && !chat:
			list = v
		case f == fMaxTokens:
			maxTokens, hasMaxTokens, err = intField(v, "max_tokens")
		case f == fMaxCompletionTokens && chat:
			maxCompletion, hasMaxCompleted, err = intField(v, "max_completion_tokens")
		case f == fStream:
			switch v.Type {
			case gjson.True, gjson.False:
				r.Stream = v.Type == gjson.True
			case gjson.Null:
			default:
				err = errors.New("stream must be a boolean")
			}
		case f == fStreamOptions:
			err = streamOptions(v, &r.IncludeUsage)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	switch {
	case hasMaxCompleted:
		r.MaxTokens = int(maxCompletion)
	case hasMaxTokens:
		r.MaxTokens = int(maxTokens)
	}
	// Decode the model and the user in Text's buffer: no allocation when
	// they are what the reused r held.
	r.Model, r.Text = keepString(mdl, model, r.Text)
	r.User, r.Text = keepString(usr, user, r.Text)
	if chat {
		r.Text, err = appendChat(r.Text, list)
	} else {
		r.Text, err = appendPrompt(r.Text, list)
	}
	return err
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
}

func topField(key string) int {
	for f := fModel; f < len(topNames); f++ {
		if key == topNames[f] {
			return f
		}
	}
	for f := fModel; f < len(topNames); f++ {
		if strings.EqualFold(key, topNames[f]) {
			return f
		}
	}
	return fOther
}

// is reports whether an object's key names field as encoding/json matches
// a key to a struct field: exactly, else by Unicode case folding. (key is
// gjson's unescaping of the key, which can differ from encoding/json's only
// in keys holding U+FFFD, which match no field either way.)
func is(key, field string) bool {
	return key == field || strings.EqualFold(key, field)
}

// stringField keeps v in *dst if it is a string; null leaves *dst as it
// was (as encoding/json leaves a string field).
func stringField(v gjson.Result, dst *gjson.Result, name string) error {
	switch v.Type {
	case gjson.String:
		*dst = v
	case gjson.Null:
	default:
		return fmt.Errorf("%s must be a string", name)
	}
	return nil
}

// intField reads an integer field as encoding/json reads a *int: null is
// absent, a number must be an integer (no fraction or exponent) that fits.
func intField(v gjson.Result, name string) (int64, bool, error) {
	switch v.Type {
	case gjson.Null:
		return -1, false, nil
	case gjson.Number:
		if n, err := strconv.ParseInt(v.Raw, 10, strconv.IntSize); err == nil {
			return n, true, nil
		}
	}
	return -1, false, fmt.Errorf("%s must be an integer", name)
}

// streamOptions reads stream_options as encoding/json reads it into a
// pointer to a struct: null sets it back to absent, an object is merged
// into what earlier duplicates set.
func streamOptions(v gjson.Result, includeUsage *bool) error {
	switch {
	case v.Type == gjson.Null:
		*includeUsage = false
		return nil
	case !isObject(v):
		return errors.New("stream_options must be an object or null")
	}
	var err error
	v.ForEach(func(key, v gjson.Result) bool {
		if is(key.Str, "include_usage") {
			switch v.Type {
			case gjson.True, gjson.False:
				*includeUsage = v.Type == gjson.True
			case gjson.Null:
			default:
				err = errors.New("stream_options.include_usage must be a boolean")
			}
		}
		return err == nil
	})
	return err
}

// keepString decodes the string v (if it exists) using buf's spare room,
// and returns it, or old when equal (no allocation), and buf[:0].
func keepString(v gjson.Result, old string, buf []byte) (string, []byte) {
	if v.Type != gjson.String {
		return "", buf[:0]
	}
	buf = appendString(buf[:0], v.Raw)
	if string(buf) != old {
		old = string(buf)
	}
	return old, buf[:0]
}

// appendChat appends the canonical bytes of the messages array v.
func appendChat(dst []byte, v gjson.Result) ([]byte, error) {
	if !isArray(v) { // absent or null (ParseRequest refused other types)
		return dst, errNoMessages
	}
	var err error
	i := 0
	v.ForEach(func(_, m gjson.Result) bool {
		dst, err = appendMessage(dst, i, m)
		i++
		return err == nil
	})
	if err == nil && i == 0 {
		err = errNoMessages
	}
	return dst, err
}

// appendMessage appends message i: its role, a newline, its content's text
// and a newline.
func appendMessage(dst []byte, i int, m gjson.Result) ([]byte, error) {
	var role, content gjson.Result
	switch {
	case m.Type == gjson.Null: // a zero message: no role
	case !isObject(m):
		return dst, fmt.Errorf("messages[%d] must be an object", i)
	default:
		var err error
		m.ForEach(func(key, v gjson.Result) bool {
			switch {
			case is(key.Str, "role"):
				if err = stringField(v, &role, "role"); err != nil {
					err = fmt.Errorf("messages[%d].role must be a string", i)
				}
			case is(key.Str, "content"):
				content = v
			}
			return err == nil
		})
		if err != nil {
			return dst, err
		}
	}
	if len(role.Raw) <= 2 { // absent, or ""
		return dst, fmt.Errorf("messages[%d].role is required", i)
	}
	dst = appendValue(dst, role)
	dst = append(dst, '\n')
	dst, err := appendContent(dst, content)
	if err != nil {
		return dst, fmt.Errorf("messages[%d]: %w", i, err)
	}
	return append(dst, '\n'), nil
}

// appendContent appends the text of a message's content: a string, null, or an array of parts whose "text" parts'
// texts are concatenated.
func appendContent(dst []byte, c gjson.Result) ([]byte, error) {
	switch {
	case !c.Exists() || c.Type == gjson.Null:
		return dst, nil
	case c.Type == gjson.String:
		return appendValue(dst, c), nil
	case !isArray(c):
		return dst, errContent
	}
	var err error
	c.ForEach(func(_, part gjson.Result) bool {
		switch {
		case part.Type == gjson.Null:
			return true
		case !isObject(part):
			err = errContent
			return false
		}
		var typ, text gjson.Result
		part.ForEach(func(key, v gjson.Result) bool {
			switch {
			case is(key.Str, "type"):
				err = stringField(v, &typ, "type")
			case is(key.Str, "text"):
				err = stringField(v, &text, "text")
			}
			return err == nil
		})
		if err != nil {
			err = errContent
			return false
		}
		// typ.Str is gjson's unescaping, which can differ from
		// encoding/json's only in strings holding U+FFFD.
		if typ.Type == gjson.String && typ.Str == "text" && text.Type == gjson.String {
			dst = appendValue(dst, text)
		}
		return true
	})
	return dst, err
}

// appendPrompt appends a completion request's prompt: a string, a list of one string, or a non-empty list of token ids,
// whose JSON stands for the text. As with encoding/json, a null in a list
// reads as "" or 0.
func appendPrompt(dst []byte, v gjson.Result) ([]byte, error) {
	switch {
	case v.Type == gjson.String:
		return appendValue(dst, v), nil
	case !isArray(v):
		return dst, errPrompt
	}
	var first gjson.Result
	n, strs, ids := 0, true, true
	v.ForEach(func(_, e gjson.Result) bool {
		if n == 0 {
			first = e
		}
		n++
		switch e.Type {
		case gjson.Null:
		case gjson.String:
			ids = false
		case gjson.Number:
			strs = false
			if _, err := strconv.ParseInt(e.Raw, 10, 64); err != nil {
				ids = false
			}
		default:
			strs, ids = false, false
		}
		return strs || ids
	})
	switch {
	case strs && n == 1:
		if first.Type == gjson.String {
			dst = appendValue(dst, first)
		}
		return dst, nil
	case ids && n > 0:
		return append(dst, v.Raw...), nil
	}
	return dst, errPrompt
}

// maxDepth is encoding/json's nesting limit.
const maxDepth = 10000

// valid reports whether body is valid JSON. gjson's validator recurses once
// per level of nesting, and a body of a few million '[' overflows the
// goroutine's stack, which kills the process; a body that might nest
// deeper than encoding/json allows is checked by encoding/json's validator,
// which does not recurse (and refuses what nests deeper than its limit).
func valid(body []byte) bool {
	if bytes.Count(body, []byte{'['})+bytes.Count(body, []byte{'{'}) <= maxDepth {
		return gjson.ValidBytes(body)
	}
	return json.Valid(body)
}

// malformed explains why body is not valid JSON.
func malformed(body []byte) error {
	var v struct{}
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("malformed JSON: %w", err)
	}
	return errors.New("malformed JSON")
}

func isObject(v gjson.Result) bool { return v.Type == gjson.JSON && v.Raw[0] == '{' }
func isArray(v gjson.Result) bool  { return v.Type == gjson.JSON && v.Raw[0] == '[' }

// bytesString views b as a string, without copying.
func bytesString(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// appendValue appends the string v decoded exactly as encoding/json
// decodes it. gjson has already unescaped it (v.Str), and agrees with
// encoding/json unless the string holds invalid UTF-8 or a \u escape of a
// surrogate half; only then is it decoded again from its raw JSON.
func appendValue(dst []byte, v gjson.Result) []byte {
	if utf8.ValidString(v.Raw) && !surrogateEscape(v.Raw) {
		return append(dst, v.Str...)
	}
	return appendString(dst, v.Raw)
}

// surrogateEscape reports whether raw may hold a \u escape of a UTF-16
// surrogate half (\uD800 to \uDFFF).
func surrogateEscape(raw string) bool {
	for {
		i := strings.Index(raw, `\u`)
		if i < 0 || i+3 >= len(raw) {
			return false
		}
		if (raw[i+2] == 'd' || raw[i+2] == 'D') && strings.IndexByte("89abcdefABCDEF", raw[i+3]) >= 0 {
			return true
		}
		raw = raw[i+2:]
	}
}

// appendString appends the JSON string literal raw (quotes included, valid
// as gjson.Valid checked it) decoded exactly as encoding/json decodes it:
// invalid UTF-8 and unpaired surrogates become U+FFFD.
func appendString(dst []byte, raw string) []byte {
	if len(raw) < 2 {
		return dst
	}
	s := raw[1 : len(raw)-1]
	valid := utf8.ValidString(s) // then so is every run between escapes
	for {
		i := strings.IndexByte(s, '\\')
		if i < 0 || i+1 >= len(s) {
			if valid {
				return append(dst, s...)
			}
			return appendUTF8(dst, s)
		}
		if valid {
			dst = append(dst, s[:i]...)
		} else {
			dst = appendUTF8(dst, s[:i])
		}
		c := s[i+1]
		s = s[i+2:]
		switch c {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(s)
			if r < 0 {
				return dst
			}
			s = s[4:]
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if len(s) >= 2 && s[0] == '\\' && s[1] == 'u' {
					r2 = hex4(s[2:])
				}
				if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
					dst = utf8.AppendRune(dst, d)
					s = s[6:]
					continue
				}
				r = utf8.RuneError
			}
			dst = utf8.AppendRune(dst, r)
		default: // '"', '\\', '/'
			dst = append(dst, c)
		}
	}
}

// hex4 reads the 4 hex digits at the start of s, or returns -1.
func hex4(s string) rune {
	if len(s) < 4 {
		return -1
	}
	var r rune
	for _, c := range []byte(s[:4]) {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// appendUTF8 appends s with each byte that is not part of valid UTF-8
// replaced by U+FFFD, as encoding/json does.
func appendUTF8(dst []byte, s string) []byte {
	if utf8.ValidString(s) {
		return append(dst, s...)
	}
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, "\uFFFD"...)
		} else {
			dst = append(dst, s[:n]...)
		}
		s = s[n:]
	}
	return dst
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
