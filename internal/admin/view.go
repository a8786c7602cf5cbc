package admin

import (
	"cmp"
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/gorgo-llm/gorgo/internal/fleet"
	"github.com/gorgo-llm/gorgo/internal/httpapi"
	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/router"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// The live view of the fleet (/admin/ui): a page, embedded, and a stream of
// JSON snapshots pushed once a second to each page open. The View keeps a
// second-by-second history of 15 minutes and the last 50 decisions
// whether anybody watches or not (a few hundred bytes a second); building
// and sending snapshots happens only for the pages open.

//go:embed ui
var uiFiles embed.FS

const (
	historyPoints = 15 * 60 // one a second
	lastDecisions = 50
)

// View is the live view's state: the fleet's lifecycle.Tap (give it to
// fleet.Options.Tap) and the history the page draws.
type View struct {
	mu sync.Mutex
	// This second's requests.
	ok, errs  int
	perRep    map[string]int
	ttft, e2e []float64            // ms
	repTTFT   map[string][]float64 // ms, by replica
	// The history and the last decisions.
	points    []point
	decisions []decision
	nextID    uint64
	// Open pages, each told of a new point.
	watchers map[chan struct{}]bool
}

type point struct {
	T        int64              `json:"t"` // unix seconds
	RPS      float64            `json:"rps"`
	Errors   float64            `json:"errors"`
	TTFT50   *float64           `json:"ttft_p50_ms"`
	TTFT95   *float64           `json:"ttft_p95_ms"`
	E2E95    *float64           `json:"e2e_p95_ms"`
	RepTTFT  map[string]float64 `json:"ttft_p95_ms_by_replica"`
	Share    map[string]float64 `json:"share"`
	Weights  policy.Values      `json:"weights,omitempty"`
	Accepted int                `json:"tuner_accepted"`
	Judged   int                `json:"tuner_judged"`
}

type decision struct {
	ID           uint64      `json:"id"`
	At           time.Time   `json:"at"`
	PromptTokens int         `json:"prompt_tokens"`
	Expected     int         `json:"expected_output_tokens"`
	Chosen       string      `json:"chosen"`
	Model        string      `json:"model,omitempty"`
	Adapter      string      `json:"adapter,omitempty"`
	Candidates   []candidate `json:"candidates"`
	TTFTMS       *float64    `json:"ttft_ms"`
	Status       int         `json:"status,omitempty"`
}

type candidate struct {
	ID     string       `json:"id"`
	Cached int          `json:"cached_tokens"`
	Terms  policy.Terms `json:"terms"`
}

// NewView returns an empty live view.
func NewView() *View {
	return &View{perRep: map[string]int{}, repTTFT: map[string][]float64{}, watchers: map[chan struct{}]bool{}}
}

// Decided records a request's decision (lifecycle.Tap).
func (d *View) Decided(at time.Time, req *policy.Request, chosen *router.Ticket, fallbacks []router.Candidate) uint64 {
	dec := decision{At: at, PromptTokens: req.PromptTokens, Expected: req.ExpectedOutputTokens, Chosen: chosen.ID,
		Model: req.Model, Adapter: chosen.Adapter, Candidates: make([]candidate, 0, 1+len(fallbacks))}
	dec.Candidates = append(dec.Candidates, candidate{ID: chosen.ID, Cached: chosen.EstCachedTokens, Terms: chosen.Terms})
	for _, f := range fallbacks {
		dec.Candidates = append(dec.Candidates, candidate{ID: f.ID, Cached: f.EstCachedTokens, Terms: f.Terms})
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nextID++
	dec.ID = d.nextID
	if len(d.decisions) == lastDecisions {
		copy(d.decisions, d.decisions[1:])
		d.decisions = d.decisions[:lastDecisions-1]
	}
	d.decisions = append(d.decisions, dec)
	return dec.ID
}

// Ended records a request's end (lifecycle.Tap).
func (d *View) Ended(id uint64, replica string, status int, ttft, e2e time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if status == http.StatusOK {
		d.ok++
		if ttft > 0 && len(d.ttft) < 4096 {
			v := float64(ttft.Microseconds()) / 1000
			d.ttft = append(d.ttft, v)
			if rs := d.repTTFT[replica]; len(rs) < 1024 {
				d.repTTFT[replica] = append(rs, v)
			}
		}
		if len(d.e2e) < 4096 {
			d.e2e = append(d.e2e, float64(e2e.Microseconds())/1000)
		}
	} else {
		d.errs++
	}
	if replica != "" {
		d.perRep[replica]++
	}
	for i := len(d.decisions) - 1; i >= 0; i-- {
		if d.decisions[i].ID == id {
			if ttft > 0 {
				v := float64(ttft.Microseconds()) / 1000
				d.decisions[i].TTFTMS = &v
			}
			d.decisions[i].Status = status
			break
		}
	}
}

// tick closes a second: its point joins the history and open pages hear.
func (d *View) tick(now time.Time, w policy.Values, judged, accepted int) {
	d.mu.Lock()
	p := point{T: now.Unix(), RPS: float64(d.ok + d.errs), Errors: float64(d.errs), Share: map[string]float64{}, Weights: w, Judged: judged, Accepted: accepted}
	if n := d.ok + d.errs; n > 0 {
		for id, c := range d.perRep {
			p.Share[id] = float64(c) / float64(n)
		}
	}
	p.TTFT50, p.TTFT95, p.E2E95 = quantile(d.ttft, 0.5), quantile(d.ttft, 0.95), quantile(d.e2e, 0.95)
	if len(d.repTTFT) > 0 {
		p.RepTTFT = map[string]float64{}
		for id, v := range d.repTTFT {
			if q := quantile(v, 0.95); q != nil {
				p.RepTTFT[id] = *q
			}
		}
		clear(d.repTTFT)
	}
	d.ok, d.errs, d.ttft, d.e2e = 0, 0, d.ttft[:0], d.e2e[:0]
	clear(d.perRep)
	if len(d.points) == historyPoints {
		copy(d.points, d.points[1:])
		d.points = d.points[:historyPoints-1]
	}
	d.points = append(d.points, p)
	for ch := range d.watchers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	d.mu.Unlock()
}

func quantile(v []float64, q float64) *float64 {
	if len(v) == 0 {
		return nil
	}
	slices.Sort(v)
	x := v[min(len(v)-1, int(q*float64(len(v))))]
	return &x
}

// run closes a second every second until stop is closed.
func (d *View) run(stop <-chan struct{}, p policy.Policy) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			judged, accepted := 0, 0
			if o, ok := p.(*tune.Online); ok {
				judged, accepted = o.Counts()
			}
			d.tick(now, fleet.Params(p), judged, accepted)
		}
	}
}

