// Package httpapi holds what gorgo's HTTP listeners (the OpenAI API of
// gorgo serve, the admin API) share: errors in OpenAI's shape, routes that
// answer a wrong method with 405 and an unknown path with 404 in that
// shape, bounded and pooled request bodies, and bearer tokens compared in
// constant time.
package httpapi

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"

	"github.com/gorgo-llm/gorgo/internal/wire"
)

// WriteError answers with e: its status, its Retry-After if any, and its
// body in OpenAI's shape.
func WriteError(w http.ResponseWriter, e *wire.Error) {
	if e.RetryAfter != "" {
		w.Header().Set("Retry-After", e.RetryAfter)
	}
	if e.Answer != nil {
		w.Header().Set("Content-Type", e.AnswerType)
		w.WriteHeader(e.Status)
		_, _ = w.Write(e.Answer)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(e.JSON())
}

// Error answers with an error of the status (see wire.Errorf).
func Error(w http.ResponseWriter, status int, format string, args ...any) {
	WriteError(w, wire.Errorf(status, format, args...))
}

// WriteJSON answers with v, indented; a v that cannot be encoded (a number
// that is not finite) is a 500 saying so, not an empty answer of status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		Error(w, http.StatusInternalServerError, "the answer cannot be written as JSON: %v", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// DecodeJSON reads a JSON body of at most limit bytes into v, unknown
// fields and anything after the value refused; it answers the error itself
// (413 for a body over the limit, said or found) and reports false on one.
func DecodeJSON(w http.ResponseWriter, r *http.Request, v any, limit int64) bool {
	if r.ContentLength > limit {
		Error(w, http.StatusRequestEntityTooLarge, "the body is larger than %d bytes", limit)
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, next := dec.Token(); next != io.EOF {
			err = errors.New("more after the JSON value")
			if _, ok := errors.AsType[*http.MaxBytesError](next); ok {
				err = next
			}
		}
	}
	switch _, tooLarge := errors.AsType[*http.MaxBytesError](err); {
	case tooLarge:
		Error(w, http.StatusRequestEntityTooLarge, "the body is larger than %d bytes", limit)
		return false
	case err != nil:
		Error(w, http.StatusBadRequest, "malformed JSON: %v", err)
		return false
	}
	return true
}

// Endpoint is a method and a path pattern, and their handler.
type Endpoint struct {
	Method, Pattern string
	Handler         http.HandlerFunc
}

// Register adds the routes to mux; a known path asked with another method
// gets 405 with Allow (the methods its own routes take), any other path
// 404, both in OpenAI's error shape. A path under a catch-all pattern,
// PREFIX{rest...}, is a known path too: the catch-all takes its methods
// only for the paths no route names.
func Register(mux *http.ServeMux, endpoints []Endpoint) {
	allowed := map[string][]string{}
	var catchAll []string
	for _, e := range endpoints {
		mux.HandleFunc(e.Method+" "+e.Pattern, e.Handler)
		allowed[e.Pattern] = append(allowed[e.Pattern], e.Method)
		if prefix, ok := strings.CutSuffix(e.Pattern, "{rest...}"); ok {
			catchAll = append(catchAll, prefix)
		}
	}
	for pattern, methods := range allowed {
		allow := strings.Join(methods, ", ")
		refuse := func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			Error(w, http.StatusMethodNotAllowed, "%s %s: use %s", r.Method, r.URL.Path, allow)
		}
		if strings.HasSuffix(pattern, "{rest...}") || !slices.ContainsFunc(catchAll, func(p string) bool { return strings.HasPrefix(pattern, p) }) {
			mux.HandleFunc(pattern, refuse)
			continue
		}
		// Under a catch-all: a pattern without a method would conflict
		// with the catch-all's (neither is the more specific), so each
		// other method is refused by a pattern of its own.
		for _, m := range refusedMethods {
			if !slices.Contains(methods, m) && !(m == http.MethodHead && slices.Contains(methods, http.MethodGet)) {
				mux.HandleFunc(m+" "+pattern, refuse)
			}
		}
	}
	if allowed["/"] == nil {
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			Error(w, http.StatusNotFound, "no route for %s %s", r.Method, r.URL.Path)
		})
	}
}

// refusedMethods are the methods a path under a catch-all is refused by
// name (others reach the catch-all's own 405).
var refusedMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}

// BodyError is the error a client is told when its body could not be
// read: too large (413), or broken off (400).
func BodyError(err error) *wire.Error {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return wire.Errorf(http.StatusRequestEntityTooLarge, "the request body is larger than %d bytes", tooBig.Limit)
	}
	if errors.Is(err, ErrBodyBudget) {
		e := wire.Errorf(http.StatusServiceUnavailable, "%v (max_body_bytes_in_flight): try again shortly", err)
		e.RetryAfter = "1"
		return e
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return wire.Errorf(http.StatusRequestTimeout, "the request body did not come in time")
	}
	return wire.Errorf(http.StatusBadRequest, "could not read the request body")
}

// MaxRequestIDBytes bounds a client's X-Request-Id that gorgo echoes and
// logs (as long as a rid the lifecycle reads).
const MaxRequestIDBytes = 256

// PrintableID reports whether id is a client's request id to echo and
// log: 1 to MaxRequestIDBytes bytes of visible ASCII.
func PrintableID(id string) bool {
	if id == "" || len(id) > MaxRequestIDBytes {
		return false
	}
	for i := range len(id) {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}
