package router

import (
	"container/heap"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// A request whose answer is not streamed (policy.Request.Unstreamed) never
// tells the router of its first token: its headers come with its end. Left
// alone, its prompt would stay in the replica's prefill backlog until then,
// and the replica would look busier than it is for as long as the request
// decodes. The router instead releases it from the backlog when its
// forecast first token is due (Ticket.Sent + Ticket.Predicted), as if the
// token had come, at the first decision or forecast after that time. So
// too another router's request (Enter), whose first token this router
// hears of a leg between routers after it came: it leaves when due, or
// when the news comes, whichever is first.

// duePrompt is one such request's prompt at a replica.
type duePrompt struct {
	due    time.Duration
	sent   time.Duration
	tokens int64 // uncached prompt tokens in the backlog
	seqs   int64 // its answers' sequences (Ticket.seqs)
	// state: pending, released (its first token was due), or finished
	// (it ended before that); whoever moves it from pending settles the
	// ledger.
	state atomic.Int32
}

const (
	pending int32 = iota
	released
	finished
)

// dueQueue holds a replica's due prompts, earliest due
// first. next is the earliest due time (math.MaxInt64 when empty), read
// without the lock on every decision.
type dueQueue struct {
	mu   sync.Mutex
	h    dueHeap
	next atomic.Int64
	// compactAt is the length at which push drops the requests settled
	// before their first token was due (ended, or another router's whose
	// first token was heard of): they would otherwise stay until then, and
	// a forecast far in the future, or a router that decides nothing
	// there, keeps them long.
	compactAt int
}

type dueHeap []*duePrompt

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(*duePrompt)) }
func (h *dueHeap) Pop() any {
	old := *h
	u := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return u
}

func (q *dueQueue) init() { q.next.Store(math.MaxInt64) }

func (q *dueQueue) push(u *duePrompt) {
	q.mu.Lock()
	if len(q.h) >= q.compactAt {
		// Settled (ended, or released when another router's news of its
		// first token came: a review saw a quiet router's queue grow by
		// every mirrored request) is a no-op when popped.
		q.h = slices.DeleteFunc(q.h, func(v *duePrompt) bool { return v.state.Load() != pending }) // zeroes the tail
		heap.Init(&q.h)
		q.compactAt = max(64, 2*len(q.h))
	}
	heap.Push(&q.h, u)
	q.next.Store(int64(q.h[0].due))
	q.mu.Unlock()
}

// releaseDue moves the member's due prompts whose first token is
// due by now out of its prefill backlog and into its decoding count.
func (m *member) releaseDue(now time.Duration) {
	q := &m.due
	if int64(now) < q.next.Load() {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.h) > 0 && q.h[0].due <= now {
		u := heap.Pop(&q.h).(*duePrompt)
		if u.state.CompareAndSwap(pending, released) {
			m.backlog.Add(-u.tokens)
			m.waitSent.Add(-int64(u.sent) * u.seqs)
			m.decoding.Add(u.seqs)
		}
	}
	next := int64(math.MaxInt64)
	if len(q.h) > 0 {
		next = int64(q.h[0].due)
	}
	q.next.Store(next)
}

// releaseWhenDue has the ticket's prompt leave its replica's prefill
// backlog when its forecast first token is due (Sent + Predicted), at the
// first decision or forecast after that (releaseDue), unless it ends
// first, or, for another router's request, its first token is heard of
// first (FirstToken).
func (t *Ticket) releaseWhenDue() {
	t.due = &duePrompt{due: t.Sent + time.Duration(t.Predicted*1e6), sent: t.Sent, tokens: int64(t.uncached()), seqs: t.seqs}
	t.m.due.push(t.due)
}
