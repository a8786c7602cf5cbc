package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/fleet"
)

// hostileReplica serves /health and, for any POST, what answer writes.
func hostileReplica(t *testing.T, answer func(w http.ResponseWriter)) (url string, posts *atomic.Int64) {
	t.Helper()
	posts = new(atomic.Int64)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusOK) // /health; /metrics fails to parse, which only logs
			return
		}
		posts.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		answer(w)
	}))
	t.Cleanup(ts.Close)
	return ts.URL, posts
}

// peakHeap samples the heap in use until stop is called, and returns the
// largest figure seen.
func peakHeap() (stop func() uint64) {
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return func() uint64 {
		close(done)
		wg.Wait()
		return peak.Load()
	}
}

func heapNow() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// hugeBytes is the size of the hostile answers: 256 MB (less under the race
// detector, which makes every copy slow).
var hugeBytes = func() int {
	if raceEnabled {
		return 32 << 20
	}
	return 256 << 20
}()

// writeRepeated writes n bytes of b repeated, from one buffer.
func writeRepeated(w io.Writer, b byte, n int) {
	chunk := bytes.Repeat([]byte{b}, 1<<20)
	for n > 0 {
		k := min(n, len(chunk))
		if _, err := w.Write(chunk[:k]); err != nil {
			return
		}
		n -= k
	}
}

// proxyOver runs a proxy in front of the given replica URLs.
func proxyOver(t *testing.T, cfg testConfig, urls ...string) (*testRouter, string) {
	t.Helper()
	for i, u := range urls {
		cfg.Fleet.Replicas = append(cfg.Fleet.Replicas, fleet.ReplicaConfig{ID: string(rune('a' + i)), URL: u, Region: "r" + string(rune('a'+i)), Profile: "paper"})
	}
	return startProxy(t, cfg)
}

// A replica that streams one SSE event of hundreds of MB, with no blank
// line for all that time, is relayed whole to the client while the
// proxy's memory stays put: the event is passed through unpeeked once it
// is longer than the relay holds.
func TestHugeEventIsPassedThroughInBoundedMemory(t *testing.T) {
	url, _ := hostileReplica(t, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: ")
		writeRepeated(w, 'x', hugeBytes)
		_, _ = io.WriteString(w, "\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n")
	})
	_, purl := proxyOver(t, testConfig{}, url)
	base := heapNow()
	stop := peakHeap()
	resp, err := http.Post(purl+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("hello", 10, true)))
	if err != nil {
		t.Fatal(err)
	}
	// Read it all, keeping only its ends.
	var head, tail bytes.Buffer
	n, err := io.Copy(&ends{head: &head, tail: &tail}, resp.Body)
	resp.Body.Close()
	peak := stop()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, read %d bytes: %v", resp.StatusCode, n, err)
	}
	if want := int64(hugeBytes); n < want {
		t.Fatalf("the client got %d bytes, want more than %d", n, want)
	}
	if !strings.HasPrefix(head.String(), "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: xxx") ||
		!strings.HasSuffix(tail.String(), "xxx\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n") {
		t.Fatalf("the stream's ends were not relayed as sent: %q ... %q", head.String(), tail.String())
	}
	grew := int64(peak) - int64(base)
	t.Logf("heap in use: %d MB before, %d MB at most while relaying %d MB", base>>20, peak>>20, n>>20)
	if grew > 16<<20 {
		t.Errorf("the proxy's heap grew by %d MB while relaying one %d MB event", grew>>20, hugeBytes>>20)
	}
}

