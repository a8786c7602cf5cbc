package router

import (
	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/policy"
)

// Models. Each replica serves some models: base models and the LoRA
// adapters on them, as its engine lists them (SetModels, from its GET
// /v1/models) or the config says (ReplicaConfig.Models). A decision for a
// request naming a model (policy.Request.Model) sees only the replicas
// that serve it, as it sees only the available ones; a replica whose
// models are unknown is taken to serve any. The catalog is every name any
// replica of the fleet serves, whatever its state: a name outside it (with
// no replica of unknown models) is no model of the fleet's.

// catalog is the fleet's models, rebuilt when a replica's change.
type catalog struct {
	served *models.Set
	// unknown is how many replicas' models are unknown.
	unknown int
	// bases is how many base models the fleet serves (names with one
	// root are one); only is the name of the one when there is one.
	bases int
	only  string
	// base maps a name of a base served under several names to the
	// group's first name (names with no other are not in it).
	base map[string]string
}

// Catalog returns every model a replica of the fleet serves, in any state,
// and how many replicas' models are unknown (they may serve anything).
func (r *Router) Catalog() (served *models.Set, unknown int) {
	c := r.catalog.Load()
	return c.served, c.unknown
}

// rebuildCatalog publishes the catalog of fleet f. Call with fleetMu held.
func (r *Router) rebuildCatalog(f *fleet) {
	sets := make([]*models.Set, 0, len(f.members))
	unknown := 0
	for _, m := range f.members {
		if s := m.models.Load(); s != nil {
			sets = append(sets, s)
		} else {
			unknown++
		}
	}
	c := &catalog{served: models.Union(sets...), unknown: unknown}
	// A base served under several names (vLLM's --served-model-name a b)
	// is listed by its replica with one root: names one replica lists
	// with one root are one base (only on one replica: many charts mount
	// every model at the same path), and a request naming none gets the
	// name most replicas list (the first by name on a tie).
	listed := map[string]int{}
	same := map[string]string{} // a base name → another of its base, towards the group's first
	find := func(n string) string {
		for same[n] != "" {
			n = same[n]
		}
		return n
	}
	for _, s := range sets {
		byRoot := map[string]string{}
		for _, m := range s.Models() {
			if m.IsAdapter() {
				continue
			}
			listed[m.ID]++
			if m.Root == "" {
				continue
			}
			if first, ok := byRoot[m.Root]; !ok {
				byRoot[m.Root] = m.ID
			} else if a, b := find(first), find(m.ID); a != b {
				same[max(a, b)] = min(a, b)
			}
		}
	}
	best := map[string]string{}           // a group's first name → its most listed
	for _, m := range c.served.Models() { // by name
		if m.IsAdapter() {
			continue
		}
		g := find(m.ID)
		if b, ok := best[g]; !ok || listed[m.ID] > listed[b] {
			best[g] = m.ID
		}
	}
	for _, m := range c.served.Models() {
		if m.IsAdapter() {
			continue
		}
		if g := find(m.ID); g != m.ID {
			if c.base == nil {
				c.base = map[string]string{}
			}
			c.base[m.ID] = g
		}
	}
	c.bases = len(best)
	for _, name := range best {
		c.only = name
	}
	if c.bases != 1 {
		c.only = ""
	}
	r.catalog.Store(c)
}

// DefaultModel is the base model a request that names none gets: the
// fleet's only base model ("" if it serves several, or none is known), and
// how many base models the fleet serves.
func (r *Router) DefaultModel() (name string, bases int) {
	c := r.catalog.Load()
	return c.only, c.bases
}

// BaseName is the one name of the base model that model is a name of: a
// base served under several names (vLLM's --served-model-name m m-alias)
// is one engine and one prefix cache, whichever name a request uses. Any
// other name is its own.
func (r *Router) BaseName(model string) string {
	if b, ok := r.catalog.Load().base[model]; ok {
		return b
	}
	return model
}

// SetModels tells the router what a replica serves (nil: unknown, any
// model). It reports whether that changed.
func (r *Router) SetModels(id string, s *models.Set) (bool, error) {
	r.fleetMu.Lock()
	defer r.fleetMu.Unlock()
	m, err := r.member(id)
	if err != nil {
		return false, err
	}
	if m.models.Load().Equal(s) {
		return false, nil
	}
	m.models.Store(s)
	r.rebuildCatalog(r.fleet.Load())
	return true, nil
}

// DropModel takes a model (and, for a base model, its adapters) out of
// what the router believes a replica serves: it answered 404 for it. Its
// next refresh may bring it back. It reports whether the replica was
// believed to serve it.
func (r *Router) DropModel(id, model string) bool {
	r.fleetMu.Lock()
	defer r.fleetMu.Unlock()
	m, err := r.member(id)
	if err != nil {
		return false
	}
	s := m.models.Load()
	mod, ok := s.Lookup(model)
	if !ok {
		return false
	}
	m.models.Store(s.Without(mod.ID))
	r.rebuildCatalog(r.fleet.Load())
	return true
}

// ObserveAdapters records what a replica's engine reported of its
// adapters.
func (r *Router) ObserveAdapters(id string, g AdapterGauges) error {
	m, err := r.member(id)
	if err != nil {
		return err
	}
	running := g.Running
	if len(running) > maxScrapedAdapters {
		running = running[:maxScrapedAdapters]
	}
	t := &m.adapters
	t.mu.Lock()
	defer t.mu.Unlock()
	t.scraped = max(g.MaxLoRAs, 0)
	t.running = append(t.running[:0], running...)
	t.runningN = max(g.RunningCount, len(running))
	return nil
}

// adapterCost is a replica's cost of a request's adapter, in a decision.
type adapterCost struct {
	name       string
	load, wait float64
}

// adapterCost prices adapter at replica m, viewed as v, for a request of
// e expected output tokens: its load unless resident, and, when every
// slot is held, a wait of about one request's decode there (e tokens at
// the ITL it would see) for one to free.
func (r *Router) adapterCost(m *member, adapter string, v *policy.Replica, e int) adapterCost {
	wait := float64(e) * (v.ITLBaseMS + v.ITLSlopeMS*float64(v.InFlight+1))
	load, wait := m.adapterCost(adapter, r.loads.estimate(adapter), wait)
	return adapterCost{name: adapter, load: load, wait: wait}
}

// AdapterLoad is the router's estimate of an adapter's load time (ms).
func (r *Router) AdapterLoad(adapter string) float64 { return r.loads.estimate(adapter) }
