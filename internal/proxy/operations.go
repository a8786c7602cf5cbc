package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gorgo-llm/gorgo/internal/httpapi"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// Engine operations: the engines' paths that act on one engine's state
// rather than serve a request. SGLang's /flush_cache empties its prefix
// cache (GET or POST; a 400 while it has requests), its /abort_request
// aborts a request by its rid, or all of them; vLLM's /reset_prefix_cache
// empties its prefix cache; both load and unload LoRA adapters at run
// time (vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter,
// SGLang's /load_lora_adapter and /unload_lora_adapter). A client of the
// router means them for the fleet behind it, whichever replica serves
// what: a benchmark flushes the caches before a cold run, a
// reinforcement-learning trainer aborts its rollouts, a platform loads an
// adapter for the fleet to serve. Each is sent to every replica that
// serves requests or still finishes some (draining), at once; a replica
// without the path (its server's own 404: vLLM has no /flush_cache) is
// passed over. Where a replica's cache was emptied the router forgets what
// it held there, as it does for a restarted engine; where an adapter was
// loaded or unloaded, the router reads the replica's models again before
// the client has its answer, so that its next request may name the
// adapter.

// Config.EngineOperations' values.
const (
	operationsAllow  = "allow"
	operationsRefuse = "refuse"
)

// flushes are the operations that empty a replica's prefix cache;
// adapterOps those that change the models it serves.
var (
	flushes    = map[string]bool{"/flush_cache": true, "/reset_prefix_cache": true}
	adapterOps = map[string]bool{"/v1/load_lora_adapter": true, "/v1/unload_lora_adapter": true, "/load_lora_adapter": true, "/unload_lora_adapter": true}
)

// maxOperationFanOut bounds the replicas asked at once.
const maxOperationFanOut = 32

// operationAnswer is one replica's answer to an engine operation.
type operationAnswer struct {
	id      string
	status  int
	header  http.Header
	body    []byte
	err     error // not reached, or its answer broke off
	noRoute bool  // it has no such path
}

