// Command native sends SGLang's native API traffic to a server: streamed
// POST /generate requests at Poisson arrivals, each one of several
// applications' ~2,000-token openings and a question of its own, with
// max_new_tokens of 20 to 79 (or --max-new); it prints how many were
// answered and their TTFT (the first chunk with text) and E2E percentiles
// in ms (scripts/native.sh runs it through gorgo serve). With
// --abort-after D it aborts them all D after the start, as a trainer
// does its rollouts (SGLang's POST /abort_request {"abort_all": true}),
// and prints how many answers ended so and how long after the abort the
// last request ended.
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
	maxNew := flag.Int("max-new", 0, "max_new_tokens of every request (0: 20 to 79)")
	abortAfter := flag.Duration("abort-after", 0, "abort every request this long after the start (0: never)")
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
	var abortedAt, lastEnd time.Time
	aborted, abortStatus := 0, 0
	start := time.Now()
	if *abortAfter > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(start.Add(*abortAfter)))
			mu.Lock()
			abortedAt = time.Now()
			mu.Unlock()
			resp, err := http.Post(*target+"/abort_request", "application/json", strings.NewReader(`{"abort_all":true}`))
			if err == nil {
				abortStatus = resp.StatusCode
				resp.Body.Close()
			}
		}()
	}
	at := 0.0
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	for i := range *n {
		at += rng.ExpFloat64() / *rate
		time.Sleep(time.Until(start.Add(time.Duration(at * float64(time.Second)))))
		text := openings[rng.IntN(*apps)] + fmt.Sprintf(" Question %d: what does section %d say?", i, rng.IntN(1000))
		tokens := 20 + rng.IntN(60)
		if *maxNew > 0 {
			tokens = *maxNew
		}
		body, _ := json.Marshal(map[string]any{"text": text, "stream": true, "rid": fmt.Sprintf("native-%d", i), "sampling_params": map[string]any{"max_new_tokens": tokens}})
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
			abort := false
			for sc.Scan() {
				line := sc.Text()
				if first == 0 && strings.HasPrefix(line, "data: {") && !strings.Contains(line, `"text":""`) {
					first = time.Since(t0)
				}
				abort = abort || strings.Contains(line, `"type":"abort"`)
			}
			end := time.Since(t0)
			mu.Lock()
			if abort {
				aborted++
			}
			if now := time.Now(); now.After(lastEnd) {
				lastEnd = now
			}
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
	if *abortAfter > 0 {
		fmt.Printf("abort_all answered %d; %d answers ended by it; the last request ended %.0f ms after it\n", abortStatus, aborted, float64(lastEnd.Sub(abortedAt).Microseconds())/1000)
	}
}
