package proxy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the proxy's own series of the replicas (requests' series are
// the lifecycle's).
type metrics struct {
	scrapeErrors *prometheus.CounterVec
	healthy, rtt *prometheus.GaugeVec
	reloads      *prometheus.CounterVec
	ejections    *prometheus.CounterVec
	restarts     *prometheus.CounterVec
	refused      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		scrapeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_scrape_errors_total",
			Help: "Failed scrapes of a replica's engine metrics."}, []string{"replica"}),
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gorgo_replica_healthy",
			Help: "1 if the replica is up (probed and not marked down)."}, []string{"replica"}),
		rtt: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gorgo_replica_rtt_seconds",
			Help: "The last probe's round trip to the replica."}, []string{"replica"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_config_reloads_total",
			Help: "Config reloads, by result (applied, unchanged, failed)."}, []string{"result"}),
	}
	m.ejections = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_replica_ejections_total",
		Help: "Times a replica was ejected as an outlier (consecutive failures or a failure rate of half its recent requests)."}, []string{"replica"})
	m.restarts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_replica_restarts_total",
		Help: "Engine restarts seen in a replica's metrics (its process start time changed or its counters went back)."}, []string{"replica"})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_refused_total",
		Help: "Client connections and requests refused at once because the proxy was at a limit (max_connections, max_in_flight)."}, []string{"limit"})
	reg.MustRegister(m.scrapeErrors, m.healthy, m.rtt, m.reloads, m.ejections, m.restarts, m.refused)
	return m
}

// forget drops a replica's series (it left the fleet).
func (m *metrics) forget(id string) {
	m.scrapeErrors.DeleteLabelValues(id)
	m.healthy.DeleteLabelValues(id)
	m.rtt.DeleteLabelValues(id)
	m.ejections.DeleteLabelValues(id)
	m.restarts.DeleteLabelValues(id)
}
