package sim

import (
	"bytes"
	"cmp"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/models"
	"github.com/gorgo-llm/gorgo/internal/prefix"
	"github.com/gorgo-llm/gorgo/internal/yamlfile"
)

// Topology describes a fleet: regions, the router's region, the round trip
// from the router to each region, and the replicas placed in them. It is
// what a topology YAML file holds.
type Topology struct {
	Name string `yaml:"name"`
	// RouterRegion is where the router and its clients run.
	RouterRegion string   `yaml:"router_region"`
	Regions      []Region `yaml:"regions"`
	// RTTMatrixMS gives round trips (ms) between regions, for regions
	// without rtt_ms: matrix[router_region][region] (or the reverse).
	RTTMatrixMS map[string]map[string]float64 `yaml:"rtt_matrix_ms"`
	// RTTMatrixCSV is a CSV file of the same (first column: source region,
	// header row: destination regions), relative to the YAML file.
	RTTMatrixCSV string        `yaml:"rtt_matrix_csv"`
	Replicas     []ReplicaSpec `yaml:"replicas"`
	// Events change the fleet during a run.
	Events []EventSpec `yaml:"events"`
	// Mesh makes the topology a mesh: clients in several regions, and a
	// router in each (see Arrangement).
	Mesh *MeshSpec `yaml:"mesh"`
}

// MeshSpec is a mesh as a topology file gives it. Round trips between
// regions come from the topology's matrix (rtt_matrix_ms or _csv) and its
// regions' rtt_ms (from router_region); within a region, LocalRTTMS.
type MeshSpec struct {
	Ingress []IngressSpec `yaml:"ingress"`
	// Routers are the regions with a router (default: every ingress
	// region); Central is the one router of the central arrangement
	// (default router_region).
	Routers []string `yaml:"routers"`
	Central string   `yaml:"central"`
	// LocalRTTMS is a round trip within a region (default: router_region's
	// rtt_ms).
	LocalRTTMS *float64 `yaml:"local_rtt_ms"`
	// JitterFraction is a round trip's standard deviation as a fraction of
	// its mean (default 0.25, the paper's measurements' ratio).
	JitterFraction *float64 `yaml:"jitter_fraction"`
	// SpreadSessions draws every request's ingress region anew, by the
	// shares, instead of keeping a session in the one of its first
	// request: routers behind a load balancer without session affinity,
	// where a conversation's turns reach different routers.
	SpreadSessions bool `yaml:"spread_sessions"`
}

// IngressSpec is a region clients arrive in: its share of the traffic,
// and its time zone (UTC offset in hours), which shifts its daily curve.
type IngressSpec struct {
	Region    string  `yaml:"region"`
	Share     float64 `yaml:"share"`
	UTCOffset float64 `yaml:"utc_offset_h"`
}

// EventSpec is a scripted change of the fleet at a time of the run, as a
// topology file gives it: exactly one of Add, Drain, Undrain, Remove.
type EventSpec struct {
	At      time.Duration `yaml:"at"`
	Add     *ReplicaSpec  `yaml:"add"`
	Drain   string        `yaml:"drain"`
	Undrain string        `yaml:"undrain"`
	Remove  string        `yaml:"remove"`
}

// ParseEventSpec reads an event as the --fleet-event flag gives it:
// "T drain ID", "T undrain ID", "T remove ID" or
// "T add NAME region=R [profile=P] [speed=S] [models=A,B] [adapters=X,Y]
// [max_loras=N] [lora_load_time=D]", T and D Go durations.
func ParseEventSpec(s string) (EventSpec, error) {
	f := strings.Fields(s)
	bad := func(why string) (EventSpec, error) {
		return EventSpec{}, fmt.Errorf("fleet event %q: %s (want \"T drain|undrain|remove ID\" or \"T add NAME region=R [profile=P] [speed=S] [models=A,B] [adapters=X,Y] [max_loras=N] [lora_load_time=D]\")", s, why)
	}
	if len(f) < 3 {
		return bad("too few words")
	}
	at, err := time.ParseDuration(f[0])
	if err != nil || at < 0 {
		return bad("the time is not a non-negative Go duration")
	}
	e := EventSpec{At: at}
	switch op, id := f[1], f[2]; op {
	case "drain", "undrain", "remove":
		if len(f) != 3 {
			return bad("extra words")
		}
		switch op {
		case "drain":
			e.Drain = id
		case "undrain":
			e.Undrain = id
		default:
			e.Remove = id
		}
	case "add":
		spec := ReplicaSpec{Name: id, Profile: "paper"}
		for _, kv := range f[3:] {
			k, v, ok := strings.Cut(kv, "=")
			switch {
			case !ok:
				return bad(fmt.Sprintf("%q is not KEY=VALUE", kv))
			case k == "region":
				spec.Region = v
			case k == "profile":
				spec.Profile = v
			case k == "speed":
				x, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return bad("speed is not a number")
				}
				spec.Speed = &x
			case k == "models":
				spec.Models = strings.Split(v, ",")
			case k == "adapters":
				spec.Adapters = strings.Split(v, ",")
			case k == "max_loras":
				if spec.MaxLoRAs, err = strconv.Atoi(v); err != nil {
					return bad("max_loras is not an integer")
				}
			case k == "lora_load_time":
				if spec.LoRALoadTime, err = time.ParseDuration(v); err != nil {
					return bad("lora_load_time is not a Go duration")
				}
			default:
				return bad(fmt.Sprintf("unknown key %q", k))
			}
		}
		if spec.Region == "" {
			return bad("add needs region=")
		}
		e.Add = &spec
	default:
		return bad(fmt.Sprintf("unknown operation %q", op))
	}
	return e, nil
}

