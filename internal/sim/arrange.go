package sim

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// Arrangements that are not a policy run in every region.
const (
	// ArrangeCentral is the paper's: every client sends to the one router,
	// in the central region, which runs CentralPolicy.
	ArrangeCentral = "central"
	// ArrangeRegionLocal: each region's router uses only its own region's
	// replicas, with the default policy among them.
	ArrangeRegionLocal = "region-local"
	// CentralPolicy is what the central router runs.
	CentralPolicy = "gorgo"
)

// IsMesh reports whether the topology has clients in several regions.
func (t Topology) IsMesh() bool { return t.Mesh != nil }

// MeshRTT returns the round trip between two regions of a mesh topology,
// and its standard deviation.
func (t Topology) MeshRTT() (func(a, b string) (time.Duration, time.Duration, error), error) {
	if t.Mesh == nil {
		return nil, fmt.Errorf("topology %s is not a mesh", t.Name)
	}
	nw, err := t.network()
	if err != nil {
		return nil, err
	}
	matrix := t.RTTMatrixMS
	if t.RTTMatrixCSV != "" {
		if matrix, err = readRTTCSV(t.RTTMatrixCSV); err != nil {
			return nil, err
		}
		for src, row := range t.RTTMatrixMS {
			if matrix[src] == nil {
				matrix[src] = map[string]float64{}
			}
			for dst, v := range row {
				matrix[src][dst] = v
			}
		}
	}
	local, ok := nw.rtt[t.RouterRegion]
	if t.Mesh.LocalRTTMS != nil {
		local, ok = *t.Mesh.LocalRTTMS, true
	}
	if !ok {
		return nil, fmt.Errorf("topology %s: mesh needs local_rtt_ms (or router_region among its regions)", t.Name)
	}
	if !validRTTMS(local) {
		return nil, fmt.Errorf("topology %s: local_rtt_ms must be from 0 to %v ms, got %v", t.Name, maxRTTMS, local)
	}
	jf := 0.25
	if t.Mesh.JitterFraction != nil {
		jf = *t.Mesh.JitterFraction
	}
	if !(jf >= 0 && jf <= 10) {
		return nil, fmt.Errorf("topology %s: jitter_fraction must be in [0, 10], got %v", t.Name, jf)
	}
	return func(a, b string) (time.Duration, time.Duration, error) {
		var ms float64
		switch {
		case a == b:
			ms = local
		case a == t.RouterRegion && hasKey(nw.rtt, b):
			ms = nw.rtt[b]
		case b == t.RouterRegion && hasKey(nw.rtt, a):
			ms = nw.rtt[a]
		case matrix[a] != nil && hasKey(matrix[a], b):
			ms = matrix[a][b]
		case matrix[b] != nil && hasKey(matrix[b], a):
			ms = matrix[b][a]
		default:
			return 0, 0, fmt.Errorf("topology %s: no round trip between %s and %s", t.Name, a, b)
		}
		if !validRTTMS(ms) {
			return 0, 0, fmt.Errorf("topology %s: the round trip between %s and %s, %v ms, is not within 0 to %v ms", t.Name, a, b, ms, maxRTTMS)
		}
		return msDuration(ms), msDuration(ms * jf), nil
	}, nil
}

