package enginemetrics

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/engine"
)

const sglangBody = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 4.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2.0
sglang:num_used_tokens{model_name="m",tp_rank="0"} 5000.0
sglang:max_total_num_tokens{model_name="m",tp_rank="0"} 20000.0
sglang:token_usage{model_name="m",tp_rank="0"} 0.25
`

// serve starts a test server with the handler and returns its metrics URL.
func serve(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL + "/metrics"
}

func TestScrapeOK(t *testing.T) {
	url := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if a := r.Header.Get("Accept"); !strings.HasPrefix(a, "text/plain;version=0.0.4") || r.URL.Path != "/metrics" {
			http.Error(w, "bad request: Accept "+a+" path "+r.URL.Path, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write([]byte(sglangBody))
	})
	em, err := (&Scraper{URL: url}).Scrape(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	checkMetrics(t, em, Metrics{Format: FormatSGLang, Running: 4, Waiting: 2, KVUsedTokens: 5000,
		KVUsage: 0.25, KVCapacityTokens: 20000, Model: "m"})
}

// scrapeErr scrapes and checks that the error names the URL.
func scrapeErr(t *testing.T, ctx context.Context, s *Scraper) error {
	t.Helper()
	_, err := s.Scrape(ctx)
	if err == nil {
		t.Fatal("no error")
	}
	if !strings.Contains(err.Error(), s.URL) {
		t.Errorf("error %q does not name %s", err, s.URL)
	}
	return err
}

func TestScrapeStatus(t *testing.T) {
	url := serve(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "engine\noverloaded", http.StatusInternalServerError)
	})
	err := scrapeErr(t, context.Background(), &Scraper{URL: url})
	var se *StatusError
	if !errors.As(err, &se) || se.Code != 500 || se.Body != "engine overloaded" {
		t.Errorf("error %v, want a StatusError 500 with the body", err)
	}
	if !strings.Contains(err.Error(), "HTTP 500 Internal Server Error: engine overloaded") {
		t.Errorf("error %q", err)
	}
}

func TestScrapeContextTimeout(t *testing.T) {
	url := serve(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // a hung engine
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := scrapeErr(t, ctx, &Scraper{URL: url})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v, want context.DeadlineExceeded", err)
	}
}

func TestScrapeClientTimeout(t *testing.T) {
	url := serve(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	})
	err := scrapeErr(t, context.Background(), &Scraper{Client: &http.Client{Timeout: 50 * time.Millisecond}, URL: url})
	if !strings.Contains(err.Error(), "Client.Timeout") {
		t.Errorf("error %q does not say the client timed out", err)
	}
}

func TestScrapeConnectionRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	err = scrapeErr(t, context.Background(), &Scraper{URL: "http://" + addr + "/metrics"})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("error %v, want connection refused", err)
	}
}

func TestScrapeBodyCutInTransit(t *testing.T) {
	url := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100000")
		_, _ = w.Write([]byte(sglangBody))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the engine dies mid-reply
	})
	err := scrapeErr(t, context.Background(), &Scraper{URL: url})
	if !strings.Contains(err.Error(), "read body") {
		t.Errorf("error %q, want a read error", err)
	}
}

func TestScrapeBadBodies(t *testing.T) {
	for _, c := range []struct {
		name, contentType, body string
		check                   func(error) bool
	}{
		{"html", "text/html", "<html><body>Not Found</body></html>\n", func(err error) bool {
			var pe expfmt.ParseError
			return errors.As(err, &pe)
		}},
		{"no engine", "text/plain", "go_goroutines 7\n", func(err error) bool { return errors.Is(err, ErrUnknownEngine) }},
		{"protobuf", "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited", "\x00",
			func(err error) bool { return strings.Contains(err.Error(), "protobuf exposition") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := serve(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", c.contentType)
				_, _ = w.Write([]byte(c.body))
			})
			if err := scrapeErr(t, context.Background(), &Scraper{URL: url}); !c.check(err) {
				t.Errorf("unexpected error %v", err)
			}
		})
	}
}

func TestScrapeTooLarge(t *testing.T) {
	url := serve(t, func(w http.ResponseWriter, r *http.Request) {
		line := []byte(strings.Repeat("#", 1023) + "\n")
		for n := 0; n <= MaxExpositionBytes; n += len(line) {
			if _, err := w.Write(line); err != nil {
				return
			}
		}
	})
	err := scrapeErr(t, context.Background(), &Scraper{URL: url})
	if !strings.Contains(err.Error(), "larger than") {
		t.Errorf("error %q", err)
	}
}

func TestScrapeBadURL(t *testing.T) {
	scrapeErr(t, context.Background(), &Scraper{URL: "://no-scheme/metrics"})
}

// TestScrapeEmulator reads gorgo's own emulated replicas, in both formats,
// after the same two requests (the second hits the first's prefix).
func TestScrapeEmulator(t *testing.T) {
	p, err := engine.LookupProfile("paper")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Metrics{}
	for _, format := range []string{FormatSGLang, FormatVLLM} {
		s, err := emulator.New(emulator.Config{Profile: p, MetricsFormat: format, Model: "emu/model", Speedup: 20})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		ts := httptest.NewServer(s.Handler())

		var prompt, cached, generated float64
		for range 2 {
			body := `{"model":"emu/model","max_tokens":5,"messages":[{"role":"user","content":"` +
				strings.Repeat("a shared system prompt and some question. ", 20) + `"}]}`
			resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			var out struct {
				Usage struct {
					PromptTokens        float64 `json:"prompt_tokens"`
					CompletionTokens    float64 `json:"completion_tokens"`
					PromptTokensDetails struct {
						CachedTokens float64 `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				} `json:"usage"`
			}
			err = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("completion: HTTP %d, %v", resp.StatusCode, err)
			}
			prompt += out.Usage.PromptTokens
			cached += out.Usage.PromptTokensDetails.CachedTokens
			generated += out.Usage.CompletionTokens
		}

		em, err := (&Scraper{URL: ts.URL + "/metrics"}).Scrape(context.Background())
		ts.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("emulator: %v", err)
		}
		if err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		got[format] = em
		if em.Format != format || em.Model != "emu/model" || em.Running != 0 || em.Waiting != 0 {
			t.Errorf("%s: %+v", format, em)
		}
		if em.PromptTokensTotal != prompt || em.GenerationTokensTotal != generated || generated != 10 {
			t.Errorf("%s: prompt %v generated %v, want %v %v (10)", format, em.PromptTokensTotal, em.GenerationTokensTotal, prompt, generated)
		}
		if cached == 0 || em.CacheHitRate != cached/prompt {
			t.Errorf("%s: hit rate %v, want %v/%v", format, em.CacheHitRate, cached, prompt)
		}
		if em.KVCapacityTokens > p.KVCapacityTokens || em.KVCapacityTokens <= p.KVCapacityTokens-16 {
			t.Errorf("%s: capacity %d, want the profile's %d in whole 16-token pages", format, em.KVCapacityTokens, p.KVCapacityTokens)
		}
		if em.KVUsedTokens <= 0 || math.Abs(em.KVUsage-float64(em.KVUsedTokens)/float64(em.KVCapacityTokens)) > 1e-12 {
			t.Errorf("%s: used %d usage %v", format, em.KVUsedTokens, em.KVUsage)
		}
	}
	sg, vl := got[FormatSGLang], got[FormatVLLM]
	if sg.KVUsedTokens != vl.KVUsedTokens || sg.KVCapacityTokens != vl.KVCapacityTokens {
		t.Errorf("sglang and vllm replicas disagree: %+v vs %+v", sg, vl)
	}
	if vl.PrefixQueriesTotal != vl.PromptTokensTotal || vl.PrefixHitsTotal == 0 {
		t.Errorf("vllm prefix counters %v/%v", vl.PrefixHitsTotal, vl.PrefixQueriesTotal)
	}
}
