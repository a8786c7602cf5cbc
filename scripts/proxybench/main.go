// Command proxybench is the load side of scripts/proxy-vs-nginx.sh, which
// measures what `gorgo serve`'s request path costs next to nginx as a plain
// reverse proxy. It has four subcommands:
//
//	upstream -listen ADDR[,ADDR...]   a canned OpenAI-compatible replica, as cheap as possible
//	ttft -url URL -tokens N -n COUNT [-direct URL]
//	                                  time to first token, one request at a time
//	body -tokens N [-stream]          print the request body the wrk runs send
//	check -url URL                    one request of each kind, checked for shape
//
// It uses the standard library only, so it builds even while the proxy's
// packages do not.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "upstream":
		err = runUpstream(args)
	case "ttft":
		err = runTTFT(args)
	case "body":
		err = runBody(args)
	case "check":
		err = runCheck(args)
	case "relay":
		err = runRelay(args)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxybench:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage: proxybench upstream -listen ADDR[,ADDR...]
       proxybench ttft -url URL -tokens N -n COUNT [-direct URL]
       proxybench body -tokens N [-stream]
       proxybench check -url URL
       proxybench relay -listen ADDR -upstream URL`)
	os.Exit(2)
}

// fillerWords make prompt text: ordinary words, so that a body is plain
// JSON with nothing to escape.
var fillerWords = strings.Fields("the router sends each request to the replica with the lowest estimated time to first token " +
	"from its round trip its uncached prompt tokens and its queue and learns the weights online from what it observes")

// promptText returns about tokens*4 bytes of text (the proxy, like the
// emulator, estimates 4 bytes per token), starting with prefix.
func promptText(prefix string, tokens int) string {
	want := tokens * 4
	var b strings.Builder
	b.Grow(want + 16)
	b.WriteString(prefix)
	for i := 0; b.Len() < want; i++ {
		b.WriteByte(' ')
		b.WriteString(fillerWords[i%len(fillerWords)])
	}
	return b.String()
}

// chatBody is an OpenAI chat request of about tokens prompt tokens. A
// stream asks for usage (stream_options.include_usage), as gorgo would ask
// on the client's behalf anyway: with it both proxies forward the body
// untouched and get the same 21-event stream back.
func chatBody(model, system, text string, maxTokens int, stream bool) []byte {
	var msgs []map[string]string
	if system != "" {
		msgs = append(msgs, map[string]string{"role": "system", "content": system})
	}
	msgs = append(msgs, map[string]string{"role": "user", "content": text})
	req := map[string]any{"messages": msgs, "max_tokens": maxTokens}
	if model != "" {
		req["model"] = model
	}
	if stream {
		req["stream"] = true
		req["stream_options"] = map[string]any{"include_usage": true}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(req)
	return bytes.TrimRight(buf.Bytes(), "\n")
}

// runBody prints the body the wrk runs send: one fixed ~tokens-token chat
// request (wrk sends the same bytes every time).
func runBody(args []string) error {
	fs := flag.NewFlagSet("body", flag.ExitOnError)
	tokens := fs.Int("tokens", 1000, "prompt size in estimated tokens (4 bytes each)")
	stream := fs.Bool("stream", false, `"stream":true, with stream_options.include_usage`)
	model := fs.String("model", "proxybench", "model field (empty: none)")
	_ = fs.Parse(args)
	_, err := os.Stdout.Write(chatBody(*model, "You are a helpful assistant.", promptText("Summarise this text.", *tokens), streamTokens, *stream))
	return err
}

// runTTFT measures the time to the first content token of streaming chat
// requests sent one at a time, so that what is measured is the latency of
// the path, not queueing. Each request has a fresh prompt (a counter and
// a per-run nonce come first), so no prefix cache (the engine's, or the
// proxy's index) hits anywhere. With -direct, every request through the
// proxy is paired with one straight to the upstream (in alternating
// order), and the figures are the proxied ones, the direct ones and their
// difference: what the proxy adds.
func runTTFT(args []string) error {
	fs := flag.NewFlagSet("ttft", flag.ExitOnError)
	url := fs.String("url", "", "base `URL` of the proxy (or any OpenAI endpoint)")
	direct := fs.String("direct", "", "base `URL` of the upstream itself, measured interleaved for the difference")
	tokens := fs.Int("tokens", 1000, "prompt size in estimated tokens (4 bytes each)")
	n := fs.Int("n", 300, "measured requests (per target)")
	warmup := fs.Int("warmup", 10, "requests (per target) sent first and not measured")
	maxTokens := fs.Int("max-tokens", 2, "max_tokens of each request (the rest of the stream is read, untimed)")
	model := fs.String("model", "", "model field (empty: none; the emulator accepts that)")
	_ = fs.Parse(args)
	if *url == "" || *n < 1 {
		return errors.New("ttft: -url and a positive -n are required")
	}
	type target struct {
		name, url string
		ms        []float64
	}
	targets := []*target{{name: "proxied", url: strings.TrimRight(*url, "/")}}
	if *direct != "" {
		targets = append(targets, &target{name: "direct", url: strings.TrimRight(*direct, "/")})
	}
	client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 2, DisableCompression: true}}
	nonce := time.Now().UnixNano()
	for i := -*warmup; i < *n; i++ {
		for k := range targets {
			t := targets[k]
			if i%2 != 0 { // alternate the order, so neither target always goes first
				t = targets[len(targets)-1-k]
			}
			body := chatBody(*model, "", promptText(fmt.Sprintf("%d %x %s:", i, nonce, t.name), *tokens), *maxTokens, true)
			d, err := firstToken(client, t.url, body)
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			if i >= 0 {
				t.ms = append(t.ms, float64(d.Nanoseconds())/1e6)
			}
		}
	}
	p := targets[0]
	fmt.Printf("tokens=%d n=%d p50=%.3f p99=%.3f", *tokens, *n, percentile(p.ms, 0.5), percentile(p.ms, 0.99))
	if len(targets) > 1 {
		d := targets[1]
		fmt.Printf(" direct_p50=%.3f direct_p99=%.3f added_p50=%.3f added_p99=%.3f",
			percentile(d.ms, 0.5), percentile(d.ms, 0.99),
			percentile(p.ms, 0.5)-percentile(d.ms, 0.5), percentile(p.ms, 0.99)-percentile(d.ms, 0.99))
	}
	fmt.Println()
	return nil
}

// firstToken sends one streaming chat request and returns the time from
// sending it to reading the first event with content; it reads the stream
// to its end so that the connection is reused.
func firstToken(client *http.Client, base string, body []byte) (time.Duration, error) {
	start := time.Now()
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("HTTP %d: %s", resp.StatusCode, msg)
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var first time.Duration
	for {
		line, err := br.ReadSlice('\n')
		if first == 0 && hasContent(line) {
			first = time.Since(start)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if first == 0 {
		return 0, errors.New("stream ended without a content token")
	}
	return first, nil
}

// hasContent reports whether an SSE line carries a chunk with non-empty
// delta content (the role chunk's "content":"" does not count).
func hasContent(line []byte) bool {
	if !bytes.HasPrefix(line, []byte("data:")) {
		return false
	}
	_, after, ok := bytes.Cut(line, []byte(`"content":"`))
	return ok && len(after) > 0 && after[0] != '"'
}

