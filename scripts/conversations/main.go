// Command conversations holds Responses API conversations with an
// OpenAI-compatible server: each conversation a first turn (a shared
// instruction and a question of its own) and follow-ups that name the
// previous response (previous_response_id), one after another, streamed;
// conversations start at Poisson arrivals. It prints how many turns were
// answered, how many conversations were cut short and by what status (a
// replica that does not hold the previous response answers 404; 0 is a
// 200 without its id, a token or its response.completed), and the
// answered turns' TTFT and E2E percentiles in ms (scripts/conversations.sh
// runs it through gorgo serve).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
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
	n := flag.Int("n", 60, "conversations")
	turns := flag.Int("turns", 6, "turns of each conversation")
	rate := flag.Float64("rate", 2, "conversations started per second")
	seed := flag.Uint64("seed", 1, "random seed (arrivals)")
	flag.Parse()
	rng := rand.New(rand.NewPCG(*seed, 1))
	instructions := strings.Repeat("You are a careful assistant for a shipping company's customers. ", 8)
	var mu sync.Mutex
	var ttft, e2e []float64
	refused := map[int]int{}
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	start, at := time.Now(), 0.0
	for c := range *n {
		at += rng.ExpFloat64() / *rate
		time.Sleep(time.Until(start.Add(time.Duration(at * float64(time.Second)))))
		wg.Add(1)
		go func() {
			defer wg.Done()
			prev := ""
			for t := range *turns {
				req := map[string]any{"model": "m", "stream": true, "max_output_tokens": 24,
					"input": fmt.Sprintf("Conversation %d-%d, turn %d: %s", *seed, c, t, strings.Repeat("Where is my parcel, and when will it arrive? ", 8))}
				if prev == "" {
					req["instructions"] = instructions
				} else {
					req["previous_response_id"] = prev
				}
				body, _ := json.Marshal(req)
				t0 := time.Now()
				resp, err := client.Post(*target+"/v1/responses", "application/json", bytes.NewReader(body))
				if err != nil || resp.StatusCode != http.StatusOK {
					status := -1
					if err == nil {
						status = resp.StatusCode
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
					mu.Lock()
					refused[status]++
					mu.Unlock()
					return // the conversation cannot go on
				}
				first, id, completed := time.Duration(0), "", false
				sc := bufio.NewScanner(resp.Body)
				sc.Buffer(nil, 1<<20)
				for sc.Scan() {
					data, ok := strings.CutPrefix(sc.Text(), "data: ")
					if !ok {
						continue
					}
					var ev struct {
						Type     string `json:"type"`
						Delta    string `json:"delta"`
						Response struct {
							ID string `json:"id"`
						} `json:"response"`
					}
					if json.Unmarshal([]byte(data), &ev) != nil {
						continue
					}
					switch {
					case ev.Type == "response.created":
						id = ev.Response.ID
					case ev.Type == "response.output_text.delta" && ev.Delta != "" && first == 0:
						first = time.Since(t0)
					case ev.Type == "response.completed":
						completed = true
					}
				}
				err = sc.Err()
				resp.Body.Close()
				if id == "" || first == 0 || !completed || err != nil {
					mu.Lock()
					refused[0]++ // a 200 without an id, a token or its end (a stream cut short)
					mu.Unlock()
					return
				}
				mu.Lock()
				ttft = append(ttft, float64(first.Milliseconds()))
				e2e = append(e2e, float64(time.Since(t0).Milliseconds()))
				mu.Unlock()
				prev = id
			}
		}()
	}
	wg.Wait()
	lost := 0
	var statuses []string
	for status, k := range refused {
		lost += k
		statuses = append(statuses, fmt.Sprintf("%d×%d", k, status))
	}
	slices.Sort(statuses)
	fmt.Printf("turns answered %d of %d; conversations cut short %d (status: %s)\n", len(ttft), *n**turns, lost, strings.Join(statuses, " "))
	if len(ttft) == 0 {
		os.Exit(1)
	}
	slices.Sort(ttft)
	slices.Sort(e2e)
	q := func(xs []float64, p float64) float64 { return xs[int(p*float64(len(xs)-1))] }
	fmt.Printf("answered turns: TTFT p50 %.0f p95 %.0f p99 %.0f  E2E p50 %.0f p95 %.0f\n", q(ttft, .5), q(ttft, .95), q(ttft, .99), q(e2e, .5), q(e2e, .95))
}
