// Command native sends SGLang's native API traffic to a server: streamed
// POST /generate requests at Poisson arrivals, each one of several
// applications' ~2,000-token openings and a question of its own, with
// max_new_tokens of 20 to 79; it prints how many were answered and their
// TTFT (the first chunk with text) and E2E percentiles in ms
// (scripts/native.sh runs it through gorgo serve).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

func main() {
	target := flag.String("target", "http://127.0.0.1:8080", "the server's base URL")
	n := flag.Int("n", 240, "requests")
	rate := flag.Float64("rate", 6, "requests per second")
	apps := flag.Int("apps", 6, "applications, each with its own opening")
	seed := flag.Uint64("seed", 1, "random seed (arrivals, applications, lengths)")
	flag.Parse()
	rng := rand.New(rand.NewPCG(*seed, 1))
	openings := make([]string, *apps)
	for a := range openings {
		openings[a] = strings.Repeat(fmt.Sprintf("Application %d: you answer questions about its manual, page by page, carefully. ", a), 150)
	}
	var mu sync.Mutex
	var ttft, e2e []float64
	fails := map[int]int{}
	var wg sync.WaitGroup
	start := time.Now()
	at := 0.0
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	for i := range *n {
		at += rng.ExpFloat64() / *rate
		time.Sleep(time.Until(start.Add(time.Duration(at * float64(time.Second)))))
		text := openings[rng.IntN(*apps)] + fmt.Sprintf(" Question %d: what does section %d say?", i, rng.IntN(1000))
		body, _ := json.Marshal(map[string]any{"text": text, "stream": true, "sampling_params": map[string]any{"max_new_tokens": 20 + rng.IntN(60)}})
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			resp, err := client.Post(*target+"/generate", "application/json", bytes.NewReader(body))
			if err != nil || resp.StatusCode != 200 {
				status := 0
				if err == nil {
					status = resp.StatusCode
					resp.Body.Close()
				}
				mu.Lock()
				fails[status]++
				mu.Unlock()
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(nil, 1<<20)
			first := time.Duration(0)
			for sc.Scan() {
				if line := sc.Text(); first == 0 && strings.HasPrefix(line, "data: {") && !strings.Contains(line, `"text":""`) {
					first = time.Since(t0)
				}
			}
			end := time.Since(t0)
			mu.Lock()
			ttft = append(ttft, float64(first.Microseconds())/1000)
			e2e = append(e2e, float64(end.Microseconds())/1000)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(ttft) == 0 {
		fmt.Fprintf(os.Stderr, "native: no request answered (failed, by status: %v)\n", fails)
		os.Exit(1)
	}
	slices.Sort(ttft)
	slices.Sort(e2e)
	q := func(xs []float64, p float64) float64 { return xs[int(p*float64(len(xs)-1))] }
	fmt.Printf("done %d failed %v  TTFT p50 %.0f p95 %.0f p99 %.0f  E2E p50 %.0f p95 %.0f\n", len(ttft), fails, q(ttft, .5), q(ttft, .95), q(ttft, .99), q(e2e, .5), q(e2e, .95))
}
