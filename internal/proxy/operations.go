package proxy

import (
	"net/http"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/httpapi"
	"github.com/gorgo-llm/gorgo/internal/tenant"
)

// The engines' operations on their own state (SGLang's /flush_cache and
// /abort_request, vLLM's /reset_prefix_cache, both engines' adapter loads:
// fleet.Operate) are sent to every replica.

// Config.EngineOperations' values.
const (
	OperationsAllow  = "allow"
	OperationsRefuse = "refuse"
)

// operator reports whether the request's tenant may send the engines'
// operations where the router refuses them to clients (its config's
// engine_operations: true).
func (s *Server) operator(r *http.Request, cfg *Config) bool {
	name, err := cfg.TenantHeader.Name(clientKey(r), r.Header.Get(tenant.TenantHeader))
	return err == nil && s.fleet.Core().Tenants().Operates(name)
}

// handleOperation sends an engine operation to every replica and answers
// the client with the replicas' verdict (fleet.Operate, which takes an
// abort, or an operation that aborts, first: the requests it covers that
// wait in the router's queue end, and the engines' aborts of the others
// are relayed).
func (s *Server) handleOperation(w http.ResponseWriter, r *http.Request) {
	cfg := s.cfg.Load()
	if cfg.EngineOperations == OperationsRefuse && !s.operator(r, cfg) {
		httpapi.Error(w, http.StatusForbidden, "%s %s acts on every replica's engine, which this router lets only the tenants it names do (engine_operations: refuse; a tenant's engine_operations: true)", r.Method, r.URL.Path)
		return
	}
	body := httpapi.GetBuffer()
	defer s.putBody(body)
	if err := s.readBody(w, r, body, cfg); err != nil {
		httpapi.WriteError(w, httpapi.BodyError(err))
		return
	}
	a, e := s.fleet.Operate(r.Context(), fleet.Operation{Method: r.Method, URI: r.URL.RequestURI(), Body: *body,
		Wait: cfg.HeaderTimeout, LongWait: cfg.FirstByteTimeout, Received: time.Now(),
		Header: func(u *fleet.Upstream) http.Header {
			h := forwardHeaders(r)
			s.upstreamAuth(h, u)
			return h
		}})
	if e != nil {
		httpapi.WriteError(w, e)
		return
	}
	copyHeaders(w.Header(), a.Header)
	w.Header().Del("Content-Length")
	w.Header().Set(ReplicaHeader, a.ID)
	if a.Missed != nil {
		w.Header().Set(MissedHeader, strings.Join(a.Missed, ","))
	}
	w.WriteHeader(a.Status)
	_, _ = w.Write(a.Body)
}
