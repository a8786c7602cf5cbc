package wire

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxErrorLen bounds the length in bytes of an error message kept in a
// record.
const maxErrorLen = 300

// ErrorMessage returns the message of an error body, on one line and at
// most 300 bytes. It accepts the shapes OpenAI-compatible servers send:
// nested {"error":{"message":...}} (OpenAI, vLLM >= 0.10.1), {"error":"..."},
// flat {"object":"error","message":...} (older vLLM, SGLang) and FastAPI's
// {"detail":...}. A body that is not valid JSON but has a "message" field
// (SGLang's bodies have been seen with Python escapes) gives that field;
// any other body is returned itself, cut. An empty body gives "".
func ErrorMessage(body []byte) string {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return ""
	}
	if e, ok := decodeError(body); ok {
		var s string
		if e.nested != nil && json.Unmarshal(e.nested.Message, &s) == nil && s != "" {
			return oneLine(s)
		}
		if len(e.Error) > 0 && json.Unmarshal(e.Error, &s) == nil && s != "" {
			return oneLine(s)
		}
		if json.Unmarshal(e.Message, &s) == nil && s != "" {
			return oneLine(s)
		}
		if len(e.Detail) > 0 && string(e.Detail) != "null" {
			if json.Unmarshal(e.Detail, &s) == nil {
				return oneLine(s)
			}
			return oneLine(string(e.Detail))
		}
	}
	if m, ok := scanMessage(body); ok {
		return oneLine(m)
	}
	return oneLine(string(body))
}

// errorObject is an error's members: its message, and those that say
// whose fault it is (vLLM's and SGLang's numeric code, some servers'
// status, its type).
type errorObject struct {
	Message json.RawMessage `json:"message"` // a string; raw, so that another kind loses nothing else
	Code    json.RawMessage `json:"code"`
	Status  json.RawMessage `json:"status"`
	Type    json.RawMessage `json:"type"` // a string; raw, so that another kind loses nothing else
}

// errorBody is an error body in any of the shapes ErrorMessage accepts:
// flat, with its members at the top, or nested under "error" (an object,
// then also decoded into nested, or a string); FastAPI's under "detail".
type errorBody struct {
	errorObject
	Error  json.RawMessage `json:"error"`
	Detail json.RawMessage `json:"detail"`
	nested *errorObject
}

// decodeError decodes an error body; false if it is not a JSON object.
func decodeError(body []byte) (errorBody, bool) {
	var e errorBody
	if json.Unmarshal(body, &e) != nil {
		return e, false
	}
	if len(e.Error) > 0 && e.Error[0] == '{' {
		var n errorObject
		if json.Unmarshal(e.Error, &n) == nil {
			e.nested = &n
		}
	}
	return e, true
}

// scanMessage finds "message": "..." in a body that is not valid JSON and
// decodes the string leniently: JSON escapes, and any other escaped
// character (such as Python's \') stands for itself.
func scanMessage(body []byte) (string, bool) {
	i := bytes.Index(body, []byte(`"message"`))
	if i < 0 {
		return "", false
	}
	rest := bytes.TrimLeft(body[i+len(`"message"`):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return "", false
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	if len(rest) == 0 || rest[0] != '"' {
		return "", false
	}
	var b strings.Builder
	for j := 1; j < len(rest); j++ {
		c := rest[j]
		switch {
		case c == '"':
			return b.String(), true
		case c == '\\' && j+1 < len(rest):
			j++
			switch e := rest[j]; e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case 'u':
				if j+4 < len(rest) {
					if r, err := strconv.ParseUint(string(rest[j+1:j+5]), 16, 32); err == nil {
						b.WriteRune(rune(r))
						j += 4
						continue
					}
				}
				b.WriteByte(e)
			default:
				b.WriteByte(e)
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", false
}

// oneLine collapses runs of white space to one space and cuts s to
// maxErrorLen bytes on a rune boundary, marking the cut with "...".
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= maxErrorLen {
		return s
	}
	cut := maxErrorLen - 3
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// RequestFault reports whether an error body blames the request rather than
// the server that sent it: a numeric code or status from 400 to 499 other
// than 429, or an OpenAI- or vLLM-style type naming a bad request. Another
// replica would refuse the same request; any other error (a 5xx, an
// engine's failure, an error that says nothing of whose it is) is the
// server's, and another replica may serve the request.
func RequestFault(body []byte) bool {
	e, ok := decodeError(bytes.TrimSpace(body))
	return ok && (e.requestFault() || e.nested != nil && e.nested.requestFault())
}

func (e *errorObject) requestFault() bool {
	for _, raw := range []json.RawMessage{e.Code, e.Status} {
		if n, err := strconv.Atoi(strings.Trim(string(raw), `"`)); err == nil && n >= 400 && n < 500 && n != 429 {
			return true
		}
	}
	switch strings.ToLower(strings.Trim(string(e.Type), `"`)) {
	case "invalid_request_error", "badrequesterror", "bad_request", "notfounderror", "not_found_error":
		return true
	}
	return false
}

// NoRoute reports whether a 404's body is a server's answer for a path it
// has no route for, rather than an engine's error about the request (an
// error object: a model or a stored response it does not have).
// FastAPI's {"detail":"Not Found"} (vLLM's and SGLang's servers), Go's
// "404 page not found", a proxy's HTML page, a bare "Not Found" and an
// empty body are; a JSON error with a message of its own is not.
func NoRoute(body []byte) bool {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] == '<' {
		return true
	}
	if body[0] == '{' {
		e, ok := decodeError(body)
		var s string
		return ok && len(e.Error) == 0 && len(e.Message) == 0 && json.Unmarshal(e.Detail, &s) == nil && strings.EqualFold(s, "Not Found")
	}
	switch strings.ToLower(string(body)) {
	case "not found", "404 not found", "404: not found", "404 page not found":
		return true
	}
	return false
}