// Region is a place replicas run in.
type Region struct {
	Name string `yaml:"name"`
	// RTTMS is the mean round trip from the router, in ms. Nil means look
	// it up in the matrix.
	RTTMS *float64 `yaml:"rtt_ms"`
	// JitterMS is the standard deviation of the round trip, in ms.
	JitterMS float64 `yaml:"jitter_ms"`
}

// ReplicaSpec places Count replicas (default 1) of a profile in a region.
type ReplicaSpec struct {
	// Name is the replica's id; with Count > 1 replicas are Name-1, Name-2...
	// Default: the region's name.
	Name    string `yaml:"name"`
	Region  string `yaml:"region"`
	Profile string `yaml:"profile"`
	Count   *int   `yaml:"count"`
	// Speed divides every step-time coefficient of the profile: 2 is a
	// replica twice as fast (newer hardware, more GPUs). Default 1; a 0
	// given is an error, not the default.
	Speed *float64 `yaml:"speed"`
	// KVCapacityTokens, MaxRunning and ChunkTokens override the profile.
	KVCapacityTokens int `yaml:"kv_capacity_tokens"`
	MaxRunning       int `yaml:"max_running"`
	ChunkTokens      int `yaml:"chunk_tokens"`
	// Schedule overrides the profile's scheduler: mixed or prefill-first.
	Schedule string `yaml:"schedule"`
	// Models are the base models the replicas serve, Adapters the LoRA
	// adapters they serve on the first of them. None given: the replicas
	// serve any model (and the router knows nothing of their models).
	Models   []string `yaml:"models"`
	Adapters []string `yaml:"adapters"`
	// MaxLoRAs is the engines' adapter slots (vLLM's --max-loras; default
	// engine.DefaultMaxLoRAs), which the router is configured with too,
	// and LoRALoadTime what loading an adapter adds to the step that needs
	// it (a Go duration, e.g. 500ms; default 0). Both need adapters.
	MaxLoRAs     int           `yaml:"max_loras"`
	LoRALoadTime time.Duration `yaml:"lora_load_time"`
}

// Replica is one replica of a resolved fleet.
type Replica struct {
	ID      string
	Region  string
	RTT     time.Duration // mean round trip from the router
	Jitter  time.Duration // its standard deviation
	Profile engine.Profile
	// Models is what the replica serves: base models and the LoRA
	// adapters on them; nil serves any model (a request naming a model the
	// replica does not list never goes there).
	Models *models.Set
	// MaxLoRAs is its engine's adapter slots (0: the engine's default) and
	// LoRALoadTime what loading an adapter there takes.
	MaxLoRAs     int
	LoRALoadTime time.Duration
}

func ptr(v float64) *float64 { return &v }

// presets are the built-in topologies.
var presets = map[string]Topology{
	// The paper's deployment: router in us-ashburn, one SGLang replica of
	// the paper's engine per region, round trips as the router measured them.
	"paper": {
		Name:         "paper",
		RouterRegion: "us-ashburn",
		Regions: []Region{
			{Name: "us-ashburn", RTTMS: ptr(37), JitterMS: 8},
			{Name: "eu-frankfurt", RTTMS: ptr(279), JitterMS: 80},
			{Name: "ap-seoul", RTTMS: ptr(456), JitterMS: 138},
		},
		Replicas: []ReplicaSpec{
			{Region: "us-ashburn", Profile: "paper"},
			{Region: "eu-frankfurt", Profile: "paper"},
			{Region: "ap-seoul", Profile: "paper"},
		},
	},
}

