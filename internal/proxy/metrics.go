package proxy

import "github.com/prometheus/client_golang/prometheus"

// metrics are the front end's own series (requests' series are the
// lifecycle's, replicas' the fleet's).
type metrics struct {
	refused *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_refused_total",
		Help: "Client connections and requests refused at once because the proxy was at a limit (max_connections, max_in_flight, max_body_bytes_in_flight, rate_limit)."}, []string{"limit"})}
	reg.MustRegister(m.refused)
	return m
}
