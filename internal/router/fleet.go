package router

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/prefix"
)

// MaxReplicas is the most replicas a router holds at once.
const MaxReplicas = prefix.MaxReplicas

// Errors of membership changes.
var (
	ErrExists  = errors.New("replica id already in the fleet")
	ErrUnknown = errors.New("no replica with that id")
)

// fleet is an immutable snapshot of the membership: decisions load it
// through an atomic pointer; changes build the next one under fleetMu.
type fleet struct {
	members []*member // in the order they joined
	byID    map[string]*member
}

func (f *fleet) with(m *member) *fleet {
	n := &fleet{members: make([]*member, 0, len(f.members)+1), byID: make(map[string]*member, len(f.byID)+1)}
	n.members = append(append(n.members, f.members...), m)
	for k, v := range f.byID {
		n.byID[k] = v
	}
	n.byID[m.id] = m
	return n
}

func (f *fleet) without(m *member) *fleet {
	n := &fleet{members: make([]*member, 0, len(f.members)), byID: make(map[string]*member, len(f.byID))}
	for _, o := range f.members {
		if o != m {
			n.members = append(n.members, o)
			n.byID[o.id] = o
		}
	}
	return n
}

func validReplica(rc ReplicaConfig) error {
	switch {
	case rc.ID == "":
		return errors.New("router: a replica has no id")
	case rc.KVCapacityTokens < 0:
		return fmt.Errorf("router: replica %s: negative KV capacity", rc.ID)
	}
	for _, v := range []float64{rc.PrefillMSPerToken, rc.QueueMSPerToken} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("router: replica %s: rates must be finite and non-negative", rc.ID)
		}
	}
	return nil
}

// Add brings a replica into the fleet, active and healthy but not yet
// available: decisions take it once a probe has reached it (ObserveRTT),
// and a FleetWatcher hears of it then (a booting engine may take minutes
// to answer: a learner's measurement meanwhile is of the fleet without
// it). Nothing about the other replicas changes. It fails with ErrExists
// if the id is taken (also by a replica still draining out).
func (r *Router) Add(rc ReplicaConfig) error { return r.add(rc, true) }

func (r *Router) add(rc ReplicaConfig, added bool) error {
	if err := validReplica(rc); err != nil {
		return err
	}
	r.fleetMu.Lock()
	defer r.fleetMu.Unlock()
	f := r.fleet.Load()
	if _, ok := f.byID[rc.ID]; ok {
		return fmt.Errorf("router: replica %s: %w", rc.ID, ErrExists)
	}
	if len(f.members) >= MaxReplicas {
		return fmt.Errorf("router: replica %s: the fleet already holds %d replicas, the most a router tracks", rc.ID, MaxReplicas)
	}
	r.ixMu.Lock()
	slot, err := r.index.AddReplica(rc.KVCapacityTokens)
	r.ixMu.Unlock()
	if err != nil {
		return fmt.Errorf("router: replica %s: %w", rc.ID, err)
	}
	m := newMember(rc, slot, r.cfg.RTTAlpha, r.cfg.OnlineRates)
	m.decisions = &r.decisions
	m.added = added
	f = f.with(m)
	r.fleet.Store(f)
	r.rebuildCatalog(f)
	return nil
}

func (r *Router) member(id string) (*member, error) {
	m, ok := r.fleet.Load().byID[id]
	if !ok {
		return nil, fmt.Errorf("router: replica %s: %w", id, ErrUnknown)
	}
	return m, nil
}

// Drain stops new requests to a replica; its requests in flight finish. A
// replica being removed stays so (it is draining already).
func (r *Router) Drain(id string) error {
	r.fleetMu.Lock()
	defer r.fleetMu.Unlock()
	m, err := r.member(id)
	if err == nil {
		m.state.CompareAndSwap(int32(Active), int32(Draining))
	}
	return err
}

// Undrain makes a draining replica active again; it also takes back a
// replica being removed, which then stays.
func (r *Router) Undrain(id string) error {
	r.fleetMu.Lock()
	defer r.fleetMu.Unlock()
	m, err := r.member(id)
	if err == nil {
		m.state.Store(int32(Active))
	}
	return err
}

// Remove drains a replica, which leaves once its last request in flight
// finishes (at once if it has none): nothing in flight is cut. Until then
// it is listed as removing, and its id stays taken.
func (r *Router) Remove(id string) error {
	r.fleetMu.Lock()
	m, err := r.member(id)
	if err == nil {
		m.state.Store(int32(Removing))
	}
	r.fleetMu.Unlock()
	if err != nil {
		return err
	}
	// A Dispatch that raced with the store above either saw Removing and
	// backed out, or entered its request before this load sees it (both
	// sides store, then load: sequentially consistent atomics).
	if m.inflight.Load() == 0 {
		r.leave(m)
	}
	return nil
}

