package router

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorgo-llm/gorgo/internal/models"
)

// LoRA adapters. An engine keeps at most max_lora adapters in its GPU
// slots (vLLM's --max-loras, SGLang's --max-loras-per-batch), evicting the
// least recently used one that no running request holds, and loading an
// adapter that is not resident stalls the step that needs it for the
// load's time. A request for an adapter whose slots are all held by
// requests in flight waits until one frees. The router believes an
// adapter resident at a replica when its engine last said a running
// request used it (vLLM's vllm:lora_requests_info), or when it is among
// the max_lora adapters this router sent there most recently (or has
// requests in flight there); a request for an adapter not resident costs
// its load time (configured, then learned from first tokens), and the
// wait for a slot when they are all held.

// DefaultMaxLoRAs is the adapter slots assumed of a replica whose engine
// does not report them and whose config does not say.
const DefaultMaxLoRAs = 4

// DefaultAdapterLoad is the load time assumed of an adapter before one
// was measured, when the config gives none.
const DefaultAdapterLoad = 200 * time.Millisecond

// maxAdapterUses bounds the adapters the router follows per replica.
const maxAdapterUses = 64

// maxScrapedAdapters bounds the running adapters a scrape may report.
const maxScrapedAdapters = 256

// adapterUse is one adapter's use of a replica, by this router.
type adapterUse struct {
	name     string
	inflight int32
	last     time.Duration
}

// adapterTable is what the router believes of a replica's adapter slots.
type adapterTable struct {
	mu         sync.Mutex
	uses       [maxAdapterUses]adapterUse
	n          int
	configured int // max_lora from the config (0: none)
	scraped    int // max_lora the engine reported (0: none)
	running    []string
	runningN   int // adapters the engine says are in use (SGLang reports a count)
}

func (t *adapterTable) slots() int {
	switch {
	case t.configured > 0:
		return t.configured
	case t.scraped > 0:
		return t.scraped
	}
	return DefaultMaxLoRAs
}

func (t *adapterTable) find(name string) int {
	for i := range t.n {
		if t.uses[i].name == name {
			return i
		}
	}
	return -1
}

// state says whether an adapter is believed resident, and whether a
// request for it would wait for a slot. Call with mu held.
func (t *adapterTable) state(name string) (resident, full bool) {
	slots := t.slots()
	if slices.Contains(t.running, name) {
		return true, false
	}
	busy := 0
	for i := range t.n {
		if t.uses[i].inflight > 0 {
			busy++
		}
	}
	busy = max(busy, t.runningN)
	i := t.find(name)
	if i < 0 {
		return false, busy >= slots
	}
	u := &t.uses[i]
	if u.inflight > 0 {
		return true, false
	}
	// Resident if fewer than slots adapters were used more recently (or
	// are in use).
	newer := 0
	for j := range t.n {
		if j != i && (t.uses[j].inflight > 0 || t.uses[j].last > u.last) {
			newer++
		}
	}
	return newer < slots, busy >= slots
}

// start records a request for the adapter entering the replica at now.
func (t *adapterTable) start(name string, now time.Duration) (followed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := t.find(name)
	if i < 0 {
		if t.n < maxAdapterUses {
			i = t.n
			t.n++
		} else {
			// Forget the least recently used adapter with nothing in flight.
			for j := range t.n {
				if t.uses[j].inflight == 0 && (i < 0 || t.uses[j].last < t.uses[i].last) {
					i = j
				}
			}
			if i < 0 {
				return false // every one busy: this one goes unfollowed
			}
		}
		t.uses[i] = adapterUse{name: name}
	}
	t.uses[i].inflight++
	t.uses[i].last = now
	return true
}

// end records a request for the adapter leaving the replica. (Its
// recency stays its last request's dispatch.)
func (t *adapterTable) end(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := t.find(name); i >= 0 && t.uses[i].inflight > 0 {
		t.uses[i].inflight--
	}
}