// uiReplica is a replica as the page shows it.
type uiReplica struct {
	ID       string  `json:"id"`
	Region   string  `json:"region"`
	State    string  `json:"state"`
	RTTMS    float64 `json:"rtt_ms"`
	InFlight int     `json:"in_flight"`
	Tokens   int     `json:"tokens"`
	Backlog  int     `json:"backlog"`
	Decoding int     `json:"decoding"`
	Running  int     `json:"running"`
	Waiting  int     `json:"waiting"`
	KVUsed   int     `json:"kv_used_tokens"`
	KVCap    int     `json:"kv_capacity_tokens"`
	HitRate  float64 `json:"cache_hit_rate"`
	Share    float64 `json:"share_1m"`
	// Models it serves (adapters as NAME@BASE; empty while unknown), and
	// the adapters believed resident there.
	Models   string   `json:"models"`
	Resident []string `json:"resident_adapters,omitempty"`
}

// maxUIReplicas is the most replicas the page lists: of a larger fleet,
// the busiest (the map shows every region: uiRegions).
const maxUIReplicas = 200

// uiRegion is a region as the page's map shows it, summed here so that
// the map shows the whole of a fleet whose replicas are not all listed.
type uiRegion struct {
	Replicas int     `json:"replicas"`
	Down     int     `json:"down"` // not active
	RTTMS    float64 `json:"rtt_ms"`
	Share    float64 `json:"share_1m"`
}

// uiRegions sums the replicas by region: how many, how many not active,
// their mean round trip and their share of the last minute's requests.
func uiRegions(reps []uiReplica) map[string]*uiRegion {
	out := map[string]*uiRegion{}
	for _, r := range reps {
		g := out[r.Region]
		if g == nil {
			g = &uiRegion{}
			out[r.Region] = g
		}
		g.Replicas++
		g.RTTMS += r.RTTMS
		g.Share += r.Share
		if r.State != "active" {
			g.Down++
		}
	}
	for _, g := range out {
		g.RTTMS /= float64(g.Replicas)
	}
	return out
}

