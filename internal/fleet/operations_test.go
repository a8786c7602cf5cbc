package fleet

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/gorgo-llm/gorgo/internal/lifecycle"
)

// vLLM's /pause and /resume (its development mode's, around a trainer's
// weights' update) are operations for the whole fleet, as SGLang's
// /pause_generation and /continue_generation are: a pause in mode "abort"
// (the default) is a client's abort of all, and it empties the engines'
// caches unless it keeps its requests or is told not to.
func TestVLLMPause(t *testing.T) {
	for _, path := range []string{"/pause", "/resume"} {
		if !IsOperation("POST", path) || !wholeFleet(path) || IsOperation("GET", path) {
			t.Errorf("POST %s: an operation %v, for the whole fleet %v", path, IsOperation("POST", path), wholeFleet(path))
		}
	}
	for uri, want := range map[string]bool{
		"/pause": true, "/pause?mode=abort": true, "/pause?mode=wait": false, "/pause?mode=keep": false,
		"/pause?wait_for_inflight_requests=true": false, "/pause?wait_for_inflight_requests=false": true,
		"/pause?mode=abort&wait_for_inflight_requests=true": false, "/pause?mode=abort&wait_for_inflight_requests=maybe": false,
		"/pause?mode=abort&wait_for_inflight_requests=0": true, "/resume": false,
	} {
		if _, got := AbortOf(uri, nil); got != want {
			t.Errorf("%s: an abort %v, want %v", uri, got, want)
		}
	}
	for uri, want := range map[string]bool{
		"/pause": true, "/pause?mode=wait": true, "/pause?mode=keep": false, "/pause?clear_cache=false": false,
		"/pause?clear_cache=0": false, "/pause?clear_cache=true": true, "/resume": false, "/flush_cache": true,
	} {
		if got := flushes(uri); got != want {
			t.Errorf("%s: flushes %v, want %v", uri, got, want)
		}
	}
	if !long("/pause") || long("/resume") {
		t.Error("/pause may wait for the engines' requests to end: a long operation; /resume is not")
	}
}

// vLLM's /abort_requests is an abort of the engine ids it names (as
// {"request_ids": [...]}: lifecycle reads them, and matches them
// exactly; nothing else in the body counts), or of all where request_ids
// is missing or reads as false in Python, as vLLM's "if request_ids"
// (review, 2026-12-06: "", {} and false were no abort, and the engines'
// aborts of all failed over; the body was passed on whole, so that an
// "abort_all" beside the ids read as an abort of all).
func TestVLLMAbortRequests(t *testing.T) {
	if !IsOperation("POST", "/abort_requests") || wholeFleet("/abort_requests") {
		t.Error("/abort_requests: an operation for the replicas up")
	}
	for body, want := range map[string]string{
		`{}`: `{"abort_all":true}`, `{"request_ids":[]}`: `{"abort_all":true}`, `{"request_ids":null}`: `{"abort_all":true}`,
		`{"request_ids":""}`: `{"abort_all":true}`, `{"request_ids":{}}`: `{"abort_all":true}`, `{"request_ids":false}`: `{"abort_all":true}`,
		`{"request_ids":0}`:                         `{"abort_all":true}`,
		`{"request_ids":["cmpl-a-0","chatcmpl-b"]}`: `{"request_ids":["cmpl-a-0","chatcmpl-b"]}`, `{"request_ids":"chatcmpl-c"}`: `{"request_ids":["chatcmpl-c"]}`,
		`{"request_ids":["chatcmpl-x"],"abort_all":true}`: `{"request_ids":["chatcmpl-x"]}`,
		`{"request_ids":[7]}`:                             "", `{"request_ids":[""]}`: "", `{"request_ids":true}`: "", `{`: "",
	} {
		abort, ok := AbortOf("/abort_requests", []byte(body))
		if string(abort) != want || ok != (want != "") {
			t.Errorf("%s: %s %v, want %s", body, abort, ok, want)
		}
	}
}

// vLLM's /abort_requests reads as vLLM's "if request_ids" does (an abort
// of all where the ids are missing or read as false in Python), and a
// list of ids past lifecycle.MaxAbortRIDs is passed on as its first lifecycle.MaxAbortRIDs
// (2026-12-07, a review: a body of a million ids was made into a million
// values first).
func TestVLLMAbortBody(t *testing.T) {
	all := string(abortAll)
	for body, want := range map[string]string{
		`{}`: all, `null`: all, `{"request_ids":null}`: all, `{"request_ids":false}`: all, `{"request_ids":0}`: all,
		`{"request_ids":""}`: all, `{"request_ids":[]}`: all, `{"request_ids":{}}`: all,
		`{"request_ids":"a"}`: `{"request_ids":["a"]}`, `{"request_ids":["a","",3,"b"]}`: `{"request_ids":["a","b"]}`,
		`{"request_ids":true}`: "", `{"request_ids":2}`: "", `{"request_ids":{"a":1}}`: "", `{"request_ids":[1]}`: "",
		`[1]`: "", `"a"`: "", `{"request_ids":`: "",
	} {
		got, ok := vllmAbort([]byte(body))
		if string(got) != want || ok != (want != "") {
			t.Errorf("%s: %s %v, want %s", body, got, ok, want)
		}
	}
	var b strings.Builder
	b.WriteString(`{"request_ids":["x"`)
	for i := range lifecycle.MaxAbortRIDs + 10 {
		fmt.Fprintf(&b, `,"i%d"`, i)
	}
	b.WriteString(`]}`)
	got, _ := vllmAbort([]byte(b.String()))
	var ids struct {
		IDs []string `json:"request_ids"`
	}
	if err := json.Unmarshal(got, &ids); err != nil || len(ids.IDs) != lifecycle.MaxAbortRIDs {
		t.Errorf("an abort of %d ids passed on with %d (%v), want %d", lifecycle.MaxAbortRIDs+11, len(ids.IDs), err, lifecycle.MaxAbortRIDs)
	}
}

// A vLLM abort body nested 8 Mi levels deep is refused, not a crash
// (2026-12-07, a review: gjson's validator recursed once per level).
func TestDeepVLLMAbortBodyIsRefused(t *testing.T) {
	if _, ok := vllmAbort(bytes.Repeat([]byte{'['}, 8<<20)); ok {
		t.Error("a body of 8 MiB of '[' read as an abort")
	}
}
