package trace

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gorgo-llm/gorgo/internal/report"
)

// Dist summarises a distribution of token counts. Percentiles interpolate
// linearly between the closest ranks (NumPy's default).
type Dist struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	Mean float64 `json:"mean"`
	Max  int     `json:"max"`
}

// Reuse gives prefix reuse at block granularity, each as a fraction of all
// input tokens. For each request, the global prefix is the longest prefix
// (in tokens: min(blocks*BlockTokens, InputTokens)) it shares with any earlier
// request; the intra-session prefix is the longest it shares with an earlier
// request of its own session; cross-session = global - intra-session. The
// user figures are the same with users in place of sessions. Requests for
// different models share no prefix (engines key their caches by model and
// adapter), so with models only requests for the same model count.
type Reuse struct {
	Global       float64 `json:"global"`
	IntraSession float64 `json:"intra_session"`
	CrossSession float64 `json:"cross_session"`
	IntraUser    float64 `json:"intra_user"`
	CrossUser    float64 `json:"cross_user"`
}

// OutputError is the mean absolute error, in tokens, of estimates of each
// answer's length from the answers before it (in arrival order): Global
// from the running mean of all, Keyed from the router's estimate keyed by
// application and conversation. Keyed below Global says a request's
// application or conversation tells its answer's length. ComputeStats
// leaves it zero: replaying the router's estimator is the simulator's
// (sim.OutputError), and gorgo trace stats fills it so.
type OutputError struct {
	Global float64 `json:"global"`
	Keyed  float64 `json:"keyed"`
}

// Stats describes a workload. A request's turn is its Turn field, or, when
// that is 0 (unknown), its 1-based position among its session's requests in
// the trace. A request with an empty Session is a session of its own; a
// request with an empty User counts its session as its user, so a trace
// without users has Users == Sessions.
type Stats struct {
	// Requests is the number of requests.
	Requests int `json:"requests"`
	// DurationSeconds is the time from the first to the last arrival, in s.
	DurationSeconds float64 `json:"duration_s"`
	// RatePerSecond is Requests / DurationSeconds (0 when that is 0), in
	// requests per second.
	RatePerSecond float64 `json:"rate_per_s"`
	// DistinctArrivals counts the distinct arrival times; SimultaneousShare
	// is the fraction of requests that share theirs with another, and
	// LargestSimultaneous the most requests arriving at one instant: a
	// trace recorded in coarse ticks (see Spread).
	DistinctArrivals    int     `json:"distinct_arrivals"`
	SimultaneousShare   float64 `json:"simultaneous_share"`
	LargestSimultaneous int     `json:"largest_simultaneous"`
	// OutputError is how well an answer's length is told by the answers
	// before it.
	OutputError OutputError `json:"output_error"`
	// InputTokens is the distribution of prompt lengths, in tokens.
	InputTokens Dist `json:"input_tokens"`
	// OutputTokens is the distribution of output lengths, in tokens.
	OutputTokens Dist `json:"output_tokens"`
	// TotalInputTokens is the sum of all prompt lengths, in tokens.
	TotalInputTokens int64 `json:"total_input_tokens"`

	// Sessions is the number of distinct sessions (conversations).
	Sessions int `json:"sessions"`
	// RequestsPerSession and RequestsPerSessionP50 are the mean and median
	// number of requests a session has in the trace.
	RequestsPerSession    float64 `json:"requests_per_session"`
	RequestsPerSessionP50 float64 `json:"requests_per_session_p50"`
	// MultiTurnSessions is the number of sessions whose highest turn is >= 2.
	MultiTurnSessions int `json:"multi_turn_sessions"`
	// TurnsPerMultiTurnSession is the mean highest turn of the multi-turn
	// sessions: how deep those conversations got by the end of the trace,
	// counting turns before its start when Turn says so.
	TurnsPerMultiTurnSession float64 `json:"turns_per_multi_turn_session"`
	// MultiTurnShare is the fraction of requests whose turn is >= 2.
	MultiTurnShare float64 `json:"multi_turn_share"`

	// Users is the number of distinct users.
	Users int `json:"users"`
	// RequestsPerUser and RequestsPerUserP50 are the mean and median number
	// of requests a user has in the trace.
	RequestsPerUser    float64 `json:"requests_per_user"`
	RequestsPerUserP50 float64 `json:"requests_per_user_p50"`

	// Reuse is the prefix reuse (see Reuse).
	Reuse Reuse `json:"reuse"`

	// Models are the models the requests name, most requested first (ties
	// by name), when any request names one; requests naming none count as
	// the model "". Nil when no request names a model.
	Models []ModelShare `json:"models,omitempty"`
}

// ModelShare is one model's part of a workload.
type ModelShare struct {
	Name     string `json:"name"`
	Requests int    `json:"requests"`
	// Share is Requests over all requests.
	Share float64 `json:"share"`
	// Sessions counts the sessions with a request for the model.
	Sessions int `json:"sessions"`
}

