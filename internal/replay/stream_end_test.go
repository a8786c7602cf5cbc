package replay

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/trace"
)

// A stream that the engine ends with finish_reason "abort" or "error"
// (vLLM's FINISH_REASON_STRINGS: stop, length, abort, error, repetition)
// was cut short by the server: it must be a failed record, not a success.
func TestAbortedStreamIsAFailure(t *testing.T) {
	for _, reason := range []string{"abort", "error"} {
		srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request, rec received) {
			s := startSSE(w)
			s.content("tok ")
			s.data(`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"` + reason + `"}]}`)
			s.usage(700, 1, 0)
			s.done()
		})
		res, err := Run(context.Background(), Config{Target: srv.URL, Requests: []trace.Request{request(0, "s", 700, 100)}})
		if err != nil {
			t.Fatal(err)
		}
		if rec := res.Records[0]; !rec.Failed {
			t.Errorf("finish_reason %q after 1 of 100 tokens: recorded as a success (%+v)", reason, rec)
		}
	}
}

// A stream that ends with [DONE] without a single generated token has no
// first token: it must not be a completed request with TTFT 0.
func TestStreamWithoutATokenIsAFailure(t *testing.T) {
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request, rec received) {
		s := startSSE(w)
		s.data(`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`)
		time.Sleep(30 * time.Millisecond)
		s.finish()
		s.done()
	})
	res, err := Run(context.Background(), Config{Target: srv.URL, Requests: []trace.Request{request(0, "s", 700, 5)}})
	if err != nil {
		t.Fatal(err)
	}
	if rec := res.Records[0]; !rec.Failed && rec.TTFT == 0 {
		t.Errorf("a stream with no token is a completed record with TTFT 0 ms (E2E %.1f ms), which pulls the TTFT percentiles down and meets any SLO", rec.E2E)
	}
}

// An engine may pack several tokens into one event: the token gap is the
// time between the first and the last event over the tokens the usage
// counts, not over the events.
func TestITLIsPerToken(t *testing.T) {
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request, rec received) {
		s := startSSE(w)
		for i := range 3 {
			if i > 0 {
				time.Sleep(60 * time.Millisecond)
			}
			s.content("ten tokens in one event ")
		}
		s.finish()
		s.usage(700, 30, 0)
		s.done()
	})
	res, err := Run(context.Background(), Config{Target: srv.URL, Requests: []trace.Request{request(0, "s", 700, 30)}})
	if err != nil {
		t.Fatal(err)
	}
	// 120 ms over 29 gaps is about 4 ms; per event it would be 60.
	if rec := res.Records[0]; rec.Failed || rec.ITL < 2 || rec.ITL > 30 {
		t.Errorf("ITL %.1f ms (failed %v) for 30 tokens in three events 60 ms apart, want about 4", rec.ITL, rec.Failed)
	}
}