// leave takes a removing replica out of the fleet and frees its share of
// the index. It is called when a removing replica has nothing in flight,
// possibly more than once.
func (r *Router) leave(m *member) {
	r.fleetMu.Lock()
	f := r.fleet.Load()
	if f.byID[m.id] != m || State(m.state.Load()) != Removing || m.inflight.Load() != 0 {
		r.fleetMu.Unlock()
		return // already gone, taken back, or busy again
	}
	r.detach(f, m)
}

// Detach takes a replica out of the fleet at once, without waiting for its
// requests in flight: they finish against its old record, which decisions
// no longer see. It is for a replica replaced by a new one of the same id
// (its address changed), which Add may bring in right after. (Remove is
// the way out that waits for them.)
func (r *Router) Detach(id string) error {
	r.fleetMu.Lock()
	m, err := r.member(id)
	if err != nil {
		r.fleetMu.Unlock()
		return err
	}
	m.state.Store(int32(Removing))
	r.detach(r.fleet.Load(), m)
	return nil
}

// detach publishes the fleet without m, releases fleetMu, and frees m's
// share of the index. Call with fleetMu held.
func (r *Router) detach(f *fleet, m *member) {
	// gone before its slot can go to another replica; under newsMu, as
	// ObserveRTT's first probe, so that one racing its leaving makes the
	// news in order or none: "added" then "left", or nothing for a
	// replica no decision could take.
	r.newsMu.Lock()
	m.gone.Store(true)
	probed := m.probed.Load()
	f = f.without(m)
	r.fleet.Store(f)
	r.rebuildCatalog(f)
	r.fleetMu.Unlock()
	if probed { // one never probed took no decision: nothing changed
		r.fleetChanged(policy.FleetChange{Why: "replica " + m.id + " left"})
	}
	r.newsMu.Unlock()
	// Clear the slot in pieces so decisions (which take the index's read
	// lock) are not held up by a large cache; it is nobody's meanwhile.
	for {
		r.ixMu.Lock()
		more := r.index.ClearSome(m.slot, clearBatch)
		if !more {
			r.index.RemoveReplica(m.slot)
		}
		r.ixMu.Unlock()
		if !more {
			return
		}
	}
}

// clearBatch is how many blocks a replica's share of the index loses per
// hold of the index lock when it is cleared.
const clearBatch = 4096

// clearIndex clears what the index believes a replica holds, in pieces.
func (r *Router) clearIndex(m *member) {
	for {
		r.ixMu.Lock()
		more := !m.gone.Load() && r.index.ClearSome(m.slot, clearBatch)
		r.ixMu.Unlock()
		if !more {
			return
		}
	}
}

// Reconfigure changes what the router was told about a replica, keeping
// everything it observed: its region, its KV capacity (its share of the
// index is resized), its models if given, its adapter slots and, unless
// rates are learned online, its rates.
func (r *Router) Reconfigure(rc ReplicaConfig) error {
	if err := validReplica(rc); err != nil {
		return err
	}
	m, err := r.member(rc.ID)
	if err != nil {
		return err
	}
	m.region.Store(&rc.Region)
	if rc.Models != nil {
		if _, err := r.SetModels(rc.ID, rc.Models); err != nil {
			return err
		}
	}
	m.adapters.mu.Lock()
	m.adapters.configured = max(rc.MaxLoRAs, 0)
	m.adapters.mu.Unlock()
	if m.rates == nil {
		m.setRates(rc.PrefillMSPerToken, rc.QueueMSPerToken)
	}
	return r.SetKVCapacity(rc.ID, rc.KVCapacityTokens)
}

// ClearCache clears what the index believes a replica holds (its engine
// restarted, with an empty cache).
func (r *Router) ClearCache(id string) error {
	m, err := r.member(id)
	if err == nil {
		m.emptied.Add(1) // before the index: a request sent before it is not credited after it
		r.clearIndex(m)
	}
	return err
}

// Current reports whether t's replica is still the one the fleet has
// under its id: not replaced since by a new one of the same id (Detach),
// whose health the old one's attempts say nothing of.
func (r *Router) Current(t *Ticket) bool {
	m, err := r.member(t.ID)
	return err == nil && m == t.m
}

// IDs returns the ids of the fleet's replicas, in any state, sorted.
func (r *Router) IDs() []string {
	f := r.fleet.Load()
	ids := make([]string, 0, len(f.members))
	for _, m := range f.members {
		ids = append(ids, m.id)
	}
	slices.Sort(ids)
	return ids
}

// Has reports whether a replica of that id is in the fleet (in any state).
func (r *Router) Has(id string) bool {
	_, ok := r.fleet.Load().byID[id]
	return ok
}

// Len returns the number of replicas in the fleet, in any state.
func (r *Router) Len() int { return len(r.fleet.Load().members) }
