package fleet

import (
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// metrics are the fleet's series of the replicas (requests' series are
// the lifecycle's).
type metrics struct {
	scrapeErrors *prometheus.CounterVec
	healthy, rtt *prometheus.GaugeVec
	ejections    *prometheus.CounterVec
	restarts     *prometheus.CounterVec
	foreign      *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		scrapeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_scrape_errors_total",
			Help: "Failed scrapes of a replica's engine metrics."}, []string{"replica"}),
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gorgo_replica_healthy",
			Help: "1 if the replica is up (probed and not marked down)."}, []string{"replica"}),
		rtt: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gorgo_replica_rtt_seconds",
			Help: "The last probe's round trip to the replica."}, []string{"replica"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_replica_ejections_total",
			Help: "Times a replica was ejected as an outlier (consecutive failures or a failure rate of half its recent requests)."}, []string{"replica"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_replica_restarts_total",
			Help: "Engine restarts seen in a replica's metrics (its process start time changed or its counters went back)."}, []string{"replica"}),
		foreign: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gorgo_replica_foreign_requests",
			Help: "Requests the replica's engine reported at the last scrape (running and waiting) beyond those this router, and its mesh peers, have in flight there: load from elsewhere that decisions do not count."}, []string{"replica"}),
	}
	reg.MustRegister(m.scrapeErrors, m.healthy, m.rtt, m.ejections, m.restarts, m.foreign)
	return m
}

// forget drops a replica's series (it left the fleet).
func (m *metrics) forget(id string) {
	m.scrapeErrors.DeleteLabelValues(id)
	m.healthy.DeleteLabelValues(id)
	m.rtt.DeleteLabelValues(id)
	m.ejections.DeleteLabelValues(id)
	m.restarts.DeleteLabelValues(id)
	m.foreign.DeleteLabelValues(id)
}

// stateCollector exports the router's view of each replica and the
// policy's parameters when Prometheus scrapes, and costs nothing otherwise.
type stateCollector struct{ f *Fleet }

var (
	descInFlight    = prometheus.NewDesc("gorgo_replica_in_flight", "Requests this router sent to the replica that have not finished.", []string{"replica"}, nil)
	descTokens      = prometheus.NewDesc("gorgo_replica_in_flight_tokens", "Prompt tokens of those requests.", []string{"replica"}, nil)
	descBacklog     = prometheus.NewDesc("gorgo_replica_backlog_tokens", "Uncached prompt tokens sent to the replica that have not produced a first token (its prefill backlog).", []string{"replica"}, nil)
	descUnheard     = prometheus.NewDesc("gorgo_replica_unheard_tokens", "Uncached prompt tokens of the other routers' dispatches to the replica that this router of a mesh has not heard of yet and counts in its backlog (0 outside a mesh).", []string{"replica"}, nil)
	descDecoding    = prometheus.NewDesc("gorgo_replica_decoding", "Requests at the replica past their first token.", []string{"replica"}, nil)
	descRTTEst      = prometheus.NewDesc("gorgo_replica_rtt_estimate_seconds", "The router's smoothed round-trip estimate to the replica (what decisions use).", []string{"replica"}, nil)
	descITL         = prometheus.NewDesc("gorgo_replica_itl_seconds", "The replica's learned inter-token latency at its current load.", []string{"replica"}, nil)
	descCalibration = prometheus.NewDesc("gorgo_mesh_calibration", "What this router of a mesh scales another router's unheard dispatches by: what its decisions found of them at the replicas they picked over what they foretold, over 100 s (1 until ten decisions count; held to [0.5, 2]).", []string{"origin"}, nil)
	descCalibrated  = prometheus.NewDesc("gorgo_mesh_calibration_decisions", "How many of this router's decisions the calibration of another router's unheard dispatches rests on (decayed over 100 s).", []string{"origin"}, nil)
	descWeight      = prometheus.NewDesc("gorgo_policy_weight", "The routing policy's parameters (for the online tuner, its incumbent's).", []string{"policy", "weight"}, nil)

	descOutputMean     = prometheus.NewDesc("gorgo_output_estimate_tokens", "The running mean of answers' lengths, in tokens (the router's estimate before keys).", nil, nil)
	descOutputDepth    = prometheus.NewDesc("gorgo_output_estimate_depth", "How many keys the estimate of an answer's length uses now: 0 the running mean alone, 1 the request's application (its system prompt, or its prompt's first 256 tokens) too, 2 and its conversation.", nil, nil)
	descOutputKeys     = prometheus.NewDesc("gorgo_output_estimate_keys", "Applications and conversations the estimate of answers' lengths remembers (bounded).", nil, nil)
	descTunerJudged    = prometheus.NewDesc("gorgo_tuner_judged_total", "Candidate weights the online tuner judged.", nil, nil)
	descTunerAccepted  = prometheus.NewDesc("gorgo_tuner_accepted_total", "Candidate weights the online tuner accepted.", nil, nil)
	descTunerFallbacks = prometheus.NewDesc("gorgo_tuner_fallbacks_total", "Times a change of the fleet sent the online tuner back to its starting weights.", nil, nil)
	descTunerStep      = prometheus.NewDesc("gorgo_tuner_step_size", "The online tuner's step size (log space).", nil, nil)
	descTunerPaused    = prometheus.NewDesc("gorgo_tuner_paused", "1 while the online tuner is paused.", nil, nil)
	descTunerUnjudged  = prometheus.NewDesc("gorgo_tuner_unjudged_decisions_total", "Decisions the online tuner's objective cannot judge (whole answers under a TTFT objective, requests without SLOs under slo-p95, requests that generate no text; a request's fallbacks ranked again are one more), routed by its incumbent and learned from by none.", nil, nil)
)

