package admin

import (
	"encoding/json"
	"errors"
	"fmt"
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
	// Warnings are a PUT's: the targets no replica serves.
	Warnings []string `json:"warnings,omitempty"`
}

type servedJSON struct {
	models.Model
	Replicas []string `json:"replicas"`
}

// models shows the aliases and the served models.
func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	httpapi.WriteJSON(w, http.StatusOK, s.modelsNow())
}

// modelsNow is what GET /admin/models shows.
func (s *Server) modelsNow() modelsJSON {
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
	return out
}

// setModels replaces the aliases: {"aliases": {"chat": {"a": 90, "b": 10},
// "small": "c"}} (the config's models: map), or the list GET shows
// ({"aliases": [{"name": "chat", "targets": [{"model": "a", "weight":
// 90}, ...]}]}; the rest of what GET shows is read-only, and ignored), so
// that what GET shows can be edited and put back. Sessions keep their
// targets while those stay targets. A target no replica serves is taken
// (its replica may not have joined yet), and said in the answer's
// warnings: its requests get a 503 until one serves it.
func (s *Server) setModels(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Aliases json.RawMessage `json:"aliases"`
		// What GET shows besides, read-only.
		Served  json.RawMessage `json:"served"`
		Unknown json.RawMessage `json:"unknown_models"`
	}
	if !httpapi.DecodeJSON(w, r, &in, maxJSON) {
		return
	}
	specs, err := aliasSpecs(in.Aliases)
	if err != nil {
		httpapi.Error(w, http.StatusBadRequest, "aliases: %v", err)
		return
	}
	aliases, err := models.ParseAliases(specs)
	if err != nil {
		httpapi.Error(w, http.StatusBadRequest, "%v", err)
		return
	}
	s.fleet.Aliases().Set(aliases)
	out := s.modelsNow()
	for _, a := range aliases {
		for _, t := range a.Targets {
			if !s.served(t.Model) {
				out.Warnings = append(out.Warnings, fmt.Sprintf("alias %s: no replica serves %s (yet): its requests for it get a 503 until one does", a.Name, t.Model))
			}
		}
	}
	s.log.Info("admin change", "who", who(r), "op", "models", "aliases", len(aliases), "warnings", len(out.Warnings))
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// served reports whether a replica serves model (as a request would name
// it: BASE:ADAPTER included), or may (its models not known), as the
// router's catalog answers a request's model.
func (s *Server) served(model string) bool {
	catalog, unknown := s.fleet.Router().Catalog()
	_, ok := catalog.Lookup(model)
	return ok || unknown > 0
}

// aliasSpecs reads the aliases of a PUT: the config's map of names to
// specs, or GET's list of aliases.
func aliasSpecs(raw json.RawMessage) (map[string]models.Spec, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New(`required: {"aliases": {"NAME": "MODEL" or {"MODEL": WEIGHT, ...}}}, or the list GET shows`)
	}
	var list []models.Alias
	if raw[0] == '[' {
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, fmt.Errorf(`want a list of {"name": ..., "targets": [{"model": ..., "weight": ...}]}: %v`, err)
		}
		specs := make(map[string]models.Spec, len(list))
		for _, a := range list {
			if _, dup := specs[a.Name]; dup {
				return nil, fmt.Errorf("alias %s given twice", a.Name)
			}
			specs[a.Name] = a.Targets
		}
		return specs, nil
	}
	var specs map[string]models.Spec
	if err := json.Unmarshal(raw, &specs); err != nil {
		return nil, err
	}
	return specs, nil
}
