package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"strings"
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

// The model and LoRA flags reach the emulator's config: --model is the
// primary name, or the first of --served-model-name unless given.
func TestEngineModelFlags(t *testing.T) {
	for _, c := range []struct {
		args                 []string
		model                string
		served, loras, bases []string
		maxLoRAs             int
		load                 time.Duration
	}{
		{nil, "gorgo-emulated", nil, nil, []string{"gorgo-emulated"}, 0, 0},
		{[]string{"--served-model-name", "llama, llama-chat"}, "", []string{"llama", "llama-chat"}, nil, []string{"llama", "llama-chat"}, 0, 0},
		{[]string{"--served-model-name", "a,b", "--model", "b"}, "b", []string{"a", "b"}, nil, []string{"b", "a"}, 0, 0},
		{[]string{"--lora-modules", "sql,code=/data/code", "--max-loras", "2", "--lora-load-time", "150ms"},
			"gorgo-emulated", nil, []string{"sql", "code=/data/code"}, []string{"gorgo-emulated"}, 2, 150 * time.Millisecond},
	} {
		f, err := parseEngineFlags(c.args, &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		cfg := f.cfg
		if cfg.Model != c.model || !slices.Equal(cfg.ServedNames, c.served) || !slices.Equal(cfg.LoRAModules, c.loras) ||
			cfg.MaxLoRAs != c.maxLoRAs || cfg.LoRALoadTime != c.load {
			t.Errorf("%q: model %q served %q adapters %q max %d load %v", c.args, cfg.Model, cfg.ServedNames, cfg.LoRAModules, cfg.MaxLoRAs, cfg.LoRALoadTime)
		}
		srv, err := emulator.New(cfg)
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if bases, _ := srv.Models(); !slices.Equal(bases, c.bases) {
			t.Errorf("%q: serves %q, want %q", c.args, bases, c.bases)
		}
	}
}

// Bad values are a one-line error, before anything listens.
func TestEngineModelFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--served-model-name", " , "}, "--served-model-name names no model"},
		{[]string{"--max-loras", "-1"}, "--max-loras must not be negative"},
		{[]string{"--lora-load-time", "-1s"}, "--lora-load-time must not be negative"},
		{[]string{"--lora-load-time", "soon"}, "invalid value"},
		{[]string{"--max-loras", "many"}, "invalid value"},
		{[]string{"--served-model-name", "a,a"}, "given twice"},
		{[]string{"--served-model-name", "a", "--lora-modules", "a"}, "already served"},
		{[]string{"--lora-modules", "x="}, "the path must be"},
		{[]string{"--page-tokens", "0"}, "--page-tokens must be at least 1"},
		{[]string{"--max-waiting", "0"}, "--max-waiting must be at least 1"},
		{[]string{"--default-max-tokens", "0"}, "--default-max-tokens must be at least 1"},
		{[]string{"--slowdown", "0"}, "--slowdown must be a positive finite number"},
		{[]string{"--image-tokens", "0"}, "--image-tokens must be from 1 to 65536"},
		{[]string{"--image-tokens", "100000"}, "--image-tokens must be from 1 to 65536"},
		{[]string{"--audio-tokens-per-second", "0"}, "--audio-tokens-per-second must be from 1 to 1000"},
		{[]string{"--video-tokens", "70000"}, "--video-tokens must be from 1 to 65536"},
	} {
		var stderr bytes.Buffer
		f, err := parseEngineFlags(c.args, &stderr)
		if err == nil {
			_, err = emulator.New(f.cfg)
			if err == nil {
				t.Errorf("%q: accepted", c.args)
				continue
			}
		}
		msg := err.Error()
		if errors.Is(err, errUsage) {
			msg = stderr.String() // parseFlags explained it
		}
		if !strings.Contains(msg, c.want) || strings.Contains(strings.TrimRight(msg, "\n"), "\n") {
			t.Errorf("%q: %q; want one line with %q", c.args, msg, c.want)
		}
	}
}
