#!/usr/bin/env bash
# What does gorgo serve's request path cost? This measures it side by side
# with nginx as a plain reverse proxy, on the same machine, in the same run:
#
#   1. Throughput: wrk (CONNS connections) posts ~1k-token chat requests
#      (about 4 KB of message text; the proxy estimates 4 bytes per token)
#      through each proxy to a canned upstream (scripts/proxybench upstream)
#      that answers at once, non-streaming and streaming (21 SSE events, each
#      written on its own as an engine does). The upstream does next to
#      nothing, so the proxy's CPU should be the limit and req/s the inverse
#      of the proxy's CPU cost per request. gorgo runs with 1 replica and with
#      REPLICAS replicas: REPLICAS ports of the one canned upstream process,
#      so that each replica has its own connection pool, as separate engines
#      would. A third proxy, `proxybench relay`, is the least a Go reverse
#      proxy on net/http can do (read the body, forward it, copy the answer
#      back; no parsing, no routing): the floor Go's HTTP stack sets on the
#      same core, which gorgo can approach but not pass without leaving it.
#   2. Added time to first token, one request at a time (no queueing), at 1k
#      and 16k prompt tokens (4 KB and 64 KB bodies), with `gorgo engine` (the
#      emulator, with no injected round trip) as the upstream: every request
#      through a proxy is paired with one straight to the engine, and the
#      differences of their p50 and p99 are what the proxy adds. The engine
#      runs SPEEDUP_1K (10) and SPEEDUP_16K (40) times faster than real time:
#      fast enough for a quick run (7 and 26 ms of prefill), and slow enough
#      that each prefill step lasts 6 ms or more, which the emulator times to
#      within ~0.1 ms (it spins through the last 1.5 ms of a step, as an idle
#      Go process's timers fire up to 1 ms late). At 1000x its own TTFT jumps
#      between modes ~0.8 ms apart, and p50 differences of tenths of a ms
#      jump with it.
#
# Placement on a 2-core machine: the proxy under test (nginx with
# worker_processes 1, or gorgo serve with GOMAXPROCS=1) is pinned to CPU
# PROXY_CPU (1), the upstream and the load generator to LOAD_CPU (0). Runs are
# interleaved (nginx, gorgo, gorgo×REPLICAS, nginx, ...) for ROUNDS rounds and
# the median per proxy is reported, so slow drifts hit all proxies alike.
#
# The machine may be shared (builds, tests), so every run is accounted: busy
# time of each CPU (/proc/stat), the CPU time of the upstream, the load
# generator and the proxy, and what is left: other processes. Before each run
# the script waits for both CPUs to be idle, and a run in which others took
# more than OTHERS_MAX % of either CPU is repeated (up to RETRIES times; the
# least disturbed attempt is kept), all within NOISE_BUDGET seconds in all.
# The raw tables show each run's accounting.
#
# Usage: scripts/proxy-vs-nginx.sh           (about 5 minutes with defaults)
#   GORGO_BIN=/path/to/gorgo    measure this binary (default: go build ./cmd/gorgo from this checkout)
#   DURATION=10 ROUNDS=3 CONNS=64   seconds per wrk run, interleaved rounds, wrk connections
#   WARMUP=2                    seconds of wrk per proxy and mode before the first round
#   TTFT_N=200 TTFT_ROUNDS=3    measured requests per TTFT run (per target), rounds
#   SPEEDUP_1K=10 SPEEDUP_16K=40   gorgo engine speedup for the 1k- and 16k-token TTFT runs
#   PHASES="throughput ttft"    the parts to run
#   PERF=1                      also profile gorgo with perf (extra runs) and print where its CPU goes
#   STREAM_WRITES=event         the canned upstream writes each SSE event on its own;
#                               "once": each whole stream in one write (a diagnostic)
#   OTHERS_MAX=10 RETRIES=2 NOISE_BUDGET=120   the disturbance guard (see above)
#   REPLICAS=16 BASE_PORT=18400 PROXY_CPU=1 LOAD_CPU=0 KEEP_TMP=0 (1: keep the logs)
# Needs nginx and wrk (installed with apt-get if missing), taskset, curl, go.
set -euo pipefail

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}
WARMUP=${WARMUP:-2}
TTFT_N=${TTFT_N:-200}
TTFT_ROUNDS=${TTFT_ROUNDS:-$ROUNDS}
SPEEDUP_1K=${SPEEDUP_1K:-10}
SPEEDUP_16K=${SPEEDUP_16K:-40}
PHASES=${PHASES:-throughput ttft}
STREAM_WRITES=${STREAM_WRITES:-event}
OTHERS_MAX=${OTHERS_MAX:-10}
RETRIES=${RETRIES:-2}
NOISE_BUDGET=${NOISE_BUDGET:-120}
REPLICAS=${REPLICAS:-16}
BASE_PORT=${BASE_PORT:-18400}
PROXY_CPU=${PROXY_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
KEEP_TMP=${KEEP_TMP:-0}
PERF=${PERF:-0}

root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/proxy-vs-nginx.XXXXXX)
chmod 755 "$tmp" # nginx's worker runs as nobody when nginx is started by root

