package wire

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Error is an error as gorgo answers it, in OpenAI's shape: an HTTP status,
// an error type and a message for the client, and for a busy or overloaded
// fleet its Retry-After (seconds).
type Error struct {
	Status     int
	Type       string
	Message    string
	RetryAfter string
	// Param names the request's parameter at fault and Code is OpenAI's
	// code for the error ("model_not_found"); empty, the body has a null
	// param and the status as its code.
	Param, Code string
	// Answer, when set, is what the client is answered (of AnswerType,
	// with Status) instead of the error's JSON: an answer the router gives
	// in the request's own shape (a request its client aborted before a
	// replica had it is answered as the engine answers an abort).
	Answer     []byte
	AnswerType string
}

func (e *Error) Error() string { return e.Message }

// Errorf returns an error of the status, its type the status's (see
// TypeOf).
func Errorf(status int, format string, args ...any) *Error {
	return &Error{Status: status, Type: TypeOf(status), Message: fmt.Sprintf(format, args...)}
}

// TypeOf is the OpenAI error type gorgo gives a status.
func TypeOf(status int) string {
	switch status {
	case 400, 413:
		return "BadRequestError"
	case 401:
		return "AuthenticationError"
	case 403:
		return "PermissionDeniedError"
	case 404:
		return "NotFoundError"
	case 405:
		return "MethodNotAllowedError"
	case 409:
		return "ConflictError"
	case 429:
		return "RateLimitError"
	case 500:
		return "InternalServerError"
	case 502, 504:
		return "BadGatewayError"
	case 503:
		return "ServiceUnavailableError"
	}
	return "APIError"
}

// JSON is the error's body: {"error":{"message":...,"type":...,"param":null,"code":STATUS}}
// (param and code strings when set) and a newline.
func (e *Error) JSON() []byte {
	msg, _ := json.Marshal(e.Message) // a string always marshals
	typ, _ := json.Marshal(e.Type)
	b := make([]byte, 0, 64+len(msg)+len(typ)+len(e.Param)+len(e.Code))
	b = append(b, `{"error":{"message":`...)
	b = append(b, msg...)
	b = append(b, `,"type":`...)
	b = append(b, typ...)
	b = append(b, `,"param":`...)
	if e.Param == "" {
		b = append(b, "null"...)
	} else {
		p, _ := json.Marshal(e.Param)
		b = append(b, p...)
	}
	b = append(b, `,"code":`...)
	if e.Code == "" {
		b = strconv.AppendInt(b, int64(e.Status), 10)
	} else {
		c, _ := json.Marshal(e.Code)
		b = append(b, c...)
	}
	return append(b, "}}\n"...)
}

// CodeModelNotFound is OpenAI's code for a model it does not have.
const CodeModelNotFound = "model_not_found"

// ModelNotFound is OpenAI's answer to a request for a model it does not
// have: 404, an invalid_request_error with param "model" and code
// model_not_found.
func ModelNotFound(name string) *Error {
	e := Errorf(404, "The model `%s` does not exist.", name)
	e.Type, e.Param, e.Code = "invalid_request_error", "model", CodeModelNotFound
	return e
}

// RetryWait reads a Retry-After header's value (RFC 9110: whole seconds,
// or an HTTP date) as a wait from now: 0 when it is absent, unreadable or
// past.
func RetryWait(h string, now time.Time) time.Duration {
	if h == "" {
		return 0
	}
	if s, err := strconv.ParseUint(h, 10, 32); err == nil {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
