package fleet

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
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

// The first probes of a fleet go firstProbes at a time, paced: a burst
// of hundreds is the router's own load, timed as the network's
// (2026-12-07, a user's test: 500 local replicas first measured at 37–74
// ms, and hundreds of changes of the fleet as the estimates settled).
func TestFirstProbesArePaced(t *testing.T) {
	pace := firstProbesPace
	firstProbesPace = time.Hour // the second batch never comes while the test looks
	defer func() { firstProbesPace = pace }()
	var arrived atomic.Int64
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			arrived.Add(1)
			<-hang // never answered while the test looks
		}
	}))
	defer srv.Close()
	defer close(hang)
	var reps []ReplicaConfig
	for i := range 100 {
		reps = append(reps, ReplicaConfig{ID: fmt.Sprint("r", i), URL: srv.URL, Models: []string{"m"}})
	}
	f, err := New(Config{Replicas: reps, ProbeInterval: time.Hour, ScrapeInterval: time.Hour}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.ProbeOnce(ctx); close(done) }()
	for deadline := time.Now().Add(20 * time.Second); arrived.Load() < firstProbes; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the first %d probes arrived, their replicas hung", arrived.Load(), firstProbes)
		}
	}
	time.Sleep(200 * time.Millisecond) // a 33rd would come now if the first batch's hang held nothing up and the pace were not kept
	if n := arrived.Load(); n != firstProbes {
		t.Errorf("%d probes sent before the pace allowed a second batch, want %d", n, firstProbes)
	}
	cancel()
	<-done
}

// Replicas that never answer hold up none of the others' first probes:
// 320 of them take one probe's timeout (2 s) to start, not one for each
// batch of firstProbes (20 s; a review: 64 took two timeouts). The bound,
// 10 s, leaves a loaded machine room on both sides.
func TestHungReplicasDelayStartUpOnce(t *testing.T) {
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(hang)
	var reps []ReplicaConfig
	for i := range 10 * firstProbes {
		reps = append(reps, ReplicaConfig{ID: fmt.Sprint("r", i), URL: srv.URL, Models: []string{"m"}})
	}
	f, err := New(Config{Replicas: reps, ProbeInterval: 100 * time.Millisecond, ScrapeInterval: time.Hour}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	start := time.Now()
	f.ProbeOnce(context.Background())
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the first probes of %d hung replicas took %v", len(reps), d.Round(time.Millisecond))
	}
}