# Ports: the canned upstream takes BASE_PORT .. BASE_PORT+REPLICAS-1.
up_port=$BASE_PORT
nginx_port=$((BASE_PORT + 100))   # nginx -> canned upstream
gorgo1_port=$((BASE_PORT + 101))  # gorgo serve, 1 replica -> canned upstream
gorgoN_port=$((BASE_PORT + 102))  # gorgo serve, REPLICAS replicas -> canned upstream
relay_port=$((BASE_PORT + 103))   # proxybench relay (the net/http floor) -> canned upstream
engine_port=$((BASE_PORT + 110))  # gorgo engine (TTFT runs)
nginx_e_port=$((BASE_PORT + 111)) # nginx -> engine
gorgo_e_port=$((BASE_PORT + 112)) # gorgo serve -> engine

# ---- processes: every one started is recorded and stopped on exit ----
pids=()
# start NAME CPU CMD...: runs CMD pinned to CPU in the background, logging to
# $tmp/NAME.log; its PID (taskset execs CMD, so it is CMD's) is in $last_pid.
# (Never run a shell function with &: that puts a subshell between us and CMD.)
start() {
	local name=$1 cpu=$2
	shift 2
	taskset -c "$cpu" "$@" >"$tmp/$name.log" 2>&1 &
	last_pid=$!
	pids+=("$last_pid")
}
stop() { # stop PID: SIGTERM, wait, forget it
	kill "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
	local keep=() p
	for p in "${pids[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
	pids=("${keep[@]}")
}
cleanup() {
	local rc=$? p f
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [[ $rc != 0 ]]; then
		echo "failed (exit $rc); logs:" >&2
		for f in "$tmp"/*.log; do [[ -s $f ]] && { echo "== $f" >&2; tail -n 20 "$f" >&2; }; done
	fi
	if [[ $KEEP_TMP == 1 ]]; then echo "kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "[$(date +%T)] $*" >&2; }
on_load() { taskset -c "$LOAD_CPU" "$@"; } # foreground commands only

# wait_ok URL: until GET URL answers 200 (every 0.2 s, for 20 s at most).
wait_ok() {
	local i
	for ((i = 0; i < 100; i++)); do
		[[ $(curl -s -o /dev/null -w '%{http_code}' "$1" || true) == 200 ]] && return 0
		sleep 0.2
	done
	echo "no 200 from $1" >&2
	return 1
}

# wait_replicas URL N: until gorgo serve at URL has N healthy replicas (it
# routes to a replica only once a probe has reached it).
wait_replicas() {
	local i n=0
	wait_ok "$1/health"
	for ((i = 0; i < 100; i++)); do
		n=$(curl -s "$1/metrics" | grep -c '^gorgo_replica_healthy{.*} 1$' || true)
		[[ $n == "$2" ]] && return 0
		sleep 0.2
	done
	echo "$1: $n of $2 replicas healthy" >&2
	return 1
}

# ---- tools ----
if ! command -v wrk >/dev/null || ! { command -v nginx || [[ -x /usr/sbin/nginx ]]; } >/dev/null; then
	log "nginx and/or wrk missing: installing the Debian packages (apt-get install nginx wrk)"
	sudo=""
	[[ $(id -u) == 0 ]] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx wrk >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
if [[ -z ${GORGO_BIN:-} ]]; then
	log "building gorgo from $root"
	(cd "$root" && go build -o "$tmp/gorgo" ./cmd/gorgo)
	GORGO_BIN=$tmp/gorgo
fi
log "building proxybench"
(cd "$root" && go build -o "$tmp/proxybench" ./scripts/proxybench)
PB=$tmp/proxybench
log "$("$NGINX" -v 2>&1), $(wrk -v 2>&1 | head -n 1 | cut -d' ' -f1-2), gorgo $GORGO_BIN"

# ---- nginx: a plain reverse proxy with upstream keep-alive, unbuffered ----
# Bodies up to 1 MB stay in memory (the default 16 KB buffer would write the
# 64 KB bodies to a temp file), and connections are not closed after 1000
# requests (nginx's default), as gorgo's are not.
mkdir -p "$tmp/nginx"
cat >"$tmp/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/nginx-error.log warn;
events { worker_connections 4096; }
http {
	access_log off;
	client_body_temp_path $tmp/nginx/body;
	proxy_temp_path $tmp/nginx/proxy;
	fastcgi_temp_path $tmp/nginx/fastcgi;
	uwsgi_temp_path $tmp/nginx/uwsgi;
	scgi_temp_path $tmp/nginx/scgi;
	client_max_body_size 32m;
	client_body_buffer_size 1m;
	keepalive_requests 1000000;

	upstream canned { server 127.0.0.1:$up_port; keepalive 64; keepalive_requests 1000000; }
	upstream engine { server 127.0.0.1:$engine_port; keepalive 16; keepalive_requests 1000000; }
	proxy_http_version 1.1;
	proxy_set_header Connection "";
	proxy_buffering off;

	server { listen 127.0.0.1:$nginx_port; location / { proxy_pass http://canned; } }
	server { listen 127.0.0.1:$nginx_e_port; location / { proxy_pass http://engine; } }
}
EOF
"$NGINX" -t -q -p "$tmp/" -c "$tmp/nginx.conf" -e "$tmp/nginx-error.log"

# ---- run accounting and the disturbance guard ----
# snap PIDS...: /proc/stat ticks of LOAD_CPU and of PROXY_CPU (total, idle
# with iowait, softirq), then each process's CPU time and run-queue wait in
# ns (/proc/PID/task/*/schedstat: exact, where /proc/PID/stat is sampled at
# each tick and misses a process that runs in short bursts).
sched() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ c += $1; w += $2 } END { print c + 0, w + 0 }'; }
snap() {
	local p line=""
	for p in "$@"; do line+=" $(sched "$p")"; done
	awk -v a="cpu$LOAD_CPU" -v b="cpu$PROXY_CPU" -v procs="$line" '
		$1 == a || $1 == b { t = 0; for (i = 2; i <= 9; i++) t += $i; v[$1] = t " " ($5 + $6) " " $8 }
		END { print v[a], v[b], procs }' /proc/stat
}

