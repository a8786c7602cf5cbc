package proxy

import (
	"fmt"
	"net/http"

	"github.com/gorgo-llm/gorgo/internal/httpapi"
	"github.com/gorgo-llm/gorgo/internal/wire"
)

// listModels answers GET /v1/models: every name an available replica
// serves, each once, and the router's aliases. While no available
// replica's models are known, a replica answers it.
func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	list, ok := s.fleet.ModelList()
	if !ok {
		s.handleGet(w, r)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, list)
}

// getModel answers GET /v1/models/{id} from the same list: the model's
// entry; a 503 with Retry-After if only replicas not available now serve
// it (as a request for it is answered: it is down, not gone); else 404
// model_not_found.
func (s *Server) getModel(w http.ResponseWriter, r *http.Request) {
	list, ok := s.fleet.ModelList()
	if !ok {
		s.handleGet(w, r)
		return
	}
	id := r.PathValue("id")
	for _, c := range list.Data {
		if c.ID == id {
			httpapi.WriteJSON(w, http.StatusOK, c)
			return
		}
	}
	if served, _ := s.fleet.Router().Catalog(); served != nil {
		if _, ok := served.Lookup(id); ok {
			e := noReplica()
			e.Message = fmt.Sprintf("no replica serving the model %s is available now", id)
			httpapi.WriteError(w, e)
			return
		}
	}
	httpapi.WriteError(w, wire.ModelNotFound(id))
}
