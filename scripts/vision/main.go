// Command vision sends a multimodal workload to an OpenAI-compatible
// server: each request a new image (its own URL; or an audio clip, or a
// video, with --media) and the same question, at Poisson arrivals,
// streamed; it prints how many were answered and their TTFT and E2E
// percentiles in ms (scripts/vision.sh runs it through gorgo serve).
package main

import (
	"bufio"
	"bytes"
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
	n := flag.Int("n", 400, "requests")
	rate := flag.Float64("rate", 10, "requests per second")
	seed := flag.Uint64("seed", 1, "random seed (arrivals, media URLs)")
	media := flag.String("media", "image", "what each request asks about: image, audio or video")
	flag.Parse()
	part := map[string]string{"image": "image_url", "audio": "audio_url", "video": "video_url"}[*media]
	if part == "" {
		fmt.Fprintf(os.Stderr, "vision: --media must be image, audio or video, got %q\n", *media)
		os.Exit(2)
	}
	rng := rand.New(rand.NewPCG(*seed, 1))
	question := strings.Repeat("You are a careful assistant that describes pictures for a catalogue. ", 10) + "What is in this picture? Answer in one sentence."
	var mu sync.Mutex
	var ttft, e2e []float64
	fails := 0
	var wg sync.WaitGroup
	start := time.Now()
	at := 0.0
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	for i := range *n {
		at += rng.ExpFloat64() / *rate
		time.Sleep(time.Until(start.Add(time.Duration(at * float64(time.Second)))))
		body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":32,"messages":[{"role":"user","content":[{"type":"%s","%s":{"url":"https://media.example/%d-%d"}},{"type":"text","text":%q}]}]}`, part, part, *seed, i, question)
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			resp, err := client.Post(*target+"/v1/chat/completions", "application/json", bytes.NewReader([]byte(body)))
			if err != nil || resp.StatusCode != 200 {
				mu.Lock()
				fails++
				mu.Unlock()
				if err == nil {
					resp.Body.Close()
				}
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			first := time.Duration(0)
			for sc.Scan() {
				// The first token: content that is not empty (a role
				// chunk may come before it with "content":"").
				if line := sc.Text(); first == 0 && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
					first = time.Since(t0)
				}
			}
			end := time.Since(t0)
			mu.Lock()
			ttft = append(ttft, float64(first.Milliseconds()))
			e2e = append(e2e, float64(end.Milliseconds()))
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(ttft) == 0 {
		fmt.Fprintf(os.Stderr, "vision: no request answered (%d failed)\n", fails)
		os.Exit(1)
	}
	slices.Sort(ttft)
	slices.Sort(e2e)
	q := func(xs []float64, p float64) float64 { return xs[int(p*float64(len(xs)-1))] }
	fmt.Fprintf(os.Stdout, "done %d fail %d  TTFT p50 %.0f p95 %.0f p99 %.0f  E2E p50 %.0f p95 %.0f\n", len(ttft), fails, q(ttft, .5), q(ttft, .95), q(ttft, .99), q(e2e, .5), q(e2e, .95))
}
