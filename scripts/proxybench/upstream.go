package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http/httputil"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
)

// The canned upstream stands for an SGLang replica that answers at once:
// whatever the proxy in front of it costs is then the whole difference
// between proxies. It must never be the bottleneck, so it is a bare
// HTTP/1.1 server on net.Conn (no net/http: no per-request header maps,
// goroutines or allocations) writing bytes precomputed at start-up. It
// still reads every request body whole, and flushes every SSE event on its
// own, as an engine emitting one token after another does.

// streamTokens is how many one-token content chunks a canned stream has:
// with the role chunk, the finish chunk, the usage chunk and [DONE] that
// makes 21 events, the figure the measurements are quoted for.
const streamTokens = 17

const (
	cannedModel   = "proxybench"
	cannedID      = "chatcmpl-0123456789abcdef0123456789abcdef"
	cannedCreated = 1767225600
	// cannedCapacity is the KV capacity /metrics reports (the paper
	// profile's): the proxy sizes each replica's prefix index from it.
	cannedCapacity = 983549
	cannedPrompt   = 1000 // prompt_tokens in usage; the body's size is not looked at
)

// canned holds the precomputed responses, HTTP framing included.
type canned struct {
	health, metrics, models, notFound []byte
	chat, completion                  []byte // non-streaming answers, whole
	streamHead                        []byte // status line and headers of a stream
	// chatEvents and completionEvents are a stream's events, each framed as
	// one HTTP chunk; the last ([DONE]) carries the terminating chunk too.
	// usage is the usage chunk, sent only when the request asked for it.
	chatEvents, completionEvents []([]byte)
	chatUsage, completionUsage   []byte
	// coalesce writes a whole stream, headers and events, in one write
	// instead of one write each (a diagnostic: what a proxy costs when
	// the stream reaches it in one piece, as a stream whose events are
	// all ready at once, or a fast upstream behind a busy proxy, does).
	coalesce bool
}

func response(status, contentType string, body string) []byte {
	return fmt.Appendf(nil, "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s", status, contentType, len(body), body)
}

// chunk frames one SSE event as an HTTP/1.1 chunk.
func chunk(event string) []byte {
	return fmt.Appendf(nil, "%x\r\n%s\r\n", len(event), event)
}

