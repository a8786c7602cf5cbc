package proxy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the proxy's own Prometheus series.
type metrics struct {
	requests     *prometheus.CounterVec
	retries      *prometheus.CounterVec
	scrapeErrors *prometheus.CounterVec
	ttft, e2e    *prometheus.HistogramVec
	decision     prometheus.Histogram
	healthy, rtt *prometheus.GaugeVec
}

var latencyBuckets = []float64{0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 1.5, 2, 3, 4, 6, 8, 10, 15, 20, 30, 60, 120}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_requests_total",
			Help: "Requests answered, by replica (empty when none served it) and HTTP status (499: the client went away)."}, []string{"replica", "code"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_retries_total",
			Help: "Attempts that failed on a replica before anything reached the client, and were tried elsewhere."}, []string{"replica"}),
		scrapeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_scrape_errors_total",
			Help: "Failed scrapes of a replica's engine metrics."}, []string{"replica"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gorgo_ttft_seconds",
			Help: "Time from a request's arrival at the proxy to its first token leaving it.", Buckets: latencyBuckets}, []string{"replica"}),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gorgo_e2e_seconds",
			Help: "Time from a request's arrival at the proxy to its last byte leaving it.", Buckets: latencyBuckets}, []string{"replica"}),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gorgo_decision_seconds",
			Help: "Time to choose a replica (prefix match, views, policy).", Buckets: prometheus.ExponentialBuckets(1e-6, 2, 16)}),
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gorgo_replica_healthy",
			Help: "1 if the replica is eligible for routing."}, []string{"replica"}),
		rtt: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gorgo_replica_rtt_seconds",
			Help: "The last probe's round trip to the replica."}, []string{"replica"}),
	}
	reg.MustRegister(m.requests, m.retries, m.scrapeErrors, m.ttft, m.e2e, m.decision, m.healthy, m.rtt)
	return m
}
