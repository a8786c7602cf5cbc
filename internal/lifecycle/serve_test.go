package lifecycle

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/wire"
)

// frontEnd is a FrontEnd of the test's own: each replica's attempt fails
// as fails says, or answers 200 with two tokens and [DONE].
type frontEnd struct {
	fails   map[string]*AttemptError
	sent    []string
	relayed int
	refused *wire.Error
	gone    context.CancelFunc // called at the first Send: the client leaves
}

func (f *frontEnd) Send(ctx context.Context, r *Request, id string) (int, *AttemptError) {
	f.sent = append(f.sent, id)
	if f.gone != nil {
		f.gone()
		return 0, &AttemptError{Error: *wire.Errorf(502, "cut")}
	}
	if e := f.fails[id]; e != nil {
		return 0, e
	}
	return 200, nil
}

func (f *frontEnd) Relay(r *Request) Outcome {
	f.relayed++
	tok := wire.PeekChunk([]byte(`{"choices":[{"delta":{"content":"hi"}}]}`))
	now := time.Now()
	r.Chunk(&tok, now)
	r.Chunk(&tok, now.Add(time.Millisecond))
	r.Done()
	return Outcome{Status: 200}
}

func (f *frontEnd) Refuse(e *wire.Error) { f.refused = e }

// Serve is the one order of a request's steps: attempts in rank order
// until one answers (failures counted against broken replicas only), then
// the relay, then the end; a bad body, no replica left, or a client gone
// are each handled once, by the same calls, whatever the front end.
func TestServeDrivesTheRequest(t *testing.T) {
	c, l, h, _ := setup(t)
	in := Incoming{Body: []byte(chat), Kind: Chat, Received: time.Now()}

	// a refuses (broken), b is busy (not broken), c serves.
	fe := &frontEnd{fails: map[string]*AttemptError{
		"a": {Error: *wire.Errorf(502, "refused"), Broken: true},
		"b": {Error: *wire.Errorf(503, "busy")},
	}}
	if st := c.Serve(context.Background(), in, fe); st != 200 {
		t.Fatalf("status %d", st)
	}
	if strings.Join(fe.sent, "") != "abc" || fe.relayed != 1 || fe.refused != nil {
		t.Errorf("sent %v, relayed %d, refused %v", fe.sent, fe.relayed, fe.refused)
	}
	if strings.Join(h.failures, "") != "a" || strings.Join(h.successes, "") != "c" || len(l.outcomes) != 1 {
		t.Errorf("health %v / %v, learned %d", h.failures, h.successes, len(l.outcomes))
	}
	for _, id := range []string{"a", "b", "c"} {
		if st, _ := c.cfg.Router.Replica(id); st.InFlight != 0 {
			t.Errorf("%s keeps %d in flight", id, st.InFlight)
		}
	}
	if st, _ := c.cfg.Router.Replica("c"); st.IndexBlocks == 0 {
		t.Error("the served prompt did not enter c's share of the index")
	}

	// Every attempt fails: the client hears the last one's error, once.
	fe = &frontEnd{fails: map[string]*AttemptError{
		"a": {Error: *wire.Errorf(503, "busy a")}, "b": {Error: *wire.Errorf(503, "busy b")}, "c": {Error: *wire.Errorf(503, "busy c")},
	}}
	if st := c.Serve(context.Background(), in, fe); st != 503 || fe.refused == nil || fe.refused.RetryAfter == "" || fe.relayed != 0 || len(fe.sent) != 3 {
		t.Errorf("all busy: status %d, refused %+v, sent %v", st, fe.refused, fe.sent)
	}

	// A bad body is refused before any attempt.
	fe = &frontEnd{}
	if st := c.Serve(context.Background(), Incoming{Body: []byte(`{"messages": [`), Kind: Chat}, fe); st != 400 || len(fe.sent) != 0 || fe.refused.Status != 400 {
		t.Errorf("bad body: status %d, sent %v, refused %+v", st, fe.sent, fe.refused)
	}

	// A client that leaves during an attempt: 499, nobody's fault, nothing
	// refused (nobody is listening).
	before := len(h.failures)
	ctx, cancel := context.WithCancel(context.Background())
	fe = &frontEnd{gone: cancel}
	var logs strings.Builder
	c.cfg.Log = slog.New(slog.NewTextHandler(&logs, nil))
	if st := c.Serve(ctx, in, fe); st != 499 || fe.refused != nil || len(h.failures) != before {
		t.Errorf("client gone: status %d, refused %+v, failures %v", st, fe.refused, h.failures)
	}
	// In the access log, with the replica it waited at (a user's test:
	// such requests were in the metrics alone).
	if l := logs.String(); !strings.Contains(l, "status=499") || !strings.Contains(l, "replica="+fe.sent[0]) {
		t.Errorf("the access log of a client gone: %q", l)
	}
	c.cfg.Log = nil

	// The subset a gateway allows is all the decision sees.
	fe = &frontEnd{}
	in.Allowed = func(id string) bool { return id == "b" }
	if st := c.Serve(context.Background(), in, fe); st != 200 || strings.Join(fe.sent, "") != "b" {
		t.Errorf("subset {b}: status %d, sent %v", st, fe.sent)
	}
}