func newCanned() *canned {
	c := &canned{}
	c.health = response("200 OK", "text/plain", "")
	c.notFound = response("404 Not Found", "application/json", `{"object":"error","message":"Not Found","type":"NotFoundError","param":null,"code":404}`)
	// The gauges gorgo's scraper reads (internal/signal/engine_metrics.go),
	// with SGLang's names and labels. An idle engine with a full-size cache.
	labels := `{engine_type="unified",model_name="` + cannedModel + `",moe_ep_rank="0",pp_rank="0",tp_rank="0"}`
	var m strings.Builder
	for _, g := range []struct {
		name, help string
		value      float64
	}{
		{"num_running_reqs", "The number of running requests.", 0},
		{"num_queue_reqs", "The number of requests in the waiting queue.", 0},
		{"num_used_tokens", "The number of used tokens.", 0},
		{"token_usage", "The token usage.", 0},
		{"max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", cannedCapacity},
		{"cache_hit_rate", "The prefix cache hit rate.", 0},
		{"gen_throughput", "The generation throughput (token/s).", 0},
	} {
		fmt.Fprintf(&m, "# HELP sglang:%s %s\n# TYPE sglang:%s gauge\nsglang:%s%s %g\n", g.name, g.help, g.name, g.name, labels, g.value)
	}
	c.metrics = response("200 OK", "text/plain; version=0.0.4; charset=utf-8", m.String())
	c.models = response("200 OK", "application/json",
		`{"object":"list","data":[{"id":"`+cannedModel+`","object":"model","created":`+strconv.Itoa(cannedCreated)+`,"owned_by":"sglang","root":"`+cannedModel+`","max_model_len":262144}]}`)

	// The shapes SGLang sends (its chunks carry explicit nulls and
	// matched_stop; 151645 is Qwen's <|im_end|>).
	words := make([]string, streamTokens)
	for i := range words {
		words[i] = " " + fillerWords[i%len(fillerWords)]
	}
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":0},"reasoning_tokens":0}`,
		cannedPrompt, cannedPrompt+streamTokens, streamTokens)
	head := func(object string) string {
		return `{"id":"` + cannedID + `","object":"` + object + `","created":` + strconv.Itoa(cannedCreated) + `,"model":"` + cannedModel + `",`
	}
	event := func(s string) string { return "data: " + s + "\n\n" }
	done := "data: [DONE]\n\n"

	chatHead := head("chat.completion.chunk")
	delta := func(role, content string) string {
		return `"delta":{"role":` + role + `,"content":` + content + `,"reasoning_content":null,"tool_calls":null}`
	}
	c.chatEvents = append(c.chatEvents, chunk(event(chatHead+`"choices":[{"index":0,`+delta(`"assistant"`, `""`)+`,"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`)))
	for _, w := range words {
		c.chatEvents = append(c.chatEvents, chunk(event(chatHead+`"choices":[{"index":0,`+delta("null", `"`+w+`"`)+`,"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`)))
	}
	c.chatEvents = append(c.chatEvents, chunk(event(chatHead+`"choices":[{"index":0,`+delta("null", "null")+`,"logprobs":null,"finish_reason":"stop","matched_stop":151645}],"usage":null}`)))
	c.chatUsage = chunk(event(chatHead + `"choices":[],"usage":` + usage + `}`))
	c.chatEvents = append(c.chatEvents, append(chunk(done), "0\r\n\r\n"...))

	cmplHead := head("text_completion")
	for _, w := range words {
		c.completionEvents = append(c.completionEvents, chunk(event(cmplHead+`"choices":[{"index":0,"text":"`+w+`","logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`)))
	}
	c.completionEvents = append(c.completionEvents, chunk(event(cmplHead+`"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop","matched_stop":151645}],"usage":null}`)))
	c.completionUsage = chunk(event(cmplHead + `"choices":[],"usage":` + usage + `}`))
	c.completionEvents = append(c.completionEvents, append(chunk(done), "0\r\n\r\n"...))

	text := strings.Join(words, "")
	c.chat = response("200 OK", "application/json", head("chat.completion")+
		`"choices":[{"index":0,"message":{"role":"assistant","content":"`+text+`","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"stop","matched_stop":151645}],"usage":`+usage+`,"metadata":{"weight_version":"default"}}`)
	c.completion = response("200 OK", "application/json", head("text_completion")+
		`"choices":[{"index":0,"text":"`+text+`","logprobs":null,"finish_reason":"stop","matched_stop":151645}],"usage":`+usage+`,"metadata":{"weight_version":"default"}}`)
	c.streamHead = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
	return c
}

func runUpstream(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:18000", "`ADDR`s to listen on, comma-separated (one process serving several replicas)")
	coalesce := fs.Bool("coalesce", false, "write each stream whole (headers and events) in one write, not one write per event (diagnostic)")
	_ = fs.Parse(args)
	c := newCanned()
	c.coalesce = *coalesce
	for _, addr := range strings.Split(*listen, ",") {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					log.Printf("accept: %v", err)
					return
				}
				go c.serveConn(conn)
			}
		}()
	}
	fmt.Printf("proxybench upstream: canned SGLang replica on %s (%d-event streams)\n", *listen, len(c.chatEvents)+1)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	return nil
}

var errBadRequest = errors.New("bad request")

// serveConn answers the requests of one keep-alive connection in turn.
func (c *canned) serveConn(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReaderSize(conn, 64<<10)
	bw := bufio.NewWriterSize(conn, 16<<10)
	var body []byte
	for {
		keep, err := c.serveOne(br, bw, conn, &body)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				if errors.Is(err, errBadRequest) {
					_, _ = conn.Write(response("400 Bad Request", "text/plain", err.Error()))
				}
			}
			return
		}
		if !keep {
			return
		}
	}
}