// percentile of unsorted xs, q in [0, 1], interpolating between ranks.
func percentile(xs []float64, q float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return math.NaN()
	}
	pos := q * float64(len(s)-1)
	lo := int(pos)
	if lo+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[lo] + (pos-float64(lo))*(s[lo+1]-s[lo])
}

// runCheck sends one streaming and one non-streaming chat request (the
// wrk bodies) to url and checks what comes back: that a proxy in front of
// the canned upstream relays the 21-event stream whole and the answer
// intact, before any figure is trusted.
func runCheck(args []string) error {
	fs := flag.NewFlagSet("check", flag.ExitOnError)
	url := fs.String("url", "", "base `URL`")
	events := fs.Int("events", 21, "events a stream must have ([DONE] included; 0: any)")
	_ = fs.Parse(args)
	base := strings.TrimRight(*url, "/") + "/v1/chat/completions"
	client := &http.Client{Timeout: 30 * time.Second}
	text := promptText("Summarise this text.", 1000)

	resp, err := client.Post(base, "application/json", bytes.NewReader(chatBody("proxybench", "You are a helpful assistant.", text, streamTokens, true)))
	if err != nil {
		return err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	var nev, ntok int
	var last string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "data:") {
			nev++
			last = line
			if hasContent([]byte(line)) {
				ntok++
			}
		}
	}
	if resp.StatusCode != http.StatusOK || last != "data: [DONE]" || (*events > 0 && nev != *events) {
		return fmt.Errorf("stream from %s: HTTP %d, %d events (want %d), last %q", *url, resp.StatusCode, nev, *events, last)
	}

	resp, err = client.Post(base, "application/json", bytes.NewReader(chatBody("proxybench", "You are a helpful assistant.", text, streamTokens, false)))
	if err != nil {
		return err
	}
	data, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	var v struct {
		Object string `json:"object"`
		Usage  struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err != nil || resp.StatusCode != http.StatusOK || json.Unmarshal(data, &v) != nil || v.Object != "chat.completion" {
		return fmt.Errorf("answer from %s: HTTP %d, %.200q (%v)", *url, resp.StatusCode, data, err)
	}
	fmt.Printf("%s: stream %d events (%d with content, ending [DONE]), answer %d bytes, %d completion tokens\n",
		*url, nev, ntok, len(data), v.Usage.CompletionTokens)
	return nil
}