// handleOperation sends an engine operation to every replica and answers
// the client with the replicas' verdict: the first answer that is not a
// success, else, if a replica could not be reached, a 502 naming it, else
// the first success. A replica that had already done what an adapter's
// load or unload asks (it had the adapter, or did not) is not a refusal.
func (s *Server) handleOperation(w http.ResponseWriter, r *http.Request) {
	cfg := s.cfg.Load()
	if cfg.EngineOperations == operationsRefuse {
		httpapi.Error(w, http.StatusForbidden, "%s %s acts on every replica's engine, which this router does not let clients do (engine_operations: refuse)", r.Method, r.URL.Path)
		return
	}
	body := httpapi.GetBuffer()
	defer httpapi.PutBuffer(body)
	if err := readBody(w, r, body, cfg); err != nil {
		httpapi.WriteError(w, httpapi.BodyError(err))
		return
	}
	if r.URL.Path == "/abort_request" {
		// Before any replica ends a request it names; those in the
		// router's queue end here.
		if n := s.fleet.Abort(*body, time.Now()); n > 0 {
			s.log.Info("aborted in the router's queue", "requests", n)
		}
	}
	var reps []router.ReplicaState
	for _, st := range s.fleet.Router().Replicas() {
		// A draining replica still finishes its requests: an abort is
		// for them too, and its cache is still read by them.
		if st.Healthy && (st.Available() || st.State == router.Draining) {
			reps = append(reps, st)
		}
	}
	if len(reps) == 0 {
		w.Header().Set("Retry-After", "5")
		httpapi.Error(w, http.StatusServiceUnavailable, "no available replica")
		return
	}
	wait := cfg.HeaderTimeout
	if adapterOps[r.URL.Path] {
		wait = cfg.FirstByteTimeout // loading an adapter reads its weights
	}
	if wait <= 0 {
		wait = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	answers := make([]operationAnswer, len(reps))
	var g errgroup.Group
	g.SetLimit(maxOperationFanOut)
	for i, st := range reps {
		g.Go(func() error {
			answers[i] = s.operation(ctx, r, *body, st.ID)
			return nil
		})
	}
	_ = g.Wait()
	var failed, unreached, succeeded, settled *operationAnswer
	reached, lacking := 0, 0
	for i := range answers {
		a := &answers[i]
		switch {
		case a.noRoute:
			lacking++
			continue
		case a.err != nil:
			if unreached == nil {
				unreached = a
			}
			continue
		case (a.status < 200 || a.status >= 300) && alreadyDone(r.URL.Path, a):
			if settled == nil {
				settled = a
			}
		case a.status < 200 || a.status >= 300:
			if failed == nil {
				failed = a
			}
		default:
			if succeeded == nil {
				succeeded = a
			}
			if flushes[r.URL.Path] {
				_ = s.fleet.Router().ClearCache(a.id) // its cache is empty: the router's index of it too
			}
		}
		reached++
	}
	s.log.Info("engine operation", "path", r.URL.Path, "replicas", len(reps), "answered", reached, "without_it", lacking, "unreached", len(reps)-reached-lacking)
	if unreached != nil { // its error may name an internal address: the log's, not the client's
		s.log.Warn("engine operation did not reach a replica", "path", r.URL.Path, "replica", unreached.id, "error", unreached.err)
	}
	switch {
	case failed != nil:
		writeOperationAnswer(w, failed)
	case unreached != nil:
		httpapi.Error(w, http.StatusBadGateway, "%s reached %d of the replicas that serve it, not %s", r.URL.Path, reached, unreached.id)
	case succeeded != nil:
		writeOperationAnswer(w, succeeded)
	case settled != nil:
		writeOperationAnswer(w, settled)
	default:
		httpapi.Error(w, http.StatusNotFound, "no replica tried serves %s %s", r.Method, r.URL.Path)
	}
}

// operation sends the client's operation, body and all, to replica id.
func (s *Server) operation(ctx context.Context, r *http.Request, body []byte, id string) operationAnswer {
	a := operationAnswer{id: id}
	u := s.fleet.Upstream(id)
	if u == nil {
		a.err = fmt.Errorf("it left the fleet")
		return a
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, u.URL()+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		a.err = err
		return a
	}
	req.Header = forwardHeaders(r)
	s.upstreamAuth(req.Header, u)
	resp, err := s.fleet.Client().Do(req)
	if err != nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	a.status, a.header = resp.StatusCode, resp.Header
	a.body, a.err = io.ReadAll(io.LimitReader(resp.Body, maxErrorPeek))
	switch {
	case a.err != nil:
	case a.status >= 500:
		a.err = fmt.Errorf("it answered %d: %s", a.status, wire.ErrorMessage(a.body))
	case a.status >= 300 && a.status < 400: // where it points may be an internal host: not relayed
		a.err = fmt.Errorf("it answered %d, a redirect, which gorgo does not follow", a.status)
	case a.status == http.StatusNotFound && wire.NoRoute(a.body):
		a.noRoute = true
	case a.status >= 200 && a.status < 300 && adapterOps[r.URL.Path]:
		s.fleet.ModelsChanged(ctx, id)
	}
	return a
}

// writeOperationAnswer relays a replica's answer to an operation.
func writeOperationAnswer(w http.ResponseWriter, a *operationAnswer) {
	copyHeaders(w.Header(), a.header)
	w.Header().Del("Content-Length")
	w.Header().Set(ReplicaHeader, a.id)
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

// alreadyDone reports whether a replica's refusal of an adapter's load or
// unload says it had already done it: it had the adapter loaded (vLLM's
// "has already been loaded"), or had none of that name to unload ("cannot
// be found", "not found", "not loaded").
func alreadyDone(path string, a *operationAnswer) bool {
	if !adapterOps[path] || a.status != http.StatusBadRequest && a.status != http.StatusNotFound {
		return false
	}
	msg := strings.ToLower(wire.ErrorMessage(a.body))
	if strings.HasSuffix(path, "/load_lora_adapter") {
		return strings.Contains(msg, "already")
	}
	return strings.Contains(msg, "cannot be found") || strings.Contains(msg, "not found") || strings.Contains(msg, "not loaded")
}