// serveOne reads one request (line, headers, whole body) and writes its
// answer; it reports whether the connection stays open.
func (c *canned) serveOne(br *bufio.Reader, bw *bufio.Writer, conn net.Conn, body *[]byte) (keep bool, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return false, err
	}
	method, rest, ok1 := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(" "))
	path, _, ok2 := bytes.Cut(rest, []byte(" "))
	if !ok1 || !ok2 {
		return false, fmt.Errorf("%w: request line %q", errBadRequest, line)
	}
	if i := bytes.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	// Classify the route now: line is only valid until the next read.
	const (
		rNotFound = iota
		rHealth
		rMetrics
		rModels
		rChat
		rCompletion
	)
	route := rNotFound
	switch get, post := string(method) == "GET", string(method) == "POST"; {
	case get && string(path) == "/health":
		route = rHealth
	case get && string(path) == "/metrics":
		route = rMetrics
	case get && string(path) == "/v1/models":
		route = rModels
	case post && string(path) == "/v1/chat/completions":
		route = rChat
	case post && string(path) == "/v1/completions":
		route = rCompletion
	}

	length, chunked, expect := 0, false, false
	keep = true
	for {
		h, err := br.ReadSlice('\n')
		if err != nil {
			return false, err
		}
		h = bytes.TrimRight(h, "\r\n")
		if len(h) == 0 {
			break
		}
		name, value, _ := bytes.Cut(h, []byte(":"))
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil || length < 0 {
				return false, fmt.Errorf("%w: Content-Length %q", errBadRequest, value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			keep = !bytes.EqualFold(value, []byte("close"))
		case bytes.EqualFold(name, []byte("Expect")):
			expect = bytes.EqualFold(value, []byte("100-continue"))
		}
	}
	if expect {
		if _, err := conn.Write([]byte("HTTP/1.1 100 Continue\r\n\r\n")); err != nil {
			return false, err
		}
	}
	// Read the whole body, as an engine does before it starts.
	switch {
	case chunked:
		b := bytes.NewBuffer((*body)[:0])
		if _, err := b.ReadFrom(httputil.NewChunkedReader(br)); err != nil {
			return false, err
		}
		*body = b.Bytes()
		for { // trailers, up to the blank line
			t, err := br.ReadSlice('\n')
			if err != nil {
				return false, err
			}
			if len(bytes.TrimRight(t, "\r\n")) == 0 {
				break
			}
		}
	default:
		if cap(*body) < length {
			*body = make([]byte, length)
		}
		*body = (*body)[:length]
		if _, err := io.ReadFull(br, *body); err != nil {
			return false, err
		}
	}

	var whole []byte
	switch route {
	case rHealth:
		whole = c.health
	case rMetrics:
		whole = c.metrics
	case rModels:
		whole = c.models
	case rChat, rCompletion:
		if jsonTrue(*body, `"stream"`) {
			events, usage := c.chatEvents, c.chatUsage
			if route == rCompletion {
				events, usage = c.completionEvents, c.completionUsage
			}
			return keep, c.stream(bw, events, usage, jsonTrue(*body, `"include_usage"`))
		}
		whole = c.chat
		if route == rCompletion {
			whole = c.completion
		}
	default:
		whole = c.notFound
	}
	if _, err := bw.Write(whole); err != nil {
		return false, err
	}
	return keep, bw.Flush()
}

// stream writes a canned SSE stream: the headers at once (an engine sends
// them before its prefill), then one write per event, as the tokens of a
// real stream leave the engine one by one.
func (c *canned) stream(bw *bufio.Writer, events [][]byte, usage []byte, withUsage bool) error {
	if _, err := bw.Write(c.streamHead); err != nil {
		return err
	}
	if !c.coalesce {
		if err := bw.Flush(); err != nil {
			return err
		}
	}
	for i, ev := range events {
		if i == len(events)-1 && withUsage {
			bw.Write(usage)
			if !c.coalesce {
				if err := bw.Flush(); err != nil {
					return err
				}
			}
		}
		bw.Write(ev)
		if c.coalesce {
			continue
		}
		if err := bw.Flush(); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// jsonTrue reports whether key (quoted) appears in a JSON body with the
// value true. A quoted key cannot appear inside a JSON string (its quotes
// would be escaped), so a substring search is enough for these bodies.
func jsonTrue(body []byte, key string) bool {
	for {
		i := bytes.Index(body, []byte(key))
		if i < 0 {
			return false
		}
		body = bytes.TrimLeft(body[i+len(key):], " \t\r\n")
		if len(body) > 0 && body[0] == ':' {
			v := bytes.TrimLeft(body[1:], " \t\r\n")
			return bytes.HasPrefix(v, []byte("true"))
		}
	}
}