// ComputeStats describes reqs, which must be in time order (the reuse
// figures look at earlier requests).
func ComputeStats(reqs []Request) Stats {
	var st Stats
	st.Requests = len(reqs)
	if len(reqs) == 0 {
		return st
	}
	st.DurationSeconds = (reqs[len(reqs)-1].Time - reqs[0].Time).Seconds()
	if st.DurationSeconds > 0 {
		st.RatePerSecond = float64(len(reqs)) / st.DurationSeconds
	}
	var shared int
	st.DistinctArrivals, shared, st.LargestSimultaneous = simultaneity(reqs)
	st.SimultaneousShare = float64(shared) / float64(len(reqs))
	in := make([]float64, len(reqs))
	out := make([]float64, len(reqs))
	for i, r := range reqs {
		in[i], out[i] = float64(r.InputTokens), float64(r.OutputTokens)
		st.TotalInputTokens += int64(r.InputTokens)
	}
	st.InputTokens, st.OutputTokens = distOf(in), distOf(out)

	sessionOf, users := indexOwners(reqs)
	sessionReqs := make([]int, 0, len(reqs))
	sessionTurns := []int{}
	userReqs := make([]int, users)
	multi := 0
	for i, r := range reqs {
		s := sessionOf[i].session
		if s == int32(len(sessionReqs)) {
			sessionReqs = append(sessionReqs, 0)
			sessionTurns = append(sessionTurns, 0)
		}
		sessionReqs[s]++
		userReqs[sessionOf[i].user]++
		turn := r.Turn
		if turn <= 0 {
			turn = sessionReqs[s]
		}
		if turn >= 2 {
			multi++
		}
		sessionTurns[s] = max(sessionTurns[s], turn)
	}
	st.Sessions, st.Users = len(sessionReqs), users
	st.MultiTurnShare = float64(multi) / float64(len(reqs))
	st.RequestsPerSession = float64(len(reqs)) / float64(st.Sessions)
	st.RequestsPerSessionP50 = report.Percentile(sortedFloats(sessionReqs), 0.50)
	st.RequestsPerUser = float64(len(reqs)) / float64(st.Users)
	st.RequestsPerUserP50 = report.Percentile(sortedFloats(userReqs), 0.50)
	turnSum := 0
	for _, t := range sessionTurns {
		if t >= 2 {
			st.MultiTurnSessions++
			turnSum += t
		}
	}
	if st.MultiTurnSessions > 0 {
		st.TurnsPerMultiTurnSession = float64(turnSum) / float64(st.MultiTurnSessions)
	}
	st.Reuse = reuseOf(reqs, sessionOf, st.TotalInputTokens)
	st.Models = modelsOf(reqs, sessionOf)
	return st
}

