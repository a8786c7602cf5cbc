package fleet

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The replicas' loops wait a part of their first interval, one of
// spreadSlots spread over it by their ids, so that a fleet started together is probed and scraped
// spread over each interval, not all at once (2026-12-07, a user's test:
// 500 replicas' requests came in bursts of up to 830 in 100 ms, adding
// 5–30 ms to the requests routed meanwhile).
func TestSpreadCoversTheInterval(t *testing.T) {
	var buckets [spreadSlots]int
	for i := range 1000 {
		p := spread(fmt.Sprint("replica-", i))
		if !(p > 0 && p <= 1) {
			t.Fatalf("replica-%d: %v, not in (0, 1]", i, p)
		}
		buckets[int(math.Round(p*spreadSlots))-1]++
	}
	for i, n := range buckets {
		if n < 60 || n > 140 {
			t.Errorf("%d of 1,000 replicas in the tenth %d of the interval: %v", n, i, buckets)
		}
	}
	if spread("a") != spread("a") {
		t.Error("a replica's part changes")
	}
}

// The first probes of a fleet go at most maxFirstProbes at a time: a
// burst of hundreds is the router's own load, timed as the network's
// (2026-12-07, a user's test: 500 local replicas first measured at 37–74
// ms, and hundreds of changes of the fleet as the estimates settled).
func TestFirstProbesAreBounded(t *testing.T) {
	var now, most, health atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			return
		}
		n := now.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(20 * time.Millisecond)
		now.Add(-1)
		health.Add(1)
	}))
	defer srv.Close()
	var reps []ReplicaConfig
	for i := range 100 {
		reps = append(reps, ReplicaConfig{ID: fmt.Sprint("r", i), URL: srv.URL, Models: []string{"m"}})
	}
	f, err := New(Config{Replicas: reps, ProbeInterval: time.Hour, ScrapeInterval: time.Hour}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var wg sync.WaitGroup
	wg.Go(func() { f.ProbeOnce(context.Background()) })
	wg.Wait()
	if n := health.Load(); n != 100 {
		t.Errorf("%d of 100 replicas probed", n)
	}
	if m := most.Load(); m > maxFirstProbes {
		t.Errorf("%d probes at once, want at most %d", m, maxFirstProbes)
	}
}