# The time the guard may spend waiting for quiet and repeating disturbed
# runs, so that a busy machine delays the result by a bounded time.
noise_left=$NOISE_BUDGET

# quiet: before a run, wait (within the budget) until neither CPU is more
# than 20% busy over half a second (ours are idle between runs).
quiet() {
	local a b busy said=0 t0=$SECONDS
	while ((noise_left - (SECONDS - t0) > 0)); do
		a=$(snap)
		sleep 0.5
		b=$(snap)
		busy=$(awk -v s="$a $b" 'BEGIN { split(s, x, " ");
			print int(100 * (1 - (x[8] - x[2]) / (x[7] - x[1]))), int(100 * (1 - (x[11] - x[5]) / (x[10] - x[4]))) }')
		((${busy% *} <= 20 && ${busy#* } <= 20)) && break
		((said)) || log "  waiting for other processes to quiet down (CPU$LOAD_CPU, CPU$PROXY_CPU busy: ${busy/ /% }%)"
		said=1
		sleep 0.5
	done
	noise_left=$((noise_left - (SECONDS - t0)))
}

# measure OUT UPSTREAM_PID PROXY_PID CMD...: runs CMD on LOAD_CPU (output to
# OUT) and sets $acct to ten figures about the run, in % of a CPU:
#   LOAD_CPU busy, its softirq, the upstream, CMD (the load);
#   PROXY_CPU busy, its softirq, the proxy;
#   the proxy's run-queue wait (% of its own CPU time; gorgo's threads wait
#   for each other too, on one CPU);
#   others on LOAD_CPU and on PROXY_CPU: busy time that none of ours explains
#   (loopback TCP is processed in softirq, mostly on the sender's CPU).
measure() {
	local out=$1 up=$2 px=$3 before after w0 w1 TIMEFORMAT='%U %S'
	shift 3
	before=$(snap "$up" "$px") w0=$(date +%s%N)
	{ time on_load "$@" >"$out" 2>&1; } 2>"$out.time" # time: CMD's own CPU
	after=$(snap "$up" "$px") w1=$(date +%s%N)
	acct=$(awk -v s="$before $after $w0 $w1 $(cat "$out.time")" 'BEGIN { split(s, x, " ")
		d0 = x[11] - x[1]; d1 = x[14] - x[4]; wall = (x[22] - x[21]) / 1e9
		b0 = 100 * (1 - (x[12] - x[2]) / d0); si0 = 100 * (x[13] - x[3]) / d0
		up = 100 * (x[17] - x[7]) / 1e9 / wall; cmd = 100 * (x[23] + x[24]) / wall
		b1 = 100 * (1 - (x[15] - x[5]) / d1); si1 = 100 * (x[16] - x[6]) / d1; px = 100 * (x[19] - x[9]) / 1e9 / wall
		wait = (x[19] > x[9]) ? 100 * (x[20] - x[10]) / (x[19] - x[9]) : 0
		o0 = b0 - si0 - up - cmd; o1 = b1 - si1 - px
		printf "%.0f %.0f %.0f %.0f %.0f %.0f %.0f %.1f %.0f %.0f", b0, si0, up, cmd, b1, si1, px, wait, (o0 > 0 ? o0 : 0), (o1 > 0 ? o1 : 0) }')
}
# describe ACCT...: the figures in words (the wait is in the raw tables).
describe() {
	printf 'CPU%s %s%% busy (upstream %s%%, load %s%%, softirq %s%%, others %s%%), CPU%s %s%% busy (proxy %s%%, softirq %s%%, others %s%%)' \
		"$LOAD_CPU" "$1" "$3" "$4" "$2" "$9" "$PROXY_CPU" "$5" "$7" "$6" "${10}"
}
# guarded OUT UPSTREAM_PID PROXY_PID CMD...: measure, repeated while other
# processes took more than OTHERS_MAX % of either CPU (within the budget).
# OUT and $acct are the least disturbed attempt's; $attempts is how many
# attempts were made.
guarded() {
	local out=$1 best=0 best_score=1000000 score a t0
	for ((a = 1; ; a++)); do
		quiet
		t0=$SECONDS
		measure "$out.$a" "${@:2}"
		((a > 1)) && noise_left=$((noise_left - (SECONDS - t0)))
		read -r -a f <<<"$acct"
		score=$((f[8] + f[9]))
		((score < best_score)) && best=$a best_score=$score best_acct=$acct
		((f[8] <= OTHERS_MAX && f[9] <= OTHERS_MAX)) && break
		((a <= RETRIES && noise_left > 0)) || break
		# shellcheck disable=SC2086
		log "  disturbed, again: $(describe $acct)"
	done
	cp "$out.$best" "$out"
	acct=$best_acct attempts=$a
}

results=$tmp/results.txt # one line per measured run (see the raw tables at the end)
: >"$results"
gorgo_status="" perf_report=""

has() { [[ " $PHASES " == *" $1 "* ]]; }

# nginx serves both phases (one server block for each upstream).
start nginx "$PROXY_CPU" "$NGINX" -p "$tmp/" -c "$tmp/nginx.conf" -e "$tmp/nginx-error.log"
nginx_pid=$last_pid
for ((i = 0; i < 50; i++)); do
	nginx_worker=$(pgrep -P "$nginx_pid" | head -n 1 || true) # the process doing nginx's work
	[[ -n $nginx_worker ]] && break
	sleep 0.1
done

# ---- phase 1: throughput against the canned upstream ----
targets=(nginx gorgo gorgoN relay)
if has throughput; then # (not indented: it is most of the script)
coalesce=()
[[ $STREAM_WRITES == once ]] && coalesce=(-coalesce)
up_addrs=""
for ((i = 0; i < REPLICAS; i++)); do up_addrs+="${up_addrs:+,}127.0.0.1:$((up_port + i))"; done
start upstream "$LOAD_CPU" "$PB" upstream -listen "$up_addrs" "${coalesce[@]}"
up_pid=$last_pid
start gorgo1 "$PROXY_CPU" env GOMAXPROCS=1 "$GORGO_BIN" serve --admin-listen off --listen "127.0.0.1:$gorgo1_port" --access-log=false \
	--replica "r0=http://127.0.0.1:$up_port,profile=paper"
gorgo1_pid=$last_pid
replica_flags=()
for ((i = 0; i < REPLICAS; i++)); do replica_flags+=(--replica "r$i=http://127.0.0.1:$((up_port + i)),profile=paper"); done
start gorgoN "$PROXY_CPU" env GOMAXPROCS=1 "$GORGO_BIN" serve --admin-listen off --listen "127.0.0.1:$gorgoN_port" --access-log=false "${replica_flags[@]}"
gorgoN_pid=$last_pid
# The floor of Go's net/http: a reverse proxy that only relays.
start relay "$PROXY_CPU" env GOMAXPROCS=1 "$PB" relay -listen "127.0.0.1:$relay_port" -upstream "http://127.0.0.1:$up_port"
relay_pid=$last_pid

wait_ok "http://127.0.0.1:$up_port/health"
wait_ok "http://127.0.0.1:$relay_port/health"
wait_ok "http://127.0.0.1:$nginx_port/health"
wait_replicas "http://127.0.0.1:$gorgo1_port" 1
wait_replicas "http://127.0.0.1:$gorgoN_port" "$REPLICAS"

declare -A url=([nginx]="http://127.0.0.1:$nginx_port" [gorgo]="http://127.0.0.1:$gorgo1_port" [gorgoN]="http://127.0.0.1:$gorgoN_port" [relay]="http://127.0.0.1:$relay_port")
declare -A proc=([nginx]="$nginx_worker" [gorgo]="$gorgo1_pid" [gorgoN]="$gorgoN_pid" [relay]="$relay_pid")
for t in "${targets[@]}"; do
	on_load "$PB" check -url "${url[$t]}" >&2 # the 21-event stream and the answer come through whole
done

# The wrk scripts: POST one fixed ~1k-token chat body (the same bytes every
# time). The streaming body asks for usage (stream_options.include_usage):
# gorgo would add that to the body itself otherwise, and nginx would get a
# different (20-event) stream back.
for mode in nonstream stream; do
	flag=""
	[[ $mode == stream ]] && flag=-stream
	"$PB" body -tokens 1000 $flag >"$tmp/$mode.json"
	cat >"$tmp/$mode.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open("$tmp/$mode.json", "rb"))
wrk.body = f:read("*a")
f:close()
EOF
done
log "request bodies: $(wc -c <"$tmp/nonstream.json") bytes (non-streaming), $(wc -c <"$tmp/stream.json") bytes (streaming)"

# run_wrk MODE TARGET SECONDS ROUND: one wrk run, recorded unless ROUND is
# "warmup": req/s, latency p50/p99, errors, then the accounting.
run_wrk() {
	local mode=$1 t=$2 secs=$3 round=$4 out="$tmp/wrk-$1-$2-$4.txt" rps p50 p99 errs
	local cmd=(wrk -t1 -c"$CONNS" -d"${secs}s" --latency -s "$tmp/$mode.lua" "${url[$t]}/v1/chat/completions")
	if [[ $round == warmup ]]; then
		on_load "${cmd[@]}" >"$out"
		return
	fi
	guarded "$out" "$up_pid" "${proc[$t]}" "${cmd[@]}"
	rps=$(awk '/^Requests\/sec:/ { print $2 }' "$out")
	p50=$(awk '$1 == "50%" { print $2 }' "$out")
	p99=$(awk '$1 == "99%" { print $2 }' "$out")
	errs=$(awk '/Non-2xx/ { n += $NF } /Socket errors/ { gsub(",", ""); n += $4 + $6 + $8 + $10 } END { print n + 0 }' "$out")
	echo "$mode $t $round $rps $p50 $p99 $errs $acct $attempts" >>"$results"
	# shellcheck disable=SC2086
	log "$(printf '%-9s %-6s round %s: %9s req/s, latency p50 %s p99 %s, errors %s; ' "$mode" "$t" "$round" "$rps" "$p50" "$p99" "$errs")$(describe $acct)"
}

log "throughput: $ROUNDS rounds of ${DURATION}s per proxy and mode, $CONNS connections (after ${WARMUP}s of warm-up each)"
for mode in nonstream stream; do
	for t in "${targets[@]}"; do run_wrk "$mode" "$t" "$WARMUP" warmup; done
done
for ((r = 1; r <= ROUNDS; r++)); do
	for mode in nonstream stream; do
		for t in "${targets[@]}"; do run_wrk "$mode" "$t" "$DURATION" "$r"; done
	done
done

# What gorgo answered: every request a 200 (but for the ones cut off when a
# wrk run ends, 499), every scrape a success (else gorgo ran without the
# engine's gauges).
gorgo_counts() {
	curl -s "$1/metrics" | awk '
		/^gorgo_requests_total/ { c = $1; sub(/.*code="/, "", c); sub(/".*/, "", c); n[c] += $2 }
		/^gorgo_scrape_errors_total/ { e += $2 }
		END { for (c in n) printf "HTTP %s: %d, ", c, n[c]; printf "scrape errors: %d", e }'
}
gorgo_status="gorgo with 1 replica answered $(gorgo_counts "${url[gorgo]}"); with $REPLICAS replicas $(gorgo_counts "${url[gorgoN]}")"
log "$gorgo_status"

# PERF=1: where gorgo's CPU goes, from perf (Go binaries keep frame pointers
# and symbols) attached to gorgo (1 replica) during one more wrk run per
# mode, not counted above (perf slows what it watches a little).
if [[ $PERF == 1 ]]; then
	for mode in nonstream stream; do
		taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$tmp/$mode.lua" "${url[gorgo]}/v1/chat/completions" >"$tmp/perf-wrk-$mode.txt" 2>&1 &
		wrk_pid=$!
		sleep 1
		perf record -q -F 999 -g -p "$gorgo1_pid" -o "$tmp/perf-$mode.data" -- sleep $((DURATION - 2)) >/dev/null 2>&1 || log "perf record failed"
		wait "$wrk_pid" || true
		perf_report+=$'\n'"gorgo, $mode, % of its CPU time (inclusive) in: ($(awk '/^Requests\/sec:/ { print $2 }' "$tmp/perf-wrk-$mode.txt") req/s under perf)"$'\n'
		perf_report+=$(perf report -i "$tmp/perf-$mode.data" --children --sort sym --stdio -g none 2>/dev/null |
			grep -E '\] (github.com/gorgo-llm/gorgo/internal/[a-z]+\.|encoding/json\.Unmarshal$|runtime\.gcBgMarkWorker$|runtime\.mallocgc$|entry_SYSCALL_64_after_hwframe$|net/http\.\(\*conn\)\.serve$|net/http\.\(\*persistConn\)\.(readLoop|writeLoop)$)' |
			awk '$1 + 0 >= 0.5 { sub(/github.com\/gorgo-llm\/gorgo\/internal\//, ""); printf "  %7s  %s\n", $1, $NF }' | head -n 25)
	done
fi

# Throughput done: stop its upstream and gorgos, so that they cannot disturb
# the latency runs (nginx stays: it proxies to the engine too).
stop "$relay_pid"
stop "$gorgoN_pid"
stop "$gorgo1_pid"
stop "$up_pid"
fi

# ---- phase 2: added TTFT, one request at a time, gorgo engine upstream ----
if has ttft; then # (not indented either)
start engine "$LOAD_CPU" "$GORGO_BIN" engine --listen "127.0.0.1:$engine_port" --speedup "$SPEEDUP_1K"
engine_pid=$last_pid
wait_ok "http://127.0.0.1:$engine_port/health"
start gorgo-engine "$PROXY_CPU" env GOMAXPROCS=1 "$GORGO_BIN" serve --admin-listen off --listen "127.0.0.1:$gorgo_e_port" --access-log=false \
	--replica "engine=http://127.0.0.1:$engine_port,profile=paper"
gorgo_e_pid=$last_pid
wait_replicas "http://127.0.0.1:$gorgo_e_port" 1
declare -A eurl=([nginx]="http://127.0.0.1:$nginx_e_port" [gorgo]="http://127.0.0.1:$gorgo_e_port")
declare -A eproc=([nginx]="$nginx_worker" [gorgo]="$gorgo_e_pid")

log "added TTFT: $TTFT_ROUNDS rounds of $TTFT_N requests per proxy and size, each paired with one straight to the engine"
declare -A speedup=([1000]=$SPEEDUP_1K [16000]=$SPEEDUP_16K)
for ((r = 1; r <= TTFT_ROUNDS; r++)); do
	for tokens in 1000 16000; do
		curl -sf -o /dev/null -X POST "http://127.0.0.1:$engine_port/admin/speed?speedup=${speedup[$tokens]}"
		for t in nginx gorgo; do
			out=$tmp/ttft-$tokens-$t-$r.txt
			guarded "$out" "$engine_pid" "${eproc[$t]}" "$PB" ttft -url "${eurl[$t]}" -direct "http://127.0.0.1:$engine_port" -tokens "$tokens" -n "$TTFT_N"
			# tokens=N n=N p50=.. p99=.. direct_p50=.. direct_p99=.. added_p50=.. added_p99=..
			echo "ttft$tokens $t $r $(tr ' ' '\n' <"$out" | awk -F= '$1 ~ /p50|p99/ { printf "%s ", $2 }')$acct $attempts" >>"$results"
			# shellcheck disable=SC2086
			log "ttft $tokens tokens $t round $r: $(cat "$out"); $(describe $acct)"
		done
	done
done
fi

# ---- report: medians over rounds ----
# median KIND TARGET FIELD: the median over rounds of a field of results.txt.
median() {
	awk -v k="$1" -v t="$2" -v f="$3" '$1 == k && $2 == t { print $f }' "$results" | sort -g |
		awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
fmt_int() { awk -v x="$1" 'BEGIN { s = sprintf("%.0f", x); while (s ~ /[0-9][0-9][0-9][0-9]/) sub(/[0-9][0-9][0-9]($|,)/, ",&", s); print s }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { r = a / b; if (r >= 0.1) printf "%.2f", r; else printf "%.3f", r }'; }
times() { awk -v a="$1" -v b="$2" 'BEGIN { r = a / b; if (r < 0) printf "n/a"; else if (r >= 10) printf "%.0f×", r; else printf "%.1f×", r }'; }
ms() { awk -v x="$1" 'BEGIN { printf "%+.2f", x }'; }

# results.txt fields: throughput runs: 4 req/s, 5-6 latency p50/p99, 7 errors,
# 8-17 accounting, 18 attempts; TTFT runs: 4-5 proxied p50/p99, 6-7 direct,
# 8-9 added, 10-19 accounting, 20 attempts.
ns_n=$(median nonstream nginx 4) ns_g=$(median nonstream gorgo 4) ns_gN=$(median nonstream gorgoN 4) ns_r=$(median nonstream relay 4)
st_n=$(median stream nginx 4) st_g=$(median stream gorgo 4) st_gN=$(median stream gorgoN 4) st_r=$(median stream relay 4)
for k in 1000 16000; do
	for t in nginx gorgo; do
		declare "a50_${t}_$k=$(median "ttft$k" "$t" 8)" "a99_${t}_$k=$(median "ttft$k" "$t" 9)" "d50_${t}_$k=$(median "ttft$k" "$t" 6)"
	done
done

echo
echo "## gorgo serve vs nginx"
echo
echo "$(nproc) CPUs; proxy on CPU $PROXY_CPU, upstream and load on CPU $LOAD_CPU; throughput: median of $ROUNDS rounds of ${DURATION}s," \
	"$CONNS connections, upstream streams $([[ $STREAM_WRITES == once ]] && echo "written whole in one write" || echo "written one event per write");" \
	"TTFT: median of $TTFT_ROUNDS rounds of $TTFT_N requests per target."
echo
echo "| | nginx | gorgo serve | gorgo ÷ nginx |"
echo "|---|---|---|---|"
if has throughput; then
	echo "| non-streaming req/s | $(fmt_int "$ns_n") | $(fmt_int "$ns_g") ($REPLICAS replicas $(fmt_int "$ns_gN")) | $(ratio "$ns_g" "$ns_n") |"
	echo "| streaming req/s (21 SSE events) | $(fmt_int "$st_n") | $(fmt_int "$st_g") ($REPLICAS replicas $(fmt_int "$st_gN")) | $(ratio "$st_g" "$st_n") |"
fi
if has ttft; then
	echo "| added TTFT p50 / p99, one at a time, 1k tokens (engine emulator upstream) | $(ms "$a50_nginx_1000") / $(ms "$a99_nginx_1000") ms | $(ms "$a50_gorgo_1000") / $(ms "$a99_gorgo_1000") ms | $(times "$a50_gorgo_1000" "$a50_nginx_1000") |"
	echo "| added TTFT p50 / p99, 16k tokens (64 KB body) | $(ms "$a50_nginx_16000") / $(ms "$a99_nginx_16000") ms | $(ms "$a50_gorgo_16000") / $(ms "$a99_gorgo_16000") ms | $(times "$a50_gorgo_16000" "$a50_nginx_16000") |"
fi
echo
if has throughput; then
	echo "The floor of Go's net/http on the same core (proxybench relay: read the body, forward it, copy the answer back; no parsing, no routing): $(fmt_int "$ns_r") req/s non-streaming ($(ratio "$ns_r" "$ns_n") of nginx; gorgo $(ratio "$ns_g" "$ns_r") of it), $(fmt_int "$st_r") streaming ($(ratio "$st_r" "$st_n") of nginx; gorgo $(ratio "$st_g" "$st_r") of it)."
fi
if has ttft; then
	echo "TTFT ratio: gorgo's added p50 over nginx's. Direct TTFT p50 (the engine alone, at ${SPEEDUP_1K}x and ${SPEEDUP_16K}x): $(printf '%.2f' "$d50_nginx_1000") ms at 1k tokens, $(printf '%.2f' "$d50_nginx_16000") ms at 16k."
fi
[[ -n $gorgo_status ]] && echo "$gorgo_status."
[[ -n $perf_report ]] && echo "$perf_report"
disturbed=$(awk -v m="$OTHERS_MAX" '{ o0 = /^ttft/ ? $18 : $16; o1 = /^ttft/ ? $19 : $17 } o0 > m || o1 > m { n++ } END { print n + 0 }' "$results")
if ((disturbed > 0)); then
	echo "WARNING: in $disturbed of $(wc -l <"$results") runs other processes took more than $OTHERS_MAX% of a CPU even after retries (see the raw tables): those figures are not to be trusted."
fi
echo
# Which side limited each throughput figure: the proxy's CPU should be the
# saturated one. When the load CPU (upstream + wrk) was saturated too, the
# proxy might have done more than its figure says.
has throughput && echo "What limited each throughput figure (medians over rounds, % of a CPU):"
for mode in $(has throughput && echo nonstream stream); do
	for t in "${targets[@]}"; do
		use=()
		for f in 8 9 10 11 12 13 14 15 16 17; do use+=("$(median "$mode" "$t" "$f")"); done
		b0=${use[0]%.*} b1=${use[4]%.*}
		if ((b1 >= 95 && b0 < 95)); then
			note="proxy-bound"
		elif ((b1 >= 95)); then
			note="both CPUs saturated: perhaps a lower bound for this proxy"
		elif ((b0 >= 95)); then
			note="load-bound: a lower bound for this proxy"
		else
			note="neither CPU saturated"
		fi
		printf '  %-9s %-6s %s: %s\n' "$mode" "$t" "$(describe "${use[@]}")" "$note"
	done
done
echo
if has throughput; then
	echo "Raw throughput runs (% of a CPU: CPU$LOAD_CPU busy, softirq, upstream, wrk; CPU$PROXY_CPU busy, softirq, proxy; proxy's run-queue wait, % of its CPU time; others on CPU$LOAD_CPU, on CPU$PROXY_CPU):"
	{
		echo "mode proxy round req/s p50 p99 errors busy$LOAD_CPU si$LOAD_CPU upstream wrk busy$PROXY_CPU si$PROXY_CPU proxy wait% others$LOAD_CPU others$PROXY_CPU attempts"
		grep -v '^ttft' "$results"
	} | column -t
	echo
fi
if has ttft; then
	echo "Raw TTFT runs (ms; then the accounting as above, with the engine as the upstream and the TTFT client as the load):"
	{
		echo "size proxy round p50 p99 direct_p50 direct_p99 added_p50 added_p99 busy$LOAD_CPU si$LOAD_CPU engine client busy$PROXY_CPU si$PROXY_CPU proxy wait% others$LOAD_CPU others$PROXY_CPU attempts"
		grep '^ttft' "$results"
	} | column -t
fi
