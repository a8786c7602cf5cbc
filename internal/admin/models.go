package admin

import (
	"net/http"

	"github.com/gorgo-llm/gorgo/internal/httpapi"
	"github.com/gorgo-llm/gorgo/internal/models"
)

// modelsJSON is what GET /admin/models shows: the router's aliases and
// splits, and every model a replica serves with the replicas serving it
// (in any state).
type modelsJSON struct {
	Aliases []models.Alias `json:"aliases"`
	Served  []servedJSON   `json:"served"`
	// Unknown lists the replicas whose models are not known (they are
	// taken to serve any).
	Unknown []string `json:"unknown_models,omitempty"`
}

type servedJSON struct {
	models.Model
	Replicas []string `json:"replicas"`
}

// models shows the aliases and the served models.
func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	out := modelsJSON{Aliases: s.fleet.Aliases().Aliases(), Served: []servedJSON{}}
	if out.Aliases == nil {
		out.Aliases = []models.Alias{}
	}
	by := map[string]int{}
	for _, st := range s.fleet.Router().Replicas() {
		if st.Models == nil {
			out.Unknown = append(out.Unknown, st.ID)
			continue
		}
		for _, m := range st.Models.Models() {
			i, ok := by[m.ID]
			if !ok {
				i = len(out.Served)
				by[m.ID] = i
				out.Served = append(out.Served, servedJSON{Model: m})
			}
			out.Served[i].Replicas = append(out.Served[i].Replicas, st.ID)
		}
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// setModels replaces the aliases: {"aliases": {"chat": {"a": 90, "b": 10},
// "small": "c"}} (the config's models: map). Sessions keep their targets
// while those stay targets.
func (s *Server) setModels(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Aliases map[string]models.Spec `json:"aliases"`
	}
	if !httpapi.DecodeJSON(w, r, &in, maxJSON) {
		return
	}
	aliases, err := models.ParseAliases(in.Aliases)
	if err != nil {
		httpapi.Error(w, http.StatusBadRequest, "%v", err)
		return
	}
	s.fleet.Aliases().Set(aliases)
	s.log.Info("admin change", "who", who(r), "op", "models", "aliases", len(aliases))
	s.models(w, r)
}
