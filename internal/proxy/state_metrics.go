package proxy

import (
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/policy"
	"github.com/gorgo-llm/gorgo/internal/tune"
)

// stateCollector exports the router's view of each replica and the
// policy's weights when Prometheus scrapes, and costs nothing otherwise.
type stateCollector struct{ s *Server }

var (
	descInFlight = prometheus.NewDesc("gorgo_replica_in_flight", "Requests this router sent to the replica that have not finished.", []string{"replica"}, nil)
	descTokens   = prometheus.NewDesc("gorgo_replica_in_flight_tokens", "Prompt tokens of those requests.", []string{"replica"}, nil)
	descBacklog  = prometheus.NewDesc("gorgo_replica_backlog_tokens", "Uncached prompt tokens sent to the replica that have not produced a first token (its prefill backlog).", []string{"replica"}, nil)
	descDecoding = prometheus.NewDesc("gorgo_replica_decoding", "Requests at the replica past their first token.", []string{"replica"}, nil)
	descRTTEst   = prometheus.NewDesc("gorgo_replica_rtt_estimate_seconds", "The router's smoothed round-trip estimate to the replica (what decisions use).", []string{"replica"}, nil)
	descITL      = prometheus.NewDesc("gorgo_replica_itl_seconds", "The replica's learned inter-token latency at its current load.", []string{"replica"}, nil)
	descWeight   = prometheus.NewDesc("gorgo_policy_weight", "The routing policy's weights (for the online tuner, its incumbent's).", []string{"policy", "weight"}, nil)
)

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInFlight, descTokens, descBacklog, descDecoding, descRTTEst, descITL, descWeight} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.s.rt.Replicas() {
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, st.ID)
		}
		g(descInFlight, float64(st.InFlight))
		g(descTokens, float64(st.UnfinishedTokens))
		g(descBacklog, float64(st.BacklogTokens))
		g(descDecoding, float64(st.Decoding))
		g(descRTTEst, st.RTT.Seconds())
		g(descITL, (st.ITLBaseMS+st.ITLSlopeMS*float64(st.InFlight))/1000)
	}
	var w policy.Values
	switch p := c.s.policy.(type) {
	case *tune.Online:
		w = p.Incumbent()
	case policy.Tunable:
		w = p.Params()
	default:
		return
	}
	name := c.s.policy.Name()
	for _, k := range slices.Sorted(maps.Keys(w)) {
		ch <- prometheus.MustNewConstMetric(descWeight, prometheus.GaugeValue, w[k], name, k)
	}
}