func init() {
	mesh := func(name string, count int) Topology {
		t := presets["paper"]
		t.Name = name
		t.RTTMatrixMS = map[string]map[string]float64{
			// Frankfurt to Seoul: Azure's measured 217 ms scaled as the
			// paper's two measured legs are (279/93 and 456/185 ms; ×2.73).
			"eu-frankfurt": {"ap-seoul": 593},
		}
		t.Replicas = nil
		for _, r := range presets["paper"].Replicas {
			r.Count = &count
			t.Replicas = append(t.Replicas, r)
		}
		t.Mesh = &MeshSpec{Ingress: []IngressSpec{
			{Region: "us-ashburn", Share: 0.45, UTCOffset: -5},
			{Region: "eu-frankfurt", Share: 0.30, UTCOffset: 1},
			{Region: "ap-seoul", Share: 0.25, UTCOffset: 9},
		}}
		return t
	}
	// The paper's three regions with clients in each and a router in each
	// (one replica per region; two in paper-mesh-2).
	presets["paper-mesh"] = mesh("paper-mesh", 1)
	presets["paper-mesh-2"] = mesh("paper-mesh-2", 2)
}

// TopologyNames lists the built-in topologies.
func TopologyNames() []string {
	var names []string
	for n := range presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// LoadTopology returns a built-in topology by name, or reads a YAML file.
// Unknown fields in the file are errors.
func LoadTopology(nameOrFile string) (Topology, error) {
	if t, ok := presets[nameOrFile]; ok {
		return t, nil
	}
	data, err := yamlfile.ReadFile(nameOrFile)
	if err != nil {
		if os.IsNotExist(err) && !strings.ContainsAny(nameOrFile, "./") {
			return Topology{}, fmt.Errorf("unknown topology %q (valid: %s, or a YAML file)", nameOrFile, strings.Join(TopologyNames(), ", "))
		}
		return Topology{}, fmt.Errorf("reading topology: %w", err)
	}
	var t Topology
	if err := yamlfile.Decode(data, &t); err != nil {
		if err == io.EOF {
			return Topology{}, fmt.Errorf("topology %s is empty", nameOrFile)
		}
		return Topology{}, fmt.Errorf("topology %s: %w", nameOrFile, err)
	}
	if t.Name == "" {
		t.Name = strings.TrimSuffix(filepath.Base(nameOrFile), filepath.Ext(nameOrFile))
	}
	if t.RTTMatrixCSV != "" && !filepath.IsAbs(t.RTTMatrixCSV) {
		t.RTTMatrixCSV = filepath.Join(filepath.Dir(nameOrFile), t.RTTMatrixCSV)
	}
	return t, nil
}

// network is a topology's regions and round trips from the router.
type network struct {
	regions map[string]Region
	rtt     map[string]float64 // ms
}

// Resolve validates the topology and returns its replicas.
func (t Topology) Resolve() ([]Replica, error) {
	nw, err := t.network()
	if err != nil {
		return nil, err
	}
	var out []Replica
	seen := map[string]bool{}
	for _, s := range t.Replicas {
		reps, err := t.replicas(nw, s, seen)
		if err != nil {
			return nil, err
		}
		out = append(out, reps...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("topology %s: no replicas", t.Name)
	}
	return out, nil
}

// ResolveEvents returns the topology's fleet events followed by extra
// ones, sorted by time (stably), checked against the fleet they change: an
// added replica's id is new, the others name a replica present then.
func (t Topology) ResolveEvents(extra []EventSpec) ([]FleetEvent, error) {
	nw, err := t.network()
	if err != nil {
		return nil, err
	}
	specs := append(append([]EventSpec(nil), t.Events...), extra...)
	slices.SortStableFunc(specs, func(a, b EventSpec) int { return cmp.Compare(a.At, b.At) })
	reps, err := t.Resolve()
	if err != nil {
		return nil, err
	}
	present, seen := map[string]bool{}, map[string]bool{}
	for _, r := range reps {
		present[r.ID], seen[r.ID] = true, true
	}
	var out []FleetEvent
	for _, e := range specs {
		n := 0
		for _, set := range []bool{e.Add != nil, e.Drain != "", e.Undrain != "", e.Remove != ""} {
			if set {
				n++
			}
		}
		if n != 1 {
			return nil, fmt.Errorf("topology %s: fleet event at %v: want exactly one of add, drain, undrain, remove", t.Name, e.At)
		}
		if e.Add != nil {
			added, err := t.replicas(nw, *e.Add, seen)
			if err != nil {
				return nil, fmt.Errorf("fleet event at %v: %w", e.At, err)
			}
			for _, r := range added {
				present[r.ID] = true
				out = append(out, FleetEvent{At: e.At, Op: OpAdd, Replica: r})
			}
			continue
		}
		op, id := OpDrain, e.Drain
		switch {
		case e.Undrain != "":
			op, id = OpUndrain, e.Undrain
		case e.Remove != "":
			op, id = OpRemove, e.Remove
		}
		if !present[id] {
			return nil, fmt.Errorf("topology %s: fleet event at %v: %s %s: no such replica then", t.Name, e.At, op, id)
		}
		if op == OpRemove {
			delete(present, id)
		}
		out = append(out, FleetEvent{At: e.At, Op: op, ID: id})
	}
	return out, nil
}

func (t Topology) network() (network, error) {
	matrix := t.RTTMatrixMS
	if t.RTTMatrixCSV != "" {
		m, err := readRTTCSV(t.RTTMatrixCSV)
		if err != nil {
			return network{}, fmt.Errorf("topology %s: %w", t.Name, err)
		}
		for src, row := range matrix { // inline entries win
			for dst, v := range row {
				if m[src] == nil {
					m[src] = map[string]float64{}
				}
				m[src][dst] = v
			}
		}
		matrix = m
	}
	if t.RouterRegion == "" {
		return network{}, fmt.Errorf("topology %s: router_region is not set", t.Name)
	}
	regions := map[string]Region{}
	rtt := map[string]float64{}
	for _, r := range t.Regions {
		if r.Name == "" {
			return network{}, fmt.Errorf("topology %s: a region has no name", t.Name)
		}
		if _, dup := regions[r.Name]; dup {
			return network{}, fmt.Errorf("topology %s: region %q listed twice", t.Name, r.Name)
		}
		regions[r.Name] = r
		switch {
		case r.RTTMS != nil:
			rtt[r.Name] = *r.RTTMS
		case matrix[t.RouterRegion] != nil && hasKey(matrix[t.RouterRegion], r.Name):
			rtt[r.Name] = matrix[t.RouterRegion][r.Name]
		case matrix[r.Name] != nil && hasKey(matrix[r.Name], t.RouterRegion):
			rtt[r.Name] = matrix[r.Name][t.RouterRegion]
		default:
			return network{}, fmt.Errorf("topology %s: region %q has no round trip from router region %q (set rtt_ms or give a matrix)", t.Name, r.Name, t.RouterRegion)
		}
		if !validRTTMS(rtt[r.Name]) || !validRTTMS(r.JitterMS) {
			return network{}, fmt.Errorf("topology %s: region %q: round trip and jitter must be non-negative and at most %v ms", t.Name, r.Name, maxRTTMS)
		}
	}
	return network{regions: regions, rtt: rtt}, nil
}

// replicas resolves one spec, whose ids must not be in seen (they are
// added to it).
func (t Topology) replicas(nw network, s ReplicaSpec, seen map[string]bool) ([]Replica, error) {
	regions, rtt := nw.regions, nw.rtt
	reg, ok := regions[s.Region]
	if !ok {
		return nil, fmt.Errorf("topology %s: replica in unknown region %q", t.Name, s.Region)
	}
	prof, err := engine.LookupProfile(s.Profile)
	if err != nil {
		return nil, fmt.Errorf("topology %s: replica in %s: %w", t.Name, s.Region, err)
	}
	switch {
	case s.Speed != nil && !(*s.Speed > 0 && !math.IsInf(*s.Speed, 0)):
		return nil, fmt.Errorf("topology %s: replica in %s: speed must be a positive number, got %v", t.Name, s.Region, *s.Speed)
	case s.Speed != nil && *s.Speed != 1:
		prof = prof.Scaled(*s.Speed)
	}
	if s.KVCapacityTokens > 0 {
		prof.KVCapacityTokens = s.KVCapacityTokens
	}
	if s.MaxRunning > 0 {
		prof.MaxRunning = s.MaxRunning
	}
	if s.ChunkTokens > 0 {
		prof.ChunkTokens = s.ChunkTokens
	}
	if s.Schedule != "" {
		prof.Schedule = s.Schedule
	}
	if err := prof.Validate(); err != nil {
		return nil, fmt.Errorf("topology %s: replica in %s: %w", t.Name, s.Region, err)
	}
	var set *models.Set
	switch {
	case len(s.Models) > 0 || len(s.Adapters) > 0:
		if len(s.Models) == 0 {
			return nil, fmt.Errorf("topology %s: replica in %s: adapters need a base model to run on (give models:)", t.Name, s.Region)
		}
		seenModel := map[string]bool{}
		for _, n := range append(slices.Clone(s.Models), s.Adapters...) {
			if seenModel[n] {
				return nil, fmt.Errorf("topology %s: replica in %s: model %q listed twice", t.Name, s.Region, n)
			}
			seenModel[n] = true
		}
		if set, err = models.WithAdapters(s.Models, s.Adapters); err != nil {
			return nil, fmt.Errorf("topology %s: replica in %s: %w", t.Name, s.Region, err)
		}
	}
	switch {
	case s.MaxLoRAs < 0:
		return nil, fmt.Errorf("topology %s: replica in %s: max_loras must not be negative, got %d", t.Name, s.Region, s.MaxLoRAs)
	case s.LoRALoadTime < 0:
		return nil, fmt.Errorf("topology %s: replica in %s: lora_load_time must not be negative, got %v", t.Name, s.Region, s.LoRALoadTime)
	case (s.MaxLoRAs > 0 || s.LoRALoadTime > 0) && len(s.Adapters) == 0:
		return nil, fmt.Errorf("topology %s: replica in %s: max_loras and lora_load_time need adapters", t.Name, s.Region)
	}
	count := 1
	if s.Count != nil {
		if count = *s.Count; count < 1 {
			return nil, fmt.Errorf("topology %s: replica in %s: count must be at least 1, got %d", t.Name, s.Region, count)
		}
	}
	if count > prefix.MaxReplicas-len(seen) { // checked before any is built (and without a sum that wraps)
		return nil, fmt.Errorf("topology %s: more than %d replicas, the most a router holds", t.Name, prefix.MaxReplicas)
	}
	name := s.Name
	if name == "" {
		name = s.Region
	}
	var out []Replica
	for i := range count {
		id := name
		if count > 1 {
			id = fmt.Sprintf("%s-%d", name, i+1)
		}
		if seen[id] {
			return nil, fmt.Errorf("topology %s: replica id %q used twice (give replicas names)", t.Name, id)
		}
		seen[id] = true
		out = append(out, Replica{
			ID:           id,
			Region:       s.Region,
			RTT:          msDuration(rtt[s.Region]),
			Jitter:       msDuration(reg.JitterMS),
			Profile:      prof,
			Models:       set,
			MaxLoRAs:     s.MaxLoRAs,
			LoRALoadTime: s.LoRALoadTime,
		})
	}
	return out, nil
}

func hasKey(m map[string]float64, k string) bool { _, ok := m[k]; return ok }

// maxRTTMS is the longest round trip (and jitter) a topology may give, in
// ms: an hour. Past some 10^11 ms the conversion to a Duration wraps to a
// negative round trip, whose runs look valid but are not.
const maxRTTMS = 3.6e6

// validRTTMS reports whether v is a round trip or jitter a topology may
// give: not negative, at most maxRTTMS.
func validRTTMS(v float64) bool { return v >= 0 && v <= maxRTTMS }

func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// readRTTCSV reads a round-trip matrix: a header row of destination regions
// after a first cell, then one row per source region; empty cells are
// unknown pairs.
func readRTTCSV(path string) (map[string]map[string]float64, error) {
	data, err := yamlfile.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading RTT matrix: %w", err)
	}
	rows, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("reading RTT matrix %s: %w", path, err)
	}
	if len(rows) < 2 {
		return nil, fmt.Errorf("RTT matrix %s: no rows", path)
	}
	m := map[string]map[string]float64{}
	for i, row := range rows[1:] {
		src := strings.TrimSpace(row[0])
		m[src] = map[string]float64{}
		for j := 1; j < len(row) && j < len(rows[0]); j++ {
			cell := strings.TrimSpace(row[j])
			if cell == "" {
				continue
			}
			v, err := strconv.ParseFloat(cell, 64)
			if err == nil && !validRTTMS(v) {
				err = fmt.Errorf("%v is not a round trip of 0 to %v ms", v, maxRTTMS)
			}
			if err != nil {
				return nil, fmt.Errorf("RTT matrix %s:%d: column %q: %w", path, i+2, rows[0][j], err)
			}
			m[src][strings.TrimSpace(rows[0][j])] = v
		}
	}
	return m, nil
}