// tunerState is what the metrics read of an online tuner (tune.Online).
type tunerState interface {
	Counts() (judged, accepted int)
	Resets() (int, string)
	Sigma() float64
	Paused() bool
	Unjudged() int
}

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInFlight, descTokens, descBacklog, descUnheard, descDecoding, descRTTEst, descITL, descCalibration, descCalibrated, descWeight,
		descOutputMean, descOutputDepth, descOutputKeys, descTunerJudged, descTunerAccepted, descTunerFallbacks, descTunerStep, descTunerPaused, descTunerUnjudged} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.f.rt.Replicas() {
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, st.ID)
		}
		g(descInFlight, float64(st.InFlight))
		g(descTokens, float64(st.UnfinishedTokens))
		g(descBacklog, float64(st.BacklogTokens))
		if u, err := c.f.rt.Unheard(c.f.Now(), st.ID); err == nil {
			g(descUnheard, float64(u))
		}
		g(descDecoding, float64(st.Decoding))
		g(descRTTEst, st.RTT.Seconds())
		g(descITL, (st.ITLBaseMS+st.ITLSlopeMS*float64(st.InFlight))/1000)
	}
	for _, cal := range c.f.rt.Calibrations(c.f.Now()) {
		ch <- prometheus.MustNewConstMetric(descCalibration, prometheus.GaugeValue, cal.Ratio, cal.Origin)
		ch <- prometheus.MustNewConstMetric(descCalibrated, prometheus.GaugeValue, cal.Decisions, cal.Origin)
	}
	out := c.f.rt.OutputEstimate()
	ch <- prometheus.MustNewConstMetric(descOutputMean, prometheus.GaugeValue, out.Mean)
	ch <- prometheus.MustNewConstMetric(descOutputDepth, prometheus.GaugeValue, float64(out.Depth))
	ch <- prometheus.MustNewConstMetric(descOutputKeys, prometheus.GaugeValue, float64(out.Keys))
	w := Params(c.f.policy)
	name := c.f.policy.Name()
	for _, k := range slices.Sorted(maps.Keys(w)) {
		ch <- prometheus.MustNewConstMetric(descWeight, prometheus.GaugeValue, w[k], name, k)
	}
	if t, ok := c.f.policy.(tunerState); ok {
		judged, accepted := t.Counts()
		fallbacks, _ := t.Resets()
		paused := 0.0
		if t.Paused() {
			paused = 1
		}
		ch <- prometheus.MustNewConstMetric(descTunerJudged, prometheus.CounterValue, float64(judged))
		ch <- prometheus.MustNewConstMetric(descTunerAccepted, prometheus.CounterValue, float64(accepted))
		ch <- prometheus.MustNewConstMetric(descTunerFallbacks, prometheus.CounterValue, float64(fallbacks))
		ch <- prometheus.MustNewConstMetric(descTunerStep, prometheus.GaugeValue, t.Sigma())
		ch <- prometheus.MustNewConstMetric(descTunerPaused, prometheus.GaugeValue, paused)
		ch <- prometheus.MustNewConstMetric(descTunerUnjudged, prometheus.CounterValue, float64(t.Unjudged()))
	}
}

// Params returns a policy's parameters now: a tunable policy's, the online
// tuner's incumbent's (nil for a policy without parameters).
func Params(p policy.Policy) policy.Values {
	switch p := p.(type) {
	case policy.Tuner:
		return p.Incumbent()
	case policy.Tunable:
		return p.Params()
	}
	return nil
}