// snapshot is what the page gets: the fleet now, the history (whole on
// the first message, then new points), the last decisions, the tuner.
func (s *Server) snapshot(since int64) map[string]any {
	d := s.view
	d.mu.Lock()
	var pts []point
	for _, p := range d.points {
		if p.T > since {
			pts = append(pts, p)
		}
	}
	// The last minute's share per replica.
	share, total := map[string]float64{}, 0.0
	for _, p := range d.points[max(0, len(d.points)-60):] {
		for id, v := range p.Share {
			share[id] += v * p.RPS
		}
		total += p.RPS
	}
	decs := slices.Clone(d.decisions)
	d.mu.Unlock()
	var reps []uiReplica
	for _, st := range s.fleet.Router().Replicas() {
		r := uiReplica{ID: st.ID, Region: st.Region, State: state(st), RTTMS: float64(st.RTT.Microseconds()) / 1000, InFlight: st.InFlight, Tokens: st.UnfinishedTokens,
			Backlog: st.BacklogTokens, Decoding: st.Decoding, KVCap: st.KVCapacityTokens, Models: st.Models.String(), Resident: st.Adapters.Resident}
		if st.EngineKnown {
			r.Running, r.Waiting, r.KVUsed, r.HitRate = st.Engine.Running, st.Engine.Waiting, st.Engine.KVUsedTokens, st.Engine.CacheHitRate
		}
		if total > 0 {
			r.Share = share[st.ID] / total
		}
		reps = append(reps, r)
	}
	out := map[string]any{"policy": s.fleet.Policy().Name(), "points": pts, "decisions": decs, "replica_count": len(reps), "regions": uiRegions(reps)}
	if len(reps) > maxUIReplicas {
		// A large fleet: its busiest replicas listed (the page shows
		// them all) rather than every replica to every page each second
		// (2026-12-07, a user's test: 137 KB a second for 500 replicas).
		slices.SortStableFunc(reps, func(a, b uiReplica) int {
			return cmp.Or(cmp.Compare(b.InFlight, a.InFlight), cmp.Compare(b.Share, a.Share), cmp.Compare(a.ID, b.ID))
		})
		reps = reps[:maxUIReplicas]
	}
	sort.SliceStable(reps, func(i, j int) bool { return reps[i].Region < reps[j].Region })
	out["replicas"] = reps
	if o, ok := s.fleet.Policy().(*tune.Online); ok {
		out["tuner"] = map[string]any{"paused": o.Paused(), "steps": tunerSteps(o, 50), "round": roundOf(o)}
	}
	return out
}

// viewWriteTimeout is how long a live view's client may take to take one
// snapshot.
var viewWriteTimeout = 10 * time.Second

// uiStream pushes a snapshot to the page every second, as Server-Sent
// Events (read with fetch, so that it carries the admin token).
func (s *Server) uiStream(w http.ResponseWriter, r *http.Request) {
	if _, ok := w.(http.Flusher); !ok || s.view == nil {
		httpapi.Error(w, http.StatusNotFound, "no live view here")
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	ch := make(chan struct{}, 1)
	s.view.mu.Lock()
	s.view.watchers[ch] = true
	s.view.mu.Unlock()
	defer func() {
		s.view.mu.Lock()
		delete(s.view.watchers, ch)
		s.view.mu.Unlock()
	}()
	var since int64
	rc := http.NewResponseController(w)
	send := func() bool {
		snap := s.snapshot(since)
		if pts, _ := snap["points"].([]point); len(pts) > 0 {
			since = pts[len(pts)-1].T
		}
		data, err := json.Marshal(snap)
		if err != nil {
			return false
		}
		// A client that takes none of a snapshot within viewWriteTimeout
		// (it stopped reading) is dropped, not waited for with it in hand.
		_ = rc.SetWriteDeadline(time.Now().Add(viewWriteTimeout))
		if _, err := w.Write(append(append([]byte("data: "), data...), '\n', '\n')); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !send() {
		return
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.quit:
			return
		case <-ch:
			if !send() {
				return
			}
		}
	}
}

// uiAssets serves the page's files (no data in them: no token needed).
func uiAssets() http.Handler {
	sub, _ := fs.Sub(uiFiles, "ui")
	return http.StripPrefix("/admin/ui/", http.FileServer(http.FS(sub)))
}
