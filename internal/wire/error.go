package wire

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// Error is an error as gorgo answers it, in OpenAI's shape: an HTTP status,
// an error type and a message for the client, and for a busy or overloaded
// fleet its Retry-After (seconds).
type Error struct {
	Status     int
	Type       string
	Message    string
	RetryAfter string
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
// and a newline.
func (e *Error) JSON() []byte {
	msg, _ := json.Marshal(e.Message) // a string always marshals
	typ, _ := json.Marshal(e.Type)
	b := make([]byte, 0, 64+len(msg)+len(typ))
	b = append(b, `{"error":{"message":`...)
	b = append(b, msg...)
	b = append(b, `,"type":`...)
	b = append(b, typ...)
	b = append(b, `,"param":null,"code":`...)
	b = strconv.AppendInt(b, int64(e.Status), 10)
	return append(b, "}}\n"...)
}