// AdapterGauges are what an engine's /metrics say of its adapters.
type AdapterGauges struct {
	// MaxLoRAs is its adapter slots (0: not reported).
	MaxLoRAs int
	// Running are the adapters its running requests use (vLLM), and
	// RunningCount how many there are (SGLang reports only the count).
	Running      []string
	RunningCount int
}

// AdapterState is a replica's adapters as the router sees them.
type AdapterState struct {
	// Slots is the max_lora the router respects (configured, reported, or
	// DefaultMaxLoRAs).
	Slots int `json:"slots"`
	// Resident are the adapters believed loaded there, most recent first;
	// InFlight how many of this router's requests use each of them.
	Resident []string `json:"resident,omitempty"`
	InFlight []int    `json:"in_flight,omitempty"`
	// Running are the adapters the engine last said its running requests
	// use.
	Running []string `json:"running,omitempty"`
}

func (t *adapterTable) snapshot() AdapterState {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := AdapterState{Slots: t.slots(), Running: slices.Clone(t.running)}
	idx := make([]int, t.n)
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		ua, ub := &t.uses[a], &t.uses[b]
		switch {
		case (ua.inflight > 0) != (ub.inflight > 0):
			if ua.inflight > 0 {
				return -1
			}
			return 1
		case ua.last != ub.last:
			if ua.last > ub.last {
				return -1
			}
			return 1
		}
		return 0
	})
	for _, i := range idx {
		if res, _ := t.state(t.uses[i].name); res {
			st.Resident = append(st.Resident, t.uses[i].name)
			st.InFlight = append(st.InFlight, int(t.uses[i].inflight))
		}
	}
	return st
}

// adapterLoads are the router's load-time estimates, per adapter: the
// configured prior, then an EWMA of how much later than the model first
// tokens came when the adapter had to be loaded.
type adapterLoads struct {
	prior   map[string]float64 // ms, by adapter (configured)
	def     float64            // ms, for the others
	mu      sync.Mutex         // serialises adding an adapter
	learned atomic.Pointer[map[string]*atomic.Uint64]
}

// loadAlpha weighs one measured load in an adapter's estimate.
const loadAlpha = 0.3

// maxLoadMS bounds a measured load (a stuck request is not a load).
const maxLoadMS = 120_000

func newAdapterLoads(def time.Duration, prior map[string]time.Duration) *adapterLoads {
	a := &adapterLoads{def: ms(def), prior: map[string]float64{}}
	if def <= 0 {
		a.def = ms(DefaultAdapterLoad)
	}
	for k, v := range prior {
		a.prior[k] = ms(v)
	}
	a.learned.Store(&map[string]*atomic.Uint64{})
	return a
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// estimate is an adapter's load time (ms). It allocates nothing.
func (a *adapterLoads) estimate(name string) float64 {
	if v, ok := (*a.learned.Load())[name]; ok {
		return math.Float64frombits(v.Load())
	}
	if v, ok := a.prior[name]; ok {
		return v
	}
	return a.def
}

// observe folds in a measured load of the adapter (ms).
func (a *adapterLoads) observe(name string, loadMS float64) {
	if math.IsNaN(loadMS) {
		return
	}
	loadMS = min(max(loadMS, 0), maxLoadMS)
	v, ok := (*a.learned.Load())[name]
	if !ok {
		a.mu.Lock()
		cur := *a.learned.Load()
		if v, ok = cur[name]; !ok {
			if len(cur) >= models.MaxPerReplica*4 {
				a.mu.Unlock()
				return // bounded: a hostile fleet's names stop being learned
			}
			next := make(map[string]*atomic.Uint64, len(cur)+1)
			for k, x := range cur {
				next[k] = x
			}
			v = new(atomic.Uint64)
			v.Store(math.Float64bits(a.estimate(name)))
			next[name] = v
			a.learned.Store(&next)
		}
		a.mu.Unlock()
	}
	for {
		old := v.Load()
		e := math.Float64frombits(old)
		e += loadAlpha * (loadMS - e)
		if v.CompareAndSwap(old, math.Float64bits(e)) {
			return
		}
	}
}
