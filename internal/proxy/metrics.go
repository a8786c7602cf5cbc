package proxy

import "github.com/prometheus/client_golang/prometheus"

// metrics are the front end's own series (requests' series are the
// lifecycle's, replicas' the fleet's).
type metrics struct {
	refused *prometheus.CounterVec
	unheld  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_refused_total",
		Help: "Client connections and requests refused at once because the proxy was at a limit (max_connections, max_in_flight, max_body_bytes_in_flight, rate_limit)."}, []string{"limit"})}
	m.unheld = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_answers_unheld_total",
		Help: "Whole (non-streamed) answers passed through as they came rather than held to their end (so that one breaking off could be tried elsewhere), by the limit that stopped the hold (max_answer_bytes: the answer is longer; max_answer_bytes_in_flight: the answers being held filled their budget)."}, []string{"limit"})
	reg.MustRegister(m.refused, m.unheld)
	return m
}
