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
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &v) == nil {
		if len(v.Error) > 0 && string(v.Error) != "null" {
			var nested struct {
				Message string `json:"message"`
			}
			if json.Unmarshal(v.Error, &nested) == nil && nested.Message != "" {
				return oneLine(nested.Message)
			}
			var s string
			if json.Unmarshal(v.Error, &s) == nil && s != "" {
				return oneLine(s)
			}
		}
		if v.Message != "" {
			return oneLine(v.Message)
		}
		if len(v.Detail) > 0 && string(v.Detail) != "null" {
			var s string
			if json.Unmarshal(v.Detail, &s) == nil {
				return oneLine(s)
			}
			return oneLine(string(v.Detail))
		}
	}
	if m, ok := scanMessage(body); ok {
		return oneLine(m)
	}
	return oneLine(string(body))
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
	var v struct {
		errorFields
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(bytes.TrimSpace(body), &v) != nil {
		return false
	}
	if v.requestFault() {
		return true
	}
	var nested errorFields
	return len(v.Error) > 0 && json.Unmarshal(v.Error, &nested) == nil && nested.requestFault()
}

// errorFields are the members of an error object that say whose fault it
// is: vLLM's and SGLang's numeric code, some servers' status, and its type.
type errorFields struct {
	Code   json.RawMessage `json:"code"`
	Status json.RawMessage `json:"status"`
	Type   string          `json:"type"`
}

func (e *errorFields) requestFault() bool {
	for _, raw := range []json.RawMessage{e.Code, e.Status} {
		if n, err := strconv.Atoi(strings.Trim(string(raw), `"`)); err == nil && n >= 400 && n < 500 && n != 429 {
			return true
		}
	}
	switch strings.ToLower(e.Type) {
	case "invalid_request_error", "badrequesterror", "bad_request", "notfounderror", "not_found_error":
		return true
	}
	return false
}
