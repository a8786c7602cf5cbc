package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/gorgo-llm/gorgo/internal/emulator"
	"github.com/gorgo-llm/gorgo/internal/engine"
	"github.com/gorgo-llm/gorgo/internal/netem"
	"github.com/gorgo-llm/gorgo/internal/prompt"
)

const engineAbout = `
Serves an emulated SGLang/vLLM replica: the engine model behind the OpenAI API
(POST /v1/chat/completions and /v1/completions, streaming or not; GET
/v1/models, /health, /metrics), with tokens coming out when the model says.
--rtt and --jitter delay every byte both ways, as a far region would; POST
/admin/network?rtt=D&jitter=J and /admin/speed?speedup=F&slowdown=F change
the delay and the model's speed at runtime.`

func runEngine(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("engine", "engine [flags]", engineAbout, stderr)
	listen := fs.String("listen", "127.0.0.1:8000", "`ADDR` to listen on")
	profile := fs.String("profile", "paper", "engine profile: "+joinNames(engine.ProfileNames()))
	model := fs.String("model", "gorgo-emulated", "served model `NAME`")
	metricsFormat := fs.String("metrics-format", "sglang", "/metrics names: sglang or vllm")
	rtt := fs.Duration("rtt", 0, "injected round trip (half on the way in, half on the way out)")
	jitter := fs.Duration("jitter", 0, "standard deviation of the injected round trip")
	speedup := fs.Float64("speedup", 1, "run the model `F` times faster than real time")
	page := fs.Int("page-tokens", 16, "prefix cache block size in tokens")
	bpt := fs.Int("bytes-per-token", prompt.DefaultBytesPerToken, "token estimator: prompt bytes per token (the router and the replayer use the same)")
	kv := fs.Int("kv-capacity", 0, "KV cache capacity in tokens (0: the profile's)")
	maxWaiting := fs.Int("max-waiting", 4096, "waiting queue cap; beyond it requests get 503")
	maxTokens := fs.Int("default-max-tokens", 128, "output tokens of a request without max_tokens")
	failFraction := fs.Float64("fail-fraction", 0, "fault: fail this fraction of requests with HTTP 500")
	hangAfter := fs.Int("hang-after", 0, "fault: after N requests, hang every request (0: never)")
	exitAfter := fs.Int("exit-after", 0, "fault: after N requests, exit as if crashed (0: never)")
	slowdown := fs.Float64("slowdown", 1, "fault: run the model `F` times slower")
	seed := fs.Uint64("seed", 1, "random seed (jitter, faults)")
	spin := fs.Bool("spin", true, "spin the last stretch before each step ends for sub-millisecond token timing (costs up to a quarter of a core while busy)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	prof, err := engine.LookupProfile(*profile)
	if err != nil {
		return fmt.Errorf("--profile: %w", err)
	}
	if !(*speedup > 0) || math.IsInf(*speedup, 0) {
		return fmt.Errorf("--speedup must be a positive finite number, got %v", *speedup)
	}
	if *bpt < 1 {
		return fmt.Errorf("--bytes-per-token must be at least 1")
	}
	if *kv < 0 {
		return fmt.Errorf("--kv-capacity must not be negative")
	}
	if *kv > 0 {
		prof.KVCapacityTokens = *kv
	}
	if *rtt < 0 || *jitter < 0 {
		return fmt.Errorf("--rtt and --jitter must not be negative")
	}
	link := netem.NewLink(*rtt, *jitter, *seed)
	srv, err := emulator.New(emulator.Config{
		Profile: prof, PageTokens: *page, Model: *model, MetricsFormat: *metricsFormat, Speedup: *speedup,
		MaxWaiting: *maxWaiting, DefaultMaxTokens: *maxTokens, Seed: *seed, SetRTT: link.Set,
		Estimator: prompt.Estimator{BytesPerToken: *bpt}, Spin: *spin,
		Faults: emulator.Faults{FailFraction: *failFraction, HangAfter: *hangAfter, ExitAfter: *exitAfter, Slowdown: *slowdown},
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "gorgo engine: %s on http://%s (profile %s, rtt %v±%v, speedup %g, metrics %s)\n",
		*model, ln.Addr(), prof.Name, *rtt, *jitter, *speedup, *metricsFormat)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serveAll(ctx, srv.Run, served{h: srv.Handler(), ln: link.Listener(ln)})
}
