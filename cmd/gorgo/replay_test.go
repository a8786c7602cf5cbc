package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// fakeOpenAI answers chat completions with a short stream naming a replica,
// and fails the requests of session "bad" with a 400.
func fakeOpenAI(t *testing.T, calls *atomic.Int32) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"data":[{"id":"fake"}]}`)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Header.Get("X-Session-ID") == "bad" {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"object":"error","message":"no","code":400}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Gorgo-Replica", "r1")
		for _, tok := range []string{"a", "b"} {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":%q}}]}\n\n", tok)
			w.(http.Flusher).Flush()
			time.Sleep(2 * time.Millisecond)
		}
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":600,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":512}}}\n\ndata: [DONE]\n\n")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func writeTinyTrace(t *testing.T, dir string) string {
	t.Helper()
	reqs := []trace.Request{
		{Time: 0, Session: "s1", Turn: 1, InputTokens: 600, OutputTokens: 2, HashIDs: []uint64{1, 2}},
		{Time: 20 * time.Millisecond, Session: "bad", Turn: 1, InputTokens: 10, OutputTokens: 2, HashIDs: []uint64{3}},
		{Time: 40 * time.Millisecond, Session: "s1", Turn: 2, InputTokens: 700, OutputTokens: 2, HashIDs: []uint64{1, 4},
			Messages: []trace.Message{{Role: "user", Content: "hello"}}},
	}
	path := filepath.Join(dir, "tiny.jsonl")
	var buf bytes.Buffer
	if err := trace.Write(&buf, reqs); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReplayCommandWritesRecordsAndJSON(t *testing.T) {
	var calls atomic.Int32
	srv := fakeOpenAI(t, &calls)
	dir := t.TempDir()
	tr := writeTinyTrace(t, dir)
	js := filepath.Join(dir, "runs.json")
	recs := filepath.Join(dir, "recs.jsonl")
	var out, errb bytes.Buffer
	err := runReplay([]string{"--target", srv.URL, "--trace", tr, "--time-scale", "2", "--max-inflight", "2",
		"--label", "emulated", "--json", js, "--records", recs}, &out, &errb)
	if err != nil {
		t.Fatalf("runReplay: %v\n%s", err, errb.String())
	}
	t.Logf("output:\n%s", out.String())
	for _, want := range []string{"target: " + srv.URL + ", model fake, at most 2 in flight", "workload: " + tr + ": 3 requests", "time scale 2", "emulated", "TTFT p50", "replayed 3 of 3 requests"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("server got %d requests, want 3", n)
	}

	f, err := os.Open(recs)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []report.Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r report.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if len(got) != 3 {
		t.Fatalf("%d records", len(got))
	}
	if r := got[0]; r.Failed || r.Status != 200 || r.Replica != "r1" || r.OutputTokens != 2 || r.CachedTokens != 512 || r.TTFT <= 0 {
		t.Errorf("first record %+v", r)
	}
	if r := got[1]; !r.Failed || r.Status != 400 || r.Error != "HTTP 400: no" || r.Arrival != 40 {
		t.Errorf("second record %+v (want failed with a 400, due at 40 ms after the time scale)", r)
	}

	data, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Runs []report.Run `json:"runs"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Runs) != 1 {
		t.Fatalf("%d runs", len(doc.Runs))
	}
	if r := doc.Runs[0]; r.Policy != "emulated" || r.Requests != 3 || r.Completed != 2 || r.Failed != 1 || r.ReplicaShare["r1"] == 0 || r.TTFT.P50 <= 0 {
		t.Errorf("run %+v", r)
	}
}

func TestReplayCommandBadInput(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	tr := writeTinyTrace(t, t.TempDir())
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--trace", tr}, "--target is required"},
		{[]string{"--target", "localhost:8080", "--trace", tr}, `target "localhost:8080": want an http://`},
		{[]string{"--target", closed, "--trace", tr}, "unreachable"},
		{[]string{"--target", closed, "--trace", tr, "--max-inflight", "-1"}, "--max-inflight"},
		{[]string{"--target", closed, "--trace", filepath.Join(t.TempDir(), "none.jsonl")}, "no such file"},
		{[]string{"--target", closed, "extra"}, "unexpected arguments"},
		{[]string{"--target", closed, "--trace", tr, "--unstreamed", "1.5"}, "--unstreamed must be between 0 and 1"},
		{[]string{"--target", closed, "--trace", tr, "--unstreamed", "NaN"}, "--unstreamed must be between 0 and 1"},
		{[]string{"--target", closed, "--trace", tr, "--request-timeout", "-1s"}, "--request-timeout must not be negative"},
	} {
		var out, errb bytes.Buffer
		err := runReplay(tt.args, &out, &errb)
		t.Logf("%q: %v", tt.args, err)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("runReplay %q: error %v, want one line with %q", tt.args, err, tt.want)
		}
	}
	var out, errb bytes.Buffer
	if err := runReplay([]string{"--no-such-flag"}, &out, &errb); err != errUsage {
		t.Errorf("bad flag: %v, want errUsage", err)
	}
}

