package main

import (
	"context"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/netem"
)

// The injected round trip shows in a probe's measured round trip (at least
// 80% of it; the upper bound is loose, as a busy machine only adds to it),
// and moves when the admin endpoint moves it.
func TestEngineInjectedRTT(t *testing.T) {
	p, _ := engine.LookupProfile("paper")
	link := netem.NewLink(80*time.Millisecond, 0, 1)
	srv, err := emulator.New(emulator.Config{Profile: p, SetRTT: link.Set})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveAll(ctx, srv.Run, served{h: srv.Handler(), ln: link.Listener(ln)}) }()
	defer func() {
		cancel()
		<-done
	}()
	url := "http://" + ln.Addr().String()
	client := &http.Client{}
	probe := func() time.Duration {
		var rtts []time.Duration
		for range 7 {
			start := time.Now()
			resp, err := client.Get(url + "/health")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			rtts = append(rtts, time.Since(start))
		}
		slices.Sort(rtts)
		return rtts[len(rtts)/2]
	}
	probe() // open the connection
	check := func(want time.Duration) {
		t.Helper()
		if got := probe(); got < want*8/10 || got > want*3 {
			t.Errorf("probe round trip %v, want %v (at least -20%%, at most 3x)", got, want)
		}
	}
	check(80 * time.Millisecond)
	resp, err := client.Post(url+"/admin/network?rtt=200ms", "", nil)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("admin: %v %v", resp, err)
	}
	resp.Body.Close()
	check(200 * time.Millisecond)
}
