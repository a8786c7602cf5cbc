package engine

import "slices"

// LoRA adapters, as vLLM and SGLang keep them: at most maxLoRAs adapters
// are resident in the GPU's slots; an adapter used by a running request is
// pinned there; admitting a request whose adapter is not resident loads it
// into a free slot, or in place of the least recently used unpinned one,
// and the step that admits it waits for the load. A waiting request whose
// adapter cannot be made resident (every slot pinned) is skipped, and
// admission goes on with the requests behind it (vLLM V1's
// skipped_waiting_requests). As in vLLM, it can wait as long as requests
// for the resident adapters keep coming: a router that spreads an
// adapter's requests over many replicas pays for it in such waits, beside
// the loads.

// DefaultMaxLoRAs is the adapter slots of a Config without MaxLoRAs.
const DefaultMaxLoRAs = 4

// lora is one resident adapter.
type lora struct {
	id   uint64
	pins int32 // running requests using it
}

// loraOK reports whether an adapter is resident or can be made so: a slot
// is free, or some resident adapter is unpinned.
func (e *Engine) loraOK(id uint64) bool {
	if len(e.loras) < e.maxLoRAs {
		return true
	}
	for _, l := range e.loras {
		if l.id == id || l.pins == 0 {
			return true
		}
	}
	return false
}

// useLoRA pins an admitted request's adapter, loading it first if it is
// not resident (loraOK must have said it can be), and reports whether it
// loaded it. e.loras is kept least recently used first: the adapter moves
// to its end.
func (e *Engine) useLoRA(id uint64) (loaded bool) {
	e.g.AdapterRequests++
	if i := e.findLoRA(id); i >= 0 {
		l := e.loras[i]
		l.pins++
		e.touchLoRA(i, l)
		return false
	}
	e.g.AdapterLoads++
	e.loads++
	if len(e.loras) == e.maxLoRAs {
		victim := slices.IndexFunc(e.loras, func(l lora) bool { return l.pins == 0 })
		if victim < 0 {
			panic("engine: adapter load with every slot pinned")
		}
		e.loras = slices.Delete(e.loras, victim, victim+1)
	}
	e.loras = append(e.loras, lora{id: id, pins: 1})
	return true
}

// unpinLoRA is a running request with the adapter leaving: the adapter
// was used until now.
func (e *Engine) unpinLoRA(id uint64) {
	i := e.findLoRA(id)
	if i < 0 {
		panic("engine: a running request's adapter is not resident")
	}
	l := e.loras[i]
	l.pins--
	e.touchLoRA(i, l)
}

// touchLoRA stores l, the adapter at i, as the most recently used.
func (e *Engine) touchLoRA(i int, l lora) {
	copy(e.loras[i:], e.loras[i+1:])
	e.loras[len(e.loras)-1] = l
}

func (e *Engine) findLoRA(id uint64) int {
	for i, l := range e.loras {
		if l.id == id {
			return i
		}
	}
	return -1
}

// MaxLoRAs returns the engine's adapter slots.
func (e *Engine) MaxLoRAs() int { return e.maxLoRAs }

// ResidentAdapters appends the resident adapters to dst, most recently
// used first (an adapter is used when a request with it is admitted and
// when one leaves the running batch).
func (e *Engine) ResidentAdapters(dst []uint64) []uint64 {
	for i := len(e.loras) - 1; i >= 0; i-- {
		dst = append(dst, e.loras[i].id)
	}
	return dst
}

// Adapters appends the distinct adapters of the running requests to
// running and those of the waiting requests to waiting, each in
// increasing order (an adapter may be in both). Base-model requests
// (Adapter 0) have none.
func (e *Engine) Adapters(running, waiting []uint64) ([]uint64, []uint64) {
	n := len(running)
	for _, s := range e.running {
		if s.Adapter != 0 {
			running = append(running, s.Adapter)
		}
	}
	running = distinct(running, n)
	n = len(waiting)
	for _, s := range e.waiting[e.wHead:] {
		if s.Adapter != 0 {
			waiting = append(waiting, s.Adapter)
		}
	}
	return running, distinct(waiting, n)
}

// distinct sorts ids[from:] and drops its duplicates.
func distinct(ids []uint64, from int) []uint64 {
	tail := ids[from:]
	slices.Sort(tail)
	return ids[:from+len(slices.Compact(tail))]
}
