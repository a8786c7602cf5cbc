package lifecycle

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorgo-llm/gorgo/internal/policy"
)

// Metrics are the Prometheus series of requests' lives.
type Metrics struct {
	requests  *prometheus.CounterVec
	retries   *prometheus.CounterVec
	ttft, e2e *prometheus.HistogramVec
	decision  prometheus.Histogram
	admission *prometheus.CounterVec
	queue     prometheus.Gauge
	cost      *prometheus.HistogramVec
	forecasts *prometheus.CounterVec
	tm        *tenantMetrics

	// labels are the model names the series are labelled with: the first
	// maxModelLabels served or aliased names seen; others are "other".
	mu     sync.Mutex
	labels map[string]bool
}

// maxModelLabels bounds the model label's values (besides "" and "other").
const maxModelLabels = 64

// otherModel labels a request for a model outside the label set, or one
// no replica serves.
const otherModel = "other"

var latencyBuckets = []float64{0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 1.5, 2, 3, 4, 6, 8, 10, 15, 20, 30, 60, 120}

// NewMetrics registers the series on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_requests_total",
			Help: "Requests answered, by replica (empty when none served it), model (the served name; other past the first 64, or for a model not served) and HTTP status (499: the client went away; a status HTTP does not name, its class: 4xx)."}, []string{"replica", "model", "code"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_retries_total",
			Help: "Attempts that failed on a replica before anything reached the client, and were tried elsewhere."}, []string{"replica"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gorgo_ttft_seconds",
			Help: "Time from a request's arrival at the proxy to its first token leaving it, by replica and model.", Buckets: latencyBuckets}, []string{"replica", "model"}),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gorgo_e2e_seconds",
			Help: "Time from a request's arrival at the proxy to its last byte leaving it, by replica and model.", Buckets: latencyBuckets}, []string{"replica", "model"}),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gorgo_decision_seconds",
			Help: "Time to choose a replica (prefix match, views, policy).", Buckets: prometheus.ExponentialBuckets(1e-6, 2, 16)}),
		admission: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_admission_total",
			Help: "Admission verdicts under the TTFT SLO: go, held (queued), rejected (429 on arrival), expired (429 after waiting)."}, []string{"verdict"}),
		queue: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gorgo_admission_queue",
			Help: "Requests waiting in the router-side admission queue."}),
		cost: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gorgo_decision_cost_seconds",
			Help:    "The chosen replica's cost terms at each decision (rtt, prefill, queue, decode, adapter), for scoring policies.",
			Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}}, []string{"term"}),
	}
	m.forecasts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gorgo_ttft_forecasts_total",
		Help: "First tokens against the TTFT the router forecast at dispatch, with the margin admission adds (about 95 in 100 should be within): within or beyond, by replica."}, []string{"replica", "outcome"})
	reg.MustRegister(m.requests, m.retries, m.ttft, m.e2e, m.decision, m.admission, m.queue, m.cost, m.forecasts)
	m.tm = newTenantMetrics(reg)
	m.labels = map[string]bool{}
	return m
}

// model is the label of a request for a served (or aliased) name.
func (m *Metrics) model(name string) string {
	if name == "" || name == otherModel {
		return name
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.labels[name] {
		return name
	}
	if len(m.labels) < maxModelLabels {
		m.labels[name] = true
		return name
	}
	return otherModel
}

// forget drops a replica's series (it left the fleet).
func (m *Metrics) forget(id string) {
	m.requests.DeletePartialMatch(prometheus.Labels{"replica": id})
	m.retries.DeleteLabelValues(id)
	m.ttft.DeletePartialMatch(prometheus.Labels{"replica": id})
	m.e2e.DeletePartialMatch(prometheus.Labels{"replica": id})
	m.forecasts.DeletePartialMatch(prometheus.Labels{"replica": id})
}

// forecast counts a first token on replica id within its forecast (with
// the margin) or beyond it.
func (m *Metrics) forecast(id string, within bool) {
	if m == nil {
		return
	}
	outcome := "beyond"
	if within {
		outcome = "within"
	}
	m.forecasts.WithLabelValues(id, outcome).Inc()
}

// ended counts a request for model that ended with status on replica id
// ("" for none); a served one's TTFT (noTTFT if it had no first token) and
// E2E go to the histograms.
func (m *Metrics) ended(id, model string, status int, ttft, e2e time.Duration) {
	if m == nil {
		return
	}
	model = m.model(model)
	m.requests.WithLabelValues(id, model, statusText(status)).Inc()
	if status == statusOK {
		m.e2e.WithLabelValues(id, model).Observe(e2e.Seconds())
		if ttft != noTTFT {
			m.ttft.WithLabelValues(id, model).Observe(ttft.Seconds())
		}
	}
}

func (m *Metrics) retried(id string) {
	if m != nil {
		m.retries.WithLabelValues(id).Inc()
	}
}

func (m *Metrics) decisionTime(d time.Duration) {
	if m != nil {
		m.decision.Observe(d.Seconds())
	}
}

func (m *Metrics) admitted(verdict string) {
	if m != nil {
		m.admission.WithLabelValues(verdict).Inc()
	}
}

func (m *Metrics) queued(n int) {
	if m != nil {
		m.queue.Set(float64(n))
	}
}

// decided records the chosen replica's cost terms (ms), when the policy
// scores.
func (m *Metrics) decided(t policy.Terms) {
	if m == nil || t.Total == 0 {
		return
	}
	m.cost.WithLabelValues("rtt").Observe(t.RTT / 1000)
	m.cost.WithLabelValues("prefill").Observe(t.Prefill / 1000)
	m.cost.WithLabelValues("queue").Observe(t.Queue / 1000)
	m.cost.WithLabelValues("decode").Observe(t.Decode / 1000)
	m.cost.WithLabelValues("adapter").Observe(t.Adapter / 1000)
}