// modelsOf counts the requests and sessions of each model, or returns nil
// when no request names one.
func modelsOf(reqs []Request, of []owners) []ModelShare {
	if !slices.ContainsFunc(reqs, func(r Request) bool { return r.Model != "" }) {
		return nil
	}
	idx := map[string]int{}
	var out []ModelShare
	seen := map[[2]int32]bool{}
	for i, r := range reqs {
		k, ok := idx[r.Model]
		if !ok {
			k = len(out)
			idx[r.Model] = k
			out = append(out, ModelShare{Name: r.Model})
		}
		out[k].Requests++
		if key := [2]int32{int32(k), of[i].session}; !seen[key] {
			seen[key] = true
			out[k].Sessions++
		}
	}
	for k := range out {
		out[k].Share = float64(out[k].Requests) / float64(len(reqs))
	}
	slices.SortFunc(out, func(a, b ModelShare) int {
		if a.Requests != b.Requests {
			return b.Requests - a.Requests
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// owners are the dense session and user indexes of one request.
type owners struct{ session, user int32 }

// indexOwners numbers sessions and users in order of first appearance and
// returns each request's pair and the number of users.
func indexOwners(reqs []Request) ([]owners, int) {
	of := make([]owners, len(reqs))
	sessions := make(map[string]int32)
	userOfSession := []int32{}
	users := make(map[string]int32)
	for i, r := range reqs {
		s, ok := sessions[r.Session]
		if !ok || r.Session == "" {
			s = int32(len(userOfSession))
			if r.Session != "" {
				sessions[r.Session] = s
			}
			key := "u:" + r.User
			if r.User == "" {
				key = "s:" + strconv.Itoa(int(s))
			}
			u, ok := users[key]
			if !ok {
				u = int32(len(users))
				users[key] = u
			}
			userOfSession = append(userOfSession, u)
		}
		of[i] = owners{session: s, user: userOfSession[s]}
	}
	return of, len(users)
}

// reuseOf computes the prefix reuse figures (see Reuse).
func reuseOf(reqs []Request, of []owners, total int64) Reuse {
	bi := newBlockIndex(reqs)
	seen := make([]bool, bi.n)
	bySession, byUser := newOwnerSet(bi.n), newOwnerSet(bi.n)
	var g, intraS, intraU int64
	for i, r := range reqs {
		blocks := bi.blocks(i)
		s, u := of[i].session, of[i].user
		n := 0
		for n < len(blocks) && seen[blocks[n]] {
			n++
		}
		ns := 0
		for ns < n && bySession.has(blocks[ns], s) {
			ns++
		}
		nu := 0
		for nu < n && byUser.has(blocks[nu], u) {
			nu++
		}
		g += int64(PrefixTokens(n, r.InputTokens))
		intraS += int64(PrefixTokens(ns, r.InputTokens))
		intraU += int64(PrefixTokens(nu, r.InputTokens))
		for j, b := range blocks {
			if j >= n {
				seen[b] = true
			}
			if j >= ns {
				bySession.add(b, s)
			}
			if j >= nu {
				byUser.add(b, u)
			}
		}
	}
	if total == 0 {
		return Reuse{}
	}
	t := float64(total)
	return Reuse{
		Global:       float64(g) / t,
		IntraSession: float64(intraS) / t,
		CrossSession: float64(g-intraS) / t,
		IntraUser:    float64(intraU) / t,
		CrossUser:    float64(g-intraU) / t,
	}
}

func sortedFloats(xs []int) []float64 {
	f := make([]float64, len(xs))
	for i, x := range xs {
		f[i] = float64(x)
	}
	slices.Sort(f)
	return f
}

// distOf summarises xs, sorting it in place.
func distOf(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	slices.Sort(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return Dist{
		P50:  report.Percentile(xs, 0.50),
		P90:  report.Percentile(xs, 0.90),
		P95:  report.Percentile(xs, 0.95),
		P99:  report.Percentile(xs, 0.99),
		Mean: sum / float64(len(xs)),
		Max:  int(xs[len(xs)-1]),
	}
}

// WriteText writes a human-readable report of the statistics.
func (st Stats) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	pct := func(x float64) string { return strconv.FormatFloat(100*x, 'f', 2, 64) + "%" }
	dist := func(d Dist) string {
		return fmt.Sprintf("p50 %.0f\tp90 %.0f\tp95 %.0f\tp99 %.0f\tmean %.0f\tmax %d",
			d.P50, d.P90, d.P95, d.P99, d.Mean, d.Max)
	}
	fmt.Fprintf(tw, "requests\t%d\n", st.Requests)
	fmt.Fprintf(tw, "duration\t%.1f s (first to last arrival)\n", st.DurationSeconds)
	fmt.Fprintf(tw, "mean rate\t%.2f req/s\n", st.RatePerSecond)
	if st.LargestSimultaneous > 1 {
		fmt.Fprintf(tw, "arrival times\t%d distinct; %s of requests share theirs (at most %d at once)\n",
			st.DistinctArrivals, pct(st.SimultaneousShare), st.LargestSimultaneous)
	}
	fmt.Fprintf(tw, "input tokens\t%s\n", dist(st.InputTokens))
	fmt.Fprintf(tw, "output tokens\t%s\n", dist(st.OutputTokens))
	if st.OutputError != (OutputError{}) {
		fmt.Fprintf(tw, "  estimate error\t±%.0f from the running mean, ±%.0f keyed by application and conversation\n",
			st.OutputError.Global, st.OutputError.Keyed)
	}
	fmt.Fprintf(tw, "sessions\t%d (requests per session: mean %.2f, p50 %.0f)\n",
		st.Sessions, st.RequestsPerSession, st.RequestsPerSessionP50)
	fmt.Fprintf(tw, "multi-turn sessions\t%d (highest turn: mean %.1f)\n",
		st.MultiTurnSessions, st.TurnsPerMultiTurnSession)
	fmt.Fprintf(tw, "multi-turn requests\t%s (turn >= 2)\n", pct(st.MultiTurnShare))
	fmt.Fprintf(tw, "users\t%d (requests per user: mean %.2f, p50 %.0f)\n",
		st.Users, st.RequestsPerUser, st.RequestsPerUserP50)
	fmt.Fprintf(tw, "prefix reuse\t%s of input tokens\n", pct(st.Reuse.Global))
	fmt.Fprintf(tw, "  intra/cross session\t%s / %s\n", pct(st.Reuse.IntraSession), pct(st.Reuse.CrossSession))
	fmt.Fprintf(tw, "  intra/cross user\t%s / %s\n", pct(st.Reuse.IntraUser), pct(st.Reuse.CrossUser))
	if len(st.Models) > 0 {
		fmt.Fprintf(tw, "models\t%d\n", len(st.Models))
		for _, m := range st.Models {
			name := m.Name
			if name == "" {
				name = "(none)"
			}
			fmt.Fprintf(tw, "  %s\t%s (%d requests, %d sessions)\n", name, pct(m.Share), m.Requests, m.Sessions)
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing stats: %w", err)
	}
	return nil
}
