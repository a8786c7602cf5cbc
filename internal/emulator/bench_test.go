package emulator

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/replay"
	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// modelTimes records, per engine request id, when the model put out each
// token (model time, which is wall time at speedup 1).
type modelTimes struct {
	mu      sync.Mutex
	entered map[uint64]time.Duration
	tokens  map[uint64][]time.Duration
}

// BenchmarkStreams64 checks that the emulator is not the bottleneck: 64
// concurrent streams on the paper's engine (≈ 10 ms per token), each client
// timing every chunk; reported: how much later than the model's first
// token the client sees it (p99, ms) and how far each inter-token gap the
// client sees is from the model's (p99, ms).
func BenchmarkStreams64(b *testing.B) {
	p, _ := engine.LookupProfile("paper")
	for b.Loop() {
		s, err := New(Config{Profile: p, Spin: true})
		if err != nil {
			b.Fatal(err)
		}
		mt := &modelTimes{entered: map[uint64]time.Duration{}, tokens: map[uint64][]time.Duration{}}
		observe := s.drv.observe
		s.drv.observe = func(ev engine.Event, entered time.Duration) {
			mt.mu.Lock()
			mt.entered[ev.ID] = entered
			if ev.Kind != engine.EventFinish {
				mt.tokens[ev.ID] = append(mt.tokens[ev.ID], ev.Time)
			}
			mt.mu.Unlock()
			observe(ev, entered)
		}
		ctx, cancel := context.WithCancel(context.Background())
		go s.Run(ctx)
		srv := &http.Server{Handler: s.Handler()}
		ts := newLoopback(b, srv)
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}

		var wg sync.WaitGroup
		ttftExtra := make([][]float64, 64)
		gapErr := make([][]float64, 64)
		for k := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ttftExtra[k], gapErr[k] = timeStream(b, client, ts, s, mt, k)
			}()
		}
		wg.Wait()
		cancel()
		srv.Close()
		var tt, ge []float64
		for k := range 64 {
			tt = append(tt, ttftExtra[k]...)
			ge = append(ge, gapErr[k]...)
		}
		slices.Sort(tt)
		slices.Sort(ge)
		b.ReportMetric(report.Percentile(tt, 0.99), "ttft-extra-p99-ms")
		b.ReportMetric(report.Percentile(tt, 0.50), "ttft-extra-p50-ms")
		b.ReportMetric(report.Percentile(ge, 0.99), "itl-err-p99-ms")
		b.ReportMetric(report.Percentile(ge, 0.50), "itl-err-p50-ms")
	}
}

// timeStream sends one request of 1,000 prompt tokens and 100 output tokens and
// compares what the client saw with what the model did.
func timeStream(b *testing.B, client *http.Client, url string, s *Server, mt *modelTimes, k int) (ttftExtra, gapErr []float64) {
	body := fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":100,"stream":true}`, strings.Repeat(fmt.Sprintf("stream %d ", k), 400))
	sent := time.Now()
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		b.Error(err)
		return
	}
	defer resp.Body.Close()
	var seen []time.Time
	var id uint64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		// A light parse keeps the client's own cost out of the measurement;
		// the tests check the chunks with encoding/json.
		if !strings.Contains(data, `"content":" `) {
			continue
		}
		seen = append(seen, time.Now())
		if id == 0 {
			var c struct{ ID string }
			if err := json.Unmarshal([]byte(data), &c); err != nil {
				b.Error(err)
				return
			}
			f := strings.Split(c.ID, "-")
			id, _ = strconv.ParseUint(f[1], 10, 64)
		}
	}
	mt.mu.Lock()
	entered, tokens := mt.entered[id], mt.tokens[id]
	mt.mu.Unlock()
	if len(tokens) != len(seen) || len(seen) == 0 {
		b.Errorf("client saw %d tokens, the model made %d", len(seen), len(tokens))
		return
	}
	// Client times on the model's clock: the model's time at sent is
	// s.clk.model(sent).
	modelSent := s.clk.model(sent)
	clientTTFT := seen[0].Sub(sent)
	modelTTFT := tokens[0] - modelSent
	ttftExtra = append(ttftExtra, float64(clientTTFT-modelTTFT)/1e6)
	_ = entered
	for i := 1; i < len(seen); i++ {
		d := seen[i].Sub(seen[i-1]) - (tokens[i] - tokens[i-1])
		gapErr = append(gapErr, abs(float64(d))/1e6)
	}
	return ttftExtra, gapErr
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// BenchmarkReplaySlip replays an hour-rate workload the emulator keeps up
// with and reports the replayer's own scheduling slip (p99, ms).
func BenchmarkReplaySlip(b *testing.B) {
	p, _ := engine.LookupProfile("paper")
	reqs, err := trace.Generate(trace.GenConfig{Preset: "artchat", Seed: 1, Duration: 2 * time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	// 2 minutes of traffic in 24 s against a model 30x real time: a sixth
	// of the load that keeps the paper's engine busy, so it keeps up.
	reqs = trace.Apply(reqs, trace.Window{}, 0.2)
	for b.Loop() {
		s, err := New(Config{Profile: p, Speedup: 30, Spin: true})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		go s.Run(ctx)
		srv := &http.Server{Handler: s.Handler()}
		url := newLoopback(b, srv)
		out, err := replay.Run(context.Background(), replay.Config{Target: url, Requests: reqs, MaxInflight: 64})
		cancel()
		srv.Close()
		if err != nil {
			b.Fatal(err)
		}
		run := report.NewRun("replay", out.Records, nil)
		b.ReportMetric(run.Slip.P99, "slip-p99-ms")
		b.ReportMetric(run.Slip.Mean, "slip-mean-ms")
		b.ReportMetric(float64(run.Failed), "failed")
	}
}