// A non-streaming answer of hundreds of MB is passed through as it comes,
// beyond what the relay holds, in bounded memory.
func TestHugeAnswerIsPassedThroughInBoundedMemory(t *testing.T) {
	url, _ := hostileReplica(t, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"`)
		writeRepeated(w, 'x', hugeBytes)
		_, _ = io.WriteString(w, `"}}]}`)
	})
	_, purl := proxyOver(t, testConfig{}, url)
	base := heapNow()
	stop := peakHeap()
	resp, err := http.Post(purl+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("hello", 10, false)))
	if err != nil {
		t.Fatal(err)
	}
	var head, tail bytes.Buffer
	n, err := io.Copy(&ends{head: &head, tail: &tail}, resp.Body)
	resp.Body.Close()
	peak := stop()
	if err != nil || resp.StatusCode != http.StatusOK || n != int64(hugeBytes+len(`{"choices":[{"message":{"content":"`)+len(`"}}]}`)) {
		t.Fatalf("status %d, read %d bytes: %v", resp.StatusCode, n, err)
	}
	if !strings.HasSuffix(tail.String(), `xx"}}]}`) {
		t.Fatalf("the answer's end was not relayed: %q", tail.String())
	}
	grew := int64(peak) - int64(base)
	t.Logf("heap in use: %d MB before, %d MB at most while relaying %d MB", base>>20, peak>>20, n>>20)
	if grew > 16<<20 {
		t.Errorf("the proxy's heap grew by %d MB while relaying a %d MB answer", grew>>20, hugeBytes>>20)
	}
}

// ends keeps the first and last 256 bytes written to it.
type ends struct{ head, tail *bytes.Buffer }

func (e *ends) Write(p []byte) (int, error) {
	if k := 256 - e.head.Len(); k > 0 {
		e.head.Write(p[:min(k, len(p))])
	}
	e.tail.Write(p[max(0, len(p)-256):])
	if e.tail.Len() > 512 {
		b := e.tail.Bytes()[e.tail.Len()-256:]
		e.tail.Reset()
		e.tail.Write(b)
	}
	return len(p), nil
}

// A replica whose response headers run to a megabyte fails the attempt, as
// its own fault, and the request is served by the next replica: the client
// never sees the header.
func TestHugeResponseHeaderFailsOver(t *testing.T) {
	big := strings.Repeat("h", 1<<20)
	bad, badPosts := hostileReplica(t, func(w http.ResponseWriter) {
		w.Header().Set("X-Huge", big)
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"bad"}}]}`)
	})
	// The hostile replica is the nearer: the policy's choice until it is
	// ejected.
	good := startReplica(t, 200*time.Millisecond, emulator.Faults{})
	s, purl := proxyOver(t, testConfig{}, bad, good.URL)
	for i := range 3 {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, purl+"/v1/chat/completions",
			strings.NewReader(chatBody("hello there "+string(rune('a'+i)), 5, false)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get(ReplicaHeader) != "b" || resp.Header.Get("X-Huge") != "" {
			t.Fatalf("request %d: status %d from %q (huge header %d bytes): %s", i, resp.StatusCode, resp.Header.Get(ReplicaHeader), len(resp.Header.Get("X-Huge")), body)
		}
	}
	if badPosts.Load() == 0 {
		t.Fatal("the hostile replica was never tried: the test proves nothing")
	}
	st, err := s.Router().Replica("a")
	if err != nil {
		t.Fatal(err)
	}
	if st.Healthy {
		t.Errorf("replica a failed %d attempts with a 1 MB header and is still up", badPosts.Load())
	}
}

// eventEnd finds the blank line that ends an event wherever the reads
// split it.
func TestEventEndAcrossReads(t *testing.T) {
	for _, stream := range []string{"xxxx\n\nyy", "xxxx\r\n\r\nyy", "xxxx\n\r\nyy"} {
		end := strings.Index(stream, "yy")
		for cut := 1; cut < len(stream); cut++ {
			prev, b := []byte(stream[:cut]), []byte(stream[cut:])
			got := -1
			if n := blankLine(prev); n >= 0 {
				got = n
			} else if n := eventEnd(prev, b); n >= 0 {
				got = cut + n
			}
			if got != end {
				t.Errorf("%q cut at %d: the event ends at %d, want %d", stream, cut, got, end)
			}
		}
	}
}
