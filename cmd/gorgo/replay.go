package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/gorgo-llm/gorgo/internal/replay"
	"github.com/gorgo-llm/gorgo/internal/report"
)

const replayAbout = `
Replays a workload against an OpenAI-compatible server (gorgo's proxy, its
engine emulator, SGLang, vLLM, ...) as the paper's client does: open loop at
the trace's times with a cap on requests in flight, each request a streamed
chat completion (with --unstreamed, a share of them asked whole) whose prompt
is the trace's messages or text synthesised from its block ids. Prints the
same summary as sim. Times are in milliseconds: TTFT and E2E run from
sending a request to its first token and to the end of its stream (a whole
answer's TTFT is its E2E: its client sees no token before the end); slip is
how long a request waited for the cap. Without --trace it replays the
embedded synthetic workload. Ctrl-C stops the replay and still reports and
writes what was measured.`

// readKey reads an API key from the first line of a file (of its first
// 64 KiB: a key is far shorter, and the flag may name /dev/zero).
func readKey(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("--api-key-file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return "", fmt.Errorf("--api-key-file: %w", err)
	}
	key, _, _ := strings.Cut(string(data), "\n")
	if key = strings.TrimSpace(key); key == "" || strings.ContainsFunc(key, unicode.IsControl) {
		return "", fmt.Errorf("--api-key-file: %s has no key on its first line", path)
	}
	return key, nil
}

// probeTimeout bounds the first request to the target (GET /v1/models),
// which checks that it is reachable.
const probeTimeout = 10 * time.Second

func runReplay(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("replay", "replay --target URL [flags]", replayAbout, stderr)
	var wl workloadFlags
	wl.register(fs, true)
	target := fs.String("target", "", "base `URL` of the OpenAI-compatible server, e.g. http://127.0.0.1:8080 (required; /v1/... is appended)")
	maxInflight := fs.Int("max-inflight", replay.DefaultMaxInflight, "cap on requests in flight (0 = none); beyond it requests wait and the wait is recorded as slip")
	model := fs.String("model", "", "model `NAME` sent in the requests; default the first base model the target lists at /v1/models (an adapter if it lists only adapters), else \"default\"")
	label := fs.String("label", "replay", "`NAME` of the run in the table and the JSON summary")
	jsonOut := fs.String("json", "", "write the run summary as JSON to `FILE`")
	records := fs.String("records", "", "write per-request records as JSONL to `FILE`")
	quiet := fs.Bool("quiet", false, "no progress or header lines")
	timeout := fs.Duration("request-timeout", 0, "cut and fail a request not answered to its end this long after it was sent (a server that stalls mid-answer holds it, and the replay's end, otherwise; 0: none)")
	unstreamed := fs.Float64("unstreamed", 0, "share of requests that ask for their answers whole (stream false; 0 to 1), drawn by --seed as gorgo sim --unstreamed draws them: their TTFT is their E2E, as their client sees it, and they have no ITL (gorgo sim reports the engine's first token and gaps for them, which no client sees)")
	keyFile := fs.String("api-key-file", "", "read the API key sent to the target (as a bearer token) from `FILE`'s first line; default $OPENAI_API_KEY, as OpenAI's clients read it (none: no key)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkWritable(*jsonOut, *records); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *target == "" {
		return fmt.Errorf("--target is required: the server's base URL, e.g. --target http://127.0.0.1:8080")
	}
	u, err := replay.ParseTarget(*target)
	if err != nil {
		return err
	}
	if *maxInflight < 0 {
		return fmt.Errorf("--max-inflight must not be negative")
	}
	if strings.TrimSpace(*label) == "" {
		return fmt.Errorf("--label must not be empty")
	}
	if *timeout < 0 {
		return fmt.Errorf("--request-timeout must not be negative, got %v", *timeout)
	}
	if !(*unstreamed >= 0 && *unstreamed <= 1) {
		return fmt.Errorf("--unstreamed must be between 0 and 1, got %v", *unstreamed)
	}
	if err := wl.noSLO("gorgo replay (its requests do not carry it to the router)"); err != nil {
		return err
	}
	reqs, desc, err := wl.load()
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills the process
	}()

	key := os.Getenv("OPENAI_API_KEY")
	if *keyFile != "" {
		if key, err = readKey(*keyFile); err != nil {
			return err
		}
	}
	hc := replay.WithAPIKey(replay.NewHTTPClient(*maxInflight), key)
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	models, err := replay.Models(pctx, hc, u)
	cancel()
	if errors.Is(err, replay.ErrRefused) {
		return fmt.Errorf("%w: give it an API key it takes ($OPENAI_API_KEY, or --api-key-file)", err)
	}
	if err != nil {
		return err
	}
	m := *model
	if m == "" {
		m = replay.DefaultModel
		if len(models) > 0 {
			m = models[0]
		}
	}
	if !*quiet {
		limit := "no cap"
		if *maxInflight > 0 {
			limit = fmt.Sprintf("at most %d in flight", *maxInflight)
		}
		if *unstreamed > 0 {
			limit += fmt.Sprintf(", %.0f%% of requests asked whole (their TTFT is their E2E)", 100**unstreamed)
		}
		fmt.Fprintf(stdout, "target: %s, model %s, %s\n", u.Redacted(), m, limit)
		fmt.Fprintf(stdout, "workload: %s\n", desc)
	}

	prog := newProgress(stderr, "replaying", len(reqs), *quiet)
	res, runErr := replay.Run(ctx, replay.Config{
		Target:         u.String(),
		Model:          m,
		Requests:       reqs,
		MaxInflight:    *maxInflight,
		Unstreamed:     *unstreamed,
		RequestTimeout: *timeout,
		Seed:           wl.seed,
		Client:         hc,
		Progress:       prog.add,
	})
	prog.finish()
	if res == nil {
		return runErr
	}
	run := report.NewRun(*label, res.Records, replayReplicas(res.Records))
	if err := report.WriteTable(stdout, []report.Run{run}); err != nil {
		return err
	}
	if !*quiet {
		fmt.Fprintf(stdout, "replayed %d of %d requests in %v\n", len(res.Records), len(reqs), res.Elapsed.Round(time.Millisecond))
	}
	failed, why := failures(res.Records)
	if failed > 0 && !*quiet {
		fmt.Fprintf(stdout, "%d failed; the most common error: %s\n", failed, why)
	}
	if *jsonOut != "" {
		if err := writeJSON(*jsonOut, map[string]any{"runs": []report.Run{run}}); err != nil {
			return err
		}
	}
	if *records != "" {
		if err := writeRecords(*records, res.Records); err != nil {
			return err
		}
	}
	if runErr == nil && failed > 0 && failed == len(res.Records) {
		return fmt.Errorf("every request failed: %s", why)
	}
	return runErr
}

// failures counts the failed records and names their most common error.
func failures(recs []report.Record) (n int, common string) {
	count := map[string]int{}
	for i := range recs {
		if recs[i].Failed {
			n++
			count[recs[i].Error]++
		}
	}
	for e, c := range count {
		if c > count[common] || c == count[common] && e < common {
			common = e
		}
	}
	return n, common
}

// replayReplicas lists the replicas named in the records (from the proxy's
// replica header), sorted.
func replayReplicas(recs []report.Record) []string {
	var ids []string
	for i := range recs {
		if id := recs[i].Replica; id != "" && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}
