#!/usr/bin/env bash
# A soak of gorgo serve: three emulated replicas (the paper's regions, 10x
# faster than real time), the proxy in front, and the embedded workload
# replayed through it for MINUTES minutes of wall time (default 5). Every 30
# s it samples the proxy's goroutines and resident memory from its own
# /metrics; at the end it prints them, the replay's summary (failed
# requests) and what the proxy counted. Everything it starts is stopped on
# exit. Usage: scripts/soak.sh [MINUTES]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-5}
tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
go build -o "$tmp/gorgo" ./cmd/gorgo
g=$tmp/gorgo
port=${BASE_PORT:-19500}
i=0
for rtt in "37ms 8ms" "279ms 80ms" "456ms 138ms"; do
	set -- $rtt
	"$g" engine --listen "127.0.0.1:$((port + 1 + i))" --rtt "$1" --jitter "$2" --speedup 10 >"$tmp/engine$i.log" 2>&1 &
	pids+=($!)
	i=$((i + 1))
done
cat >"$tmp/serve.yaml" <<YAML
listen: 127.0.0.1:$port
admin: {listen: "off"}
probe_interval: 3s
scrape_interval: 3s
replicas:
  - {id: us-ashburn, url: "http://127.0.0.1:$((port + 1))", region: us-ashburn, profile: paper}
  - {id: eu-frankfurt, url: "http://127.0.0.1:$((port + 2))", region: eu-frankfurt, profile: paper}
  - {id: ap-seoul, url: "http://127.0.0.1:$((port + 3))", region: ap-seoul, profile: paper}
YAML
"$g" serve --config "$tmp/serve.yaml" --access-log=false >"$tmp/serve.out" 2>"$tmp/serve.log" &
pids+=($!)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
sample() {
	curl -s "http://127.0.0.1:$port/metrics" | awk -v t="$1" '
		/^go_goroutines / { g = $2 } /^process_resident_memory_bytes / { m = $2 }
		END { printf "%-8s goroutines %5d  rss %6.1f MiB\n", t, g, m / 1048576 }'
}
sample start | tee "$tmp/samples"
"$g" trace gen --duration "$((minutes * 10))m" -o "$tmp/w.jsonl" >/dev/null
"$g" replay --target "http://127.0.0.1:$port" --trace "$tmp/w.jsonl" --time-scale 0.1 --json "$tmp/replay.json" >"$tmp/replay.out" 2>&1 &
rp=$!
pids+=($rp)
t=0
while kill -0 "$rp" 2>/dev/null; do
	sleep 30
	t=$((t + 30))
	kill -0 "$rp" 2>/dev/null && sample "${t}s" | tee -a "$tmp/samples"
done
wait "$rp" || true
sleep 5
sample end | tee -a "$tmp/samples"
echo
tail -4 "$tmp/replay.out"
echo
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^gorgo_(requests_total|retries_total|replica_ejections_total|scrape_errors_total)' || true
