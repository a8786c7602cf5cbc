// Package replay replays a workload against any OpenAI-compatible endpoint
// (a router, an engine, gorgo's emulator), as the GORGO paper's client does,
// and measures every request.
//
// Requests are sent open loop at their trace times (offsets from the start
// of the replay; windows and time scale are the caller's) with a cap on the
// requests in flight: a request due while the cap is reached waits, first
// in first out, and the wait is its slip. Each is a streamed chat
// completion (POST {target}/v1/chat/completions; a share of them asked
// whole, Config.Unstreamed) whose prompt is the trace's messages or text
// synthesised from its block ids (see AppendContent); its stream is read
// to [DONE] and measured: time to first token, end to end time, mean
// inter-token latency, output, prompt and cached tokens, the HTTP status
// and any error.
//
// Unlike the rest of gorgo this is a real client and runs on the wall
// clock, through a Clock that tests may replace.
package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/gorgo-llm/gorgo/internal/report"
	"github.com/gorgo-llm/gorgo/internal/synth"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// DefaultMaxInflight is the paper client's cap on requests in flight.
const DefaultMaxInflight = 64

// Clock tells the time and waits. Implementations must be safe for
// concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// SleepUntil returns nil once the clock reaches t (at once if it has),
	// or ctx.Err() if ctx is done first.
	SleepUntil(ctx context.Context, t time.Time) error
}

// WallClock returns the real clock (time.Now and timers).
func WallClock() Clock { return wallClock{} }

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Config describes a replay.
type Config struct {
	// Target is the server's base URL, e.g. http://127.0.0.1:8080 (see
	// ParseTarget).
	Target string
	// Model is the model named in every request that the trace does not
	// name one for. Empty: the first model the target lists at GET
	// /v1/models (its bases before its adapters: Models), or DefaultModel
	// when it lists none.
	Model string
	// Requests are the requests to send, at their Time (offset from the
	// start of the replay); they need not be sorted. Each is sent with
	// max_tokens = max(OutputTokens, 1).
	Requests []trace.Request
	// MaxInflight caps the requests in flight; 0 or less means no cap.
	MaxInflight int
	// Client sends the requests. Nil: NewHTTPClient(MaxInflight).
	Client *http.Client
	// Clock times the replay. Nil: WallClock().
	Clock Clock
	// Progress, when set, is called with 1 each time a request finishes,
	// from the request's goroutine: several calls may run at once.
	Progress func(finished int)
	// Warm, if positive, opens this many connections to the target before
	// the first request (GET /v1/models, all at once), so that requests
	// find them open and their TTFT holds no connection setup, which the
	// simulator does not model; the client must keep as many idle
	// (NewHTTPClient keeps max(MaxInflight, 64)).
	Warm int
	// Ready, when set, is called once the replay is ready to send (the
	// target's models listed, its connections warmed) and returns the
	// instant, on Clock, of the trace's time 0, or an error that ends the
	// replay before it sends anything. Replays of one run's clients in
	// several places, each behind its own leg to its target, begin
	// together so (Together, on the same Clock): each alone would begin
	// when its own setup's round trips were over, the far ones later.
	// Nil: time 0 is when the replay is ready.
	Ready func(ctx context.Context) (time.Time, error)
	// Unstreamed is the share of requests that ask for their answers
	// whole (stream false), drawn by each request's index in time order
	// and Seed as the simulator draws them (trace.Unstreamed): their TTFT
	// is their E2E, as their client sees it.
	Unstreamed float64
	Seed       uint64
	// RequestTimeout, if positive, cuts a request not answered to its end
	// this long after it was sent, and fails it (a server that stalls
	// mid-answer would hold it, and the replay's end, for ever). It runs
	// on the wall clock, whatever Clock is. 0: none.
	RequestTimeout time.Duration
}

// ErrRequestTimeout is a request's error when Config.RequestTimeout cut
// it.
var ErrRequestTimeout = errors.New("no answer to its end within the request timeout")

