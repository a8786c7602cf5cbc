package admin

import (
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/httpapi"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
)

// replicaJSON is a replica as the admin API shows it.
type replicaJSON struct {
	ID      string `json:"id"`
	URL     string `json:"url"`
	Region  string `json:"region"`
	Profile string `json:"profile,omitempty"`
	Source  string `json:"source"`
	// State is active, draining, removing, down (ejected by failures, or
	// failing its probes), unprobed (no probe has reached it yet) or
	// asleep (a client put its engine to sleep through the router).
	State    string `json:"state"`
	Failures int    `json:"failures"` // in a row
	// Ejections counts the times it was ejected (reset once it stays up),
	// EjectedUntil when the current ejection ends.
	Ejections        int        `json:"ejections"`
	EjectedUntil     *time.Time `json:"ejected_until,omitempty"`
	RTTMS            float64    `json:"rtt_ms"`
	InFlight         int        `json:"in_flight"`
	UnfinishedTokens int        `json:"unfinished_tokens"`
	BacklogTokens    int        `json:"backlog_tokens"`
	// UnheardTokens is the other routers' dispatches to it this router of
	// a mesh has not heard of yet and counts in its backlog.
	UnheardTokens    int                  `json:"unheard_tokens"`
	IndexBlocks      int                  `json:"index_blocks"`
	KVCapacityTokens int                  `json:"kv_capacity_tokens"`
	Engine           *policy.EngineGauges `json:"engine,omitempty"`
	EngineAgeS       *float64             `json:"engine_age_s,omitempty"`
	PrefillMSPerTok  float64              `json:"prefill_ms_per_token"`
	QueueMSPerTok    float64              `json:"queue_ms_per_token"`
	Decoding         int                  `json:"decoding"`
	ITLMS            float64              `json:"itl_ms"`
	ITLSlopeMS       float64              `json:"itl_slope_ms"`
	ITLSamples       int                  `json:"itl_samples"`
	// Models are the names it serves (omitted while unknown: it is taken
	// to serve any), Adapters the LoRA adapters among them; AdapterSlots
	// and ResidentAdapters its adapter slots as the router sees them.
	Models           []string `json:"models,omitempty"`
	Adapters         []string `json:"adapters,omitempty"`
	AdapterSlots     int      `json:"adapter_slots"`
	ResidentAdapters []string `json:"resident_adapters,omitempty"`
	// LackingEndpoints are the paths it answered it has no route for,
	// for which it is passed over (router.Router.Lacks).
	LackingEndpoints []string `json:"lacking_endpoints,omitempty"`
}

// state is a replica's state as an operator reads it.
func state(st router.ReplicaState) string {
	switch {
	case st.State != router.Active:
		return st.State.String()
	case !st.Healthy:
		return "down"
	case !st.Probed:
		return "unprobed"
	case st.Asleep:
		return "asleep"
	}
	return st.State.String()
}

func (s *Server) replicaJSON(st router.ReplicaState) replicaJSON {
	out := replicaJSON{ID: st.ID, Region: st.Region, State: state(st), RTTMS: float64(st.RTT.Microseconds()) / 1000,
		InFlight: st.InFlight, UnfinishedTokens: st.UnfinishedTokens, BacklogTokens: st.BacklogTokens, IndexBlocks: st.IndexBlocks,
		KVCapacityTokens: st.KVCapacityTokens, PrefillMSPerTok: st.PrefillMSPerToken, QueueMSPerTok: st.QueueMSPerToken,
		Decoding: st.Decoding, ITLMS: st.ITLBaseMS, ITLSlopeMS: st.ITLSlopeMS, ITLSamples: st.ITLSamples,
		Models: st.Models.Bases(), Adapters: st.Models.Adapters(), AdapterSlots: st.Adapters.Slots, ResidentAdapters: st.Adapters.Resident}
	out.UnheardTokens, _ = s.fleet.Router().Unheard(s.fleet.Now(), st.ID)
	if u := s.fleet.Upstream(st.ID); u != nil {
		out.URL, out.Profile, out.Source = u.URL(), u.Config().Profile, u.Source()
		var until time.Time
		out.Failures, out.Ejections, until = u.Health()
		if !until.IsZero() {
			out.EjectedUntil = &until
		}
	}
	for e, until := range st.Lacking {
		if until > s.fleet.Now() {
			out.LackingEndpoints = append(out.LackingEndpoints, e)
		}
	}
	slices.Sort(out.LackingEndpoints)
	if st.EngineKnown {
		g, age := st.Engine, (s.fleet.Now() - st.EngineAt).Seconds()
		out.Engine, out.EngineAgeS = &g, &age
	}
	return out
}

// replicas shows every replica as the router sees it.
func (s *Server) replicas(w http.ResponseWriter, r *http.Request) {
	out := []replicaJSON{}
	for _, st := range s.fleet.Router().Replicas() {
		out = append(out, s.replicaJSON(st))
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"policy": s.fleet.Policy().Name(), "replicas": out})
}

// add adds a replica: a config file's replicas: entry as JSON ({"id",
// "url", "region", "profile", "models", "adapters", "max_loras", ...}),
// but its api_key_env.
func (s *Server) add(w http.ResponseWriter, r *http.Request) {
	var in fleet.ReplicaConfig
	if !httpapi.DecodeJSON(w, r, &in, maxJSON) {
		return
	}
	if in.ID == "" {
		httpapi.Error(w, http.StatusBadRequest, "id is required")
		return
	}
	if in.APIKeyEnv != "" {
		// The replica is sent that variable's value: through the admin
		// API it would send any of the router's environment to a URL the
		// caller picks (2026-12-07, a review).
		httpapi.Error(w, http.StatusBadRequest, "api_key_env: a replica's key comes from the config file, not the admin API")
		return
	}
	err := s.fleet.Add(fleet.SourceAdmin, in)
	switch {
	case errors.Is(err, router.ErrExists):
		httpapi.Error(w, http.StatusConflict, "replica %s already exists", in.ID)
		return
	case err != nil:
		httpapi.Error(w, http.StatusBadRequest, "%v", err)
		return
	}
	s.log.Info("admin change", "who", who(r), "op", "add", "replica", in.ID, "url", in.URL)
	st, _ := s.fleet.Router().Replica(in.ID)
	httpapi.WriteJSON(w, http.StatusCreated, s.replicaJSON(st))
}

// member applies a membership change to the replica in the path.
func (s *Server) member(change func(id string) error, op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if err := change(id); err != nil {
			if errors.Is(err, router.ErrUnknown) {
				httpapi.Error(w, http.StatusNotFound, "no replica %s", id)
				return
			}
			httpapi.Error(w, http.StatusInternalServerError, "%v", err)
			return
		}
		s.log.Info("admin change", "who", who(r), "op", op, "replica", id)
		st, err := s.fleet.Router().Replica(id)
		if err != nil { // removed at once: it had nothing in flight
			httpapi.WriteJSON(w, http.StatusOK, map[string]any{"id": id, "state": "removed"})
			return
		}
		httpapi.WriteJSON(w, http.StatusOK, s.replicaJSON(st))
	}
}
