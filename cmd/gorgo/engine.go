package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

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
the delay and the model's speed at runtime.

Models: the base model is served under --model, or every name of
--served-model-name (the first the primary one, as vLLM's); LoRA adapters
on it are --lora-modules, and more are loaded and unloaded at runtime with
vLLM's POST /v1/load_lora_adapter {"lora_name":..,"lora_path":..} and
/v1/unload_lora_adapter {"lora_name":..}. A request names a served name (or
none) for the base model, an adapter or SGLang's BASE:ADAPTER for an
adapter; its prefix cache is the adapter's own. At most --max-loras adapters
are resident (least recently used evicted), the running batch uses at most
that many, and loading one stalls the step that needs it --lora-load-time.`

// engineFlags is a parsed 'gorgo engine' command line.
type engineFlags struct {
	listen      string
	rtt, jitter time.Duration
	seed        uint64
	cfg         emulator.Config
}

func parseEngineFlags(args []string, stderr io.Writer) (*engineFlags, error) {
	fs := newFlagSet("engine", "engine [flags]", engineAbout, stderr)
	listen := fs.String("listen", "127.0.0.1:8000", "`ADDR` to listen on")
	profile := fs.String("profile", "paper", "engine profile: "+joinNames(engine.ProfileNames()))
	model := fs.String("model", "gorgo-emulated", "served model `NAME` (the primary one with --served-model-name)")
	servedNames := fs.String("served-model-name", "", "comma-separated `NAMES` the base model is served under, the first the primary one unless --model is given (default: --model)")
	loraModules := fs.String("lora-modules", "", "comma-separated LoRA `ADAPTERS` on the base model, each NAME or NAME=PATH")
	maxLoRAs := fs.Int("max-loras", 0, "LoRA adapter slots: adapters resident at once, and in one batch (0: the engine's default, 1 for vllm, 8 for sglang)")
	loraLoad := fs.Duration("lora-load-time", 0, "model time loading an adapter adds to the step that needs it (a Go `DURATION`)")
	metricsFormat := fs.String("metrics-format", "sglang", "the engine it answers as, sglang or vllm: its /metrics names, and SGLang's native POST /generate served or not")
	rtt := fs.Duration("rtt", 0, "injected round trip (half on the way in, half on the way out)")
	jitter := fs.Duration("jitter", 0, "standard deviation of the injected round trip")
	speedup := fs.Float64("speedup", 1, "run the model `F` times faster than real time")
	page := fs.Int("page-tokens", 16, "prefix cache block size in tokens")
	bpt := fs.Int("bytes-per-token", prompt.DefaultBytesPerToken, "token estimator: prompt bytes per token (the router and the replayer use the same)")
	imageTokens := fs.Int("image-tokens", prompt.DefaultImageTokens, "prompt tokens an image of a chat stands for (the router's image_tokens)")
	audioTokens := fs.Int("audio-tokens-per-second", prompt.DefaultAudioTokensPerSecond, "prompt tokens a second of a chat's audio stands for (the router's audio_tokens_per_second)")
	videoTokens := fs.Int("video-tokens", prompt.DefaultVideoTokens, "prompt tokens a video of a chat stands for (the router's video_tokens)")
	kv := fs.Int("kv-capacity", 0, "KV cache capacity in tokens (0: the profile's)")
	maxWaiting := fs.Int("max-waiting", 4096, "waiting queue cap; beyond it requests get 503")
	maxTokens := fs.Int("default-max-tokens", 128, "output tokens of a request without max_tokens")
	healthGenerates := fs.Bool("health-generates", false, "answer GET /health a second late, as SGLang's does by default (it has the scheduler generate a token: SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION)")
	storeResponses := fs.Bool("store-responses", false, "keep each Responses API response for a follow-up (previous_response_id) and GET, as vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1")
	failFraction := fs.Float64("fail-fraction", 0, "fault: fail this fraction of requests with HTTP 500")
	hangAfter := fs.Int("hang-after", 0, "fault: after N requests, hang every request (0: never)")
	exitAfter := fs.Int("exit-after", 0, "fault: after N requests, exit as if crashed (0: never)")
	slowdown := fs.Float64("slowdown", 1, "fault: run the model `F` times slower")
	seed := fs.Uint64("seed", 1, "random seed (jitter, faults)")
	spin := fs.Bool("spin", true, "spin the last stretch before each step ends for sub-millisecond token timing (costs up to a quarter of a core while busy)")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	prof, err := engine.LookupProfile(*profile)
	if err != nil {
		return nil, fmt.Errorf("--profile: %w", err)
	}
	served := splitList(*servedNames)
	if *servedNames != "" && len(served) == 0 {
		return nil, fmt.Errorf("--served-model-name names no model")
	}
	modelSet := false
	fs.Visit(func(f *flag.Flag) { modelSet = modelSet || f.Name == "model" })
	primary := *model
	if len(served) > 0 && !modelSet {
		primary = "" // the first served name
	}
	if *maxLoRAs < 0 {
		return nil, fmt.Errorf("--max-loras must not be negative, got %d", *maxLoRAs)
	}
	if *loraLoad < 0 {
		return nil, fmt.Errorf("--lora-load-time must not be negative, got %v", *loraLoad)
	}
	if !(*speedup > 0) || math.IsInf(*speedup, 0) {
		return nil, fmt.Errorf("--speedup must be a positive finite number, got %v", *speedup)
	}
	if !(*slowdown > 0) || math.IsInf(*slowdown, 0) {
		return nil, fmt.Errorf("--slowdown must be a positive finite number, got %v", *slowdown)
	}
	// The emulator's config takes a zero for its default: a flag's zero
	// is a mistake, not a wish for the default.
	for _, f := range []struct {
		name string
		v    int
	}{{"--page-tokens", *page}, {"--max-waiting", *maxWaiting}, {"--default-max-tokens", *maxTokens}} {
		if f.v < 1 {
			return nil, fmt.Errorf("%s must be at least 1, got %d", f.name, f.v)
		}
	}
	if *bpt < 1 {
		return nil, fmt.Errorf("--bytes-per-token must be at least 1")
	}
	if *imageTokens < 1 || *imageTokens > prompt.MaxMediaTokens {
		return nil, fmt.Errorf("--image-tokens must be from 1 to %d, got %d", prompt.MaxMediaTokens, *imageTokens)
	}
	if *audioTokens < 1 || *audioTokens > prompt.MaxAudioTokensPerSecond {
		return nil, fmt.Errorf("--audio-tokens-per-second must be from 1 to %d, got %d", prompt.MaxAudioTokensPerSecond, *audioTokens)
	}
	if *videoTokens < 1 || *videoTokens > prompt.MaxMediaTokens {
		return nil, fmt.Errorf("--video-tokens must be from 1 to %d, got %d", prompt.MaxMediaTokens, *videoTokens)
	}
	if *kv < 0 {
		return nil, fmt.Errorf("--kv-capacity must not be negative")
	}
	if *kv > 0 {
		prof.KVCapacityTokens = *kv
	}
	if *rtt < 0 || *jitter < 0 {
		return nil, fmt.Errorf("--rtt and --jitter must not be negative")
	}
	return &engineFlags{listen: *listen, rtt: *rtt, jitter: *jitter, seed: *seed, cfg: emulator.Config{
		Profile: prof, PageTokens: *page, Model: primary, ServedNames: served, LoRAModules: splitList(*loraModules),
		MaxLoRAs: *maxLoRAs, LoRALoadTime: *loraLoad, MetricsFormat: *metricsFormat, Speedup: *speedup,
		MaxWaiting: *maxWaiting, DefaultMaxTokens: *maxTokens, StoreResponses: *storeResponses, HealthGenerates: *healthGenerates, Seed: *seed,
		Estimator: prompt.Estimator{BytesPerToken: *bpt, ImageTokens: *imageTokens, AudioTokensPerSecond: *audioTokens, VideoTokens: *videoTokens}, Spin: *spin,
		Faults: emulator.Faults{FailFraction: *failFraction, HangAfter: *hangAfter, ExitAfter: *exitAfter, Slowdown: *slowdown},
	}}, nil
}

func runEngine(args []string, stdout, stderr io.Writer) error {
	f, err := parseEngineFlags(args, stderr)
	if err != nil {
		return err
	}
	link := netem.NewLink(f.rtt, f.jitter, f.seed)
	cfg := f.cfg
	cfg.SetRTT = link.Set
	srv, err := emulator.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	bases, adapters := srv.Models()
	names := strings.Join(bases, ",")
	if len(adapters) > 0 {
		names += " with adapters " + strings.Join(adapters, ",")
	}
	fmt.Fprintf(stdout, "gorgo engine: %s on http://%s (profile %s, rtt %v±%v, speedup %g, metrics %s)\n",
		names, ln.Addr(), cfg.Profile.Name, f.rtt, f.jitter, cfg.Speedup, cfg.MetricsFormat)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serveAll(ctx, srv.Run, served{h: srv.Handler(), ln: link.Listener(ln)})
}