// Arrangement builds a mesh run of the topology: ArrangeCentral,
// ArrangeRegionLocal, or the name of a policy that then runs in every
// router region, each router with its own view (newPolicy makes a policy
// for a router in a region). day and amplitude shape the ingress regions'
// daily curves (zero day: constant shares).
func (t Topology) Arrangement(name string, reps []Replica, sharing Sharing, day time.Duration, amplitude float64,
	newPolicy func(name, region string) (policy.Policy, error)) (*Mesh, error) {
	rtt, err := t.MeshRTT()
	if err != nil {
		return nil, err
	}
	if err := t.checkMesh(rtt); err != nil {
		return nil, err
	}
	ms := t.Mesh
	routers := ms.Routers
	if len(routers) == 0 {
		for _, in := range ms.Ingress {
			routers = append(routers, in.Region)
		}
	}
	m := &Mesh{RTT: rtt, Sharing: sharing, Day: day, Amplitude: amplitude, SpreadSessions: ms.SpreadSessions}
	switch name {
	case ArrangeCentral:
		central := ms.Central
		if central == "" {
			central = t.RouterRegion
		}
		p, err := newPolicy(CentralPolicy, central)
		if err != nil {
			return nil, err
		}
		m.Sites = []Site{{Region: central, Policy: p}}
		m.Sharing = ShareNone // one router: nothing to share
	default:
		for _, region := range routers {
			pol, local := name, []string(nil)
			if name == ArrangeRegionLocal {
				pol = policy.DefaultName
				for _, r := range reps {
					if r.Region == region {
						local = append(local, r.ID)
					}
				}
				if len(local) == 0 {
					return nil, fmt.Errorf("topology %s: region-local: no replica in %s", t.Name, region)
				}
			}
			p, err := newPolicy(pol, region)
			if err != nil {
				return nil, err
			}
			m.Sites = append(m.Sites, Site{Region: region, Policy: p, Replicas: local})
		}
	}
	for _, in := range ms.Ingress {
		// Clients send to the router in their region, else the nearest.
		best, bestRTT := -1, time.Duration(math.MaxInt64)
		for k, st := range m.Sites {
			d, _, err := rtt(in.Region, st.Region)
			if err != nil {
				return nil, err
			}
			if d < bestRTT || st.Region == in.Region {
				best, bestRTT = k, d
			}
			if st.Region == in.Region {
				break
			}
		}
		m.Ingress = append(m.Ingress, Ingress{Region: in.Region, Share: in.Share, Phase: -in.UTCOffset / 24, Site: best})
	}
	if !slices.ContainsFunc(m.Ingress, func(in Ingress) bool { return in.Share > 0 }) {
		return nil, fmt.Errorf("topology %s: the mesh's ingress shares are all zero", t.Name)
	}
	return m, nil
}

// checkMesh refuses a mesh whose regions the topology does not have, named
// twice, or clocks off the Earth's, whatever arrangement runs (a central
// router in an unknown region failed only when central ran: a
// researcher's test, 2026-12-06).
func (t Topology) checkMesh(rtt func(a, b string) (time.Duration, time.Duration, error)) error {
	if t.Mesh == nil {
		return nil
	}
	listed := map[string]bool{t.RouterRegion: true}
	for _, r := range t.Regions {
		listed[r.Name] = true
	}
	// A region of the matrix alone (clients where no replica is) is one
	// too: it has a round trip to the router's.
	known := func(r string) bool {
		if listed[r] {
			return true
		}
		_, _, err := rtt(r, t.RouterRegion)
		return err == nil
	}
	ms := t.Mesh
	if ms.Central != "" && !known(ms.Central) {
		return fmt.Errorf("topology %s: mesh: central router in unknown region %q", t.Name, ms.Central)
	}
	seen := map[string]bool{}
	for _, r := range ms.Routers {
		if !known(r) || seen[r] {
			return fmt.Errorf("topology %s: mesh: router region %q unknown or listed twice", t.Name, r)
		}
		seen[r] = true
	}
	clear(seen)
	for _, in := range ms.Ingress {
		switch {
		case !known(in.Region) || seen[in.Region]:
			return fmt.Errorf("topology %s: mesh: ingress region %q unknown or listed twice", t.Name, in.Region)
		case !(in.UTCOffset >= -12 && in.UTCOffset <= 14):
			return fmt.Errorf("topology %s: mesh: ingress %s: utc_offset_h must be from -12 to 14, got %v", t.Name, in.Region, in.UTCOffset)
		}
		seen[in.Region] = true
	}
	return nil
}