// Together returns a Config.Ready for n replays that begin together: each
// waits until all n are ready, and all take the instant the last one was
// ready, on clock (nil: WallClock; give it the replays' Clock), as the trace's
// time 0; with n of 0 or less none waits. A wait ends early, with its
// error, when its ctx does: give the n replays a context that one's
// failure cancels (errgroup.WithContext), or the others wait for it.
func Together(n int, clock Clock) func(ctx context.Context) (time.Time, error) {
	if clock == nil {
		clock = WallClock()
	}
	if n <= 0 {
		return func(ctx context.Context) (time.Time, error) { return clock.Now(), ctx.Err() }
	}
	var mu sync.Mutex
	var at time.Time
	open := make(chan struct{})
	return func(ctx context.Context) (time.Time, error) {
		mu.Lock()
		if n--; n == 0 {
			at = clock.Now()
			close(open)
		}
		mu.Unlock()
		select {
		case <-open:
			return at, nil
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// Result is what a replay measured.
type Result struct {
	// Records has one record per request sent, in the order of
	// Config.Requests; Record.Index is the request's index there. Times are
	// in milliseconds: Arrival is the request's due time from the start,
	// Slip how much later it was sent, TTFT and E2E run from its sending to
	// the first token and to the end of its stream.
	Records []report.Record
	// Model is the model named by the requests whose trace names none.
	Model string
	// Elapsed is the wall time from the start to the last response.
	Elapsed time.Duration
	// Unsent counts the requests never sent because the replay was
	// interrupted.
	Unsent int
}

// Run replays cfg.Requests and returns the records. It fails at once on a
// bad target, or when the model must be discovered and the target cannot be
// reached; requests that fail later (HTTP errors, refused connections, cut
// streams) are failed records and the replay goes on. When ctx is done Run
// stops sending, cancels the requests in flight (recorded as failed) and
// returns what was measured with an error wrapping ctx.Err().
func Run(ctx context.Context, cfg Config) (*Result, error) {
	target, err := ParseTarget(cfg.Target)
	if err != nil {
		return nil, err
	}
	hc := cfg.Client
	if hc == nil {
		hc = NewHTTPClient(cfg.MaxInflight)
	}
	clock := cfg.Clock
	if clock == nil {
		clock = WallClock()
	}
	res := &Result{Model: cfg.Model}
	if res.Model == "" {
		ids, err := Models(ctx, hc, target)
		if err != nil {
			return nil, err
		}
		res.Model = DefaultModel
		if len(ids) > 0 {
			res.Model = ids[0]
		}
	}
	if cfg.Warm > 0 {
		warm(ctx, hc, target, cfg.Warm)
	}
	reqs := cfg.Requests
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(reqs[a].Time, reqs[b].Time) })
	whole := make([]bool, len(reqs))
	for k, i := range order {
		whole[i] = trace.Unstreamed(k, cfg.Seed, cfg.Unstreamed)
	}

	var sem chan struct{}
	if cfg.MaxInflight > 0 {
		sem = make(chan struct{}, cfg.MaxInflight)
	}
	s := &sender{hc: hc, url: target.JoinPath("v1", "chat", "completions").String(), clock: clock}
	recs := make([]report.Record, len(reqs))
	sent := make([]bool, len(reqs))
	var wg sync.WaitGroup
	start := clock.Now()
	if cfg.Ready != nil {
		if start, err = cfg.Ready(ctx); err != nil {
			return nil, fmt.Errorf("replay: waiting to begin: %w", err)
		}
	}
dispatch:
	for _, i := range order {
		r := &reqs[i]
		model := res.Model
		if r.Model != "" { // the trace names the request's model
			model = r.Model
		}
		body, err := encodeChat(model, synth.Messages(r), r.OutputTokens, r.Session, whole[i])
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		due := start.Add(r.Time)
		if clock.SleepUntil(ctx, due) != nil {
			break
		}
		if sem != nil {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				break dispatch
			}
		}
		if ctx.Err() != nil {
			break
		}
		at := clock.Now()
		sent[i] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx := ctx
			if cfg.RequestTimeout > 0 {
				var cancel context.CancelFunc
				rctx, cancel = context.WithTimeoutCause(ctx, cfg.RequestTimeout, ErrRequestTimeout)
				defer cancel()
			}
			o := s.send(rctx, body, r, at, whole[i])
			if sem != nil {
				<-sem
			}
			recs[i] = newRecord(i, r, at.Sub(due), &o)
			if cfg.Progress != nil {
				cfg.Progress(1)
			}
		}()
	}
	wg.Wait()
	res.Elapsed = clock.Now().Sub(start)
	res.Records = make([]report.Record, 0, len(reqs))
	for i := range recs {
		if sent[i] {
			res.Records = append(res.Records, recs[i])
		} else {
			res.Unsent++
		}
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("replay interrupted with %d of %d requests sent: %w", len(res.Records), len(reqs), err)
	}
	return res, nil
}

// newRecord turns a request's outcome into its record: usage when the
// server reported it, else the trace's prompt tokens and the counted
// chunks.
func newRecord(i int, r *trace.Request, slip time.Duration, o *outcome) report.Record {
	rec := report.Record{
		Index:        i,
		Session:      r.Session,
		Replica:      o.replica,
		Arrival:      ms(r.Time),
		Slip:         ms(max(slip, 0)),
		TTFT:         ms(o.ttft),
		E2E:          ms(o.e2e),
		ITL:          ms(o.itl),
		PromptTokens: r.InputTokens,
		OutputTokens: o.tokenChunks,
		Status:       o.status,
		Model:        r.Model,
		Tenant:       r.Tenant,
		Priority:     r.Priority,
		TTFTSLO:      ms(r.TTFTSLO),
		NewConn:      o.newConn,
		Whole:        o.whole,
	}
	if u := o.usage; u != nil {
		if u.PromptTokens > 0 {
			rec.PromptTokens = u.PromptTokens
		}
		rec.OutputTokens = u.CompletionTokens
		rec.CachedTokens = max(u.CachedTokens, 0)
	}
	if o.err != nil {
		rec.Failed = true
		rec.Error = o.err.Error()
		rec.Rejected = o.status == http.StatusTooManyRequests // refused by the router's flow control or limits
	}
	return rec
}

// ms converts a duration to milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// warm opens n connections to the target at once (their answers are read
// and dropped, leaving the connections idle for the replay).
func warm(ctx context.Context, hc *http.Client, target *url.URL, n int) {
	// Each request keeps its connection busy (its body unread) until all
	// n have an answer, so none can reuse another's and n are opened
	// however the goroutines happen to be scheduled.
	var wg, held sync.WaitGroup
	held.Add(n)
	for range n {
		wg.Go(func() {
			var resp *http.Response
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, target.JoinPath("v1", "models").String(), nil)
			if err == nil {
				resp, err = hc.Do(req)
			}
			held.Done()
			if err != nil {
				return
			}
			held.Wait()
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
		})
	}
	wg.Wait()
}