// A replay whose every request fails (a model the target does not serve)
// says why and exits with an error, rather than a table of failures and
// exit 0; the records are still written.
func TestReplayCommandSaysWhyEveryRequestFailed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error":{"message":"The model nope does not exist.","type":"NotFoundError","code":404}}`)
	}))
	defer srv.Close()
	dir := t.TempDir()
	tr := writeTinyTrace(t, dir)
	recs := filepath.Join(dir, "recs.jsonl")
	var out, errb bytes.Buffer
	err := runReplay([]string{"--target", srv.URL, "--trace", tr, "--model", "nope", "--records", recs}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "every request failed") || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("runReplay: %v; want every request failed, and why", err)
	}
	if !strings.Contains(out.String(), "3 failed; the most common error:") {
		t.Errorf("output lacks the failures:\n%s", out.String())
	}
	if _, err := os.Stat(recs); err != nil {
		t.Errorf("records not written: %v", err)
	}
}

// A target that asks for client keys (gorgo serve's auth) is sent
// $OPENAI_API_KEY, or --api-key-file's, as OpenAI's clients send theirs;
// without one, the replay stops at once and says so (2026-12-07, a
// user's test: every request failed with a 401, and replay had no way to
// send a key).
func TestReplayCommandSendsTheAPIKey(t *testing.T) {
	var calls atomic.Int32
	inner := fakeOpenAI(t, &calls)
	var keys sync.Map // the keys the requests carried
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		keys.Store(auth, true)
		if auth != "Bearer sk-test-key" {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":{"message":"a valid API key is required","type":"AuthenticationError","code":401}}`)
			return
		}
		proxy := httptest.NewRequest(r.Method, inner.URL+r.URL.Path, r.Body)
		proxy.RequestURI = ""
		proxy.Header = r.Header
		resp, err := http.DefaultClient.Do(proxy)
		if err != nil {
			t.Error(err)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("X-Gorgo-Replica", resp.Header.Get("X-Gorgo-Replica"))
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	defer srv.Close()
	dir := t.TempDir()
	tr := writeTinyTrace(t, dir)
	var out, errb bytes.Buffer
	t.Setenv("OPENAI_API_KEY", "")
	if err := runReplay([]string{"--target", srv.URL, "--trace", tr, "--quiet"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "refused the client (401: a valid API key is required)") || !strings.Contains(err.Error(), "OPENAI_API_KEY") {
		t.Errorf("without a key: %v; want the refusal, and how to give a key", err)
	}
	t.Setenv("OPENAI_API_KEY", "sk-test-key")
	if err := runReplay([]string{"--target", srv.URL, "--trace", tr, "--quiet"}, &out, &errb); err != nil {
		t.Errorf("with $OPENAI_API_KEY: %v", err)
	}
	keyFile := filepath.Join(dir, "key")
	os.WriteFile(keyFile, []byte("sk-test-key\nsecond line\n"), 0o600)
	t.Setenv("OPENAI_API_KEY", "sk-wrong")
	if err := runReplay([]string{"--target", srv.URL, "--trace", tr, "--quiet", "--api-key-file", keyFile}, &out, &errb); err != nil {
		t.Errorf("with --api-key-file over a wrong $OPENAI_API_KEY: %v", err)
	}
	if n := calls.Load(); n != 6 {
		t.Errorf("%d chats reached the server, want the 3 of each run with the key", n)
	}
	if err := runReplay([]string{"--target", srv.URL, "--trace", tr, "--api-key-file", filepath.Join(dir, "none")}, &out, &errb); err == nil || !strings.Contains(err.Error(), "--api-key-file") {
		t.Errorf("a key file that is not there: %v", err)
	}
	if _, err := os.Stat("/dev/zero"); err == nil { // a file without end, read in bounded memory
		if err := runReplay([]string{"--target", srv.URL, "--trace", tr, "--api-key-file", "/dev/zero"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "has no key") {
			t.Errorf("--api-key-file /dev/zero: %v", err)
		}
	}
}
