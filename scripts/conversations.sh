#!/usr/bin/env bash
# Responses API conversations through gorgo serve: three emulated replicas
# (gorgo engine, real time, each with its store on: --store-responses, as
# vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1), one proxy, and N
# conversations of TURNS turns started at RATE per second, each follow-up
# naming the previous response (scripts/conversations). Prints the turns
# answered, the conversations cut short by a refusal (a replica that does
# not hold the previous response answers 404) and the answered turns' TTFT
# and E2E, then each replica's requests. With BASE=REV, the proxy of git
# revision REV runs the same load first (the replicas are always this
# tree's).
#
#   scripts/conversations.sh                 # N=60 TURNS=6 RATE=2
#   BASE=f8ed233 scripts/conversations.sh    # before follow-ups were pinned
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-2} N=${N:-60} TURNS=${TURNS:-6} SEED=${SEED:-1}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; git worktree remove --force "$tmp/base" 2>/dev/null || true; rm -rf "$tmp"' EXIT
go build -o "$tmp/gorgo" ./cmd/gorgo
go build -o "$tmp/conversations" ./scripts/conversations
proxies=("$tmp/gorgo")
if [[ -n "${BASE:-}" ]]; then
  git worktree add -q "$tmp/base" "$BASE"
  (cd "$tmp/base" && go build -o "$tmp/gorgo-base" ./cmd/gorgo)
  proxies=("$tmp/gorgo-base" "$tmp/gorgo")
fi
for proxy in "${proxies[@]}"; do
  echo "== proxy: $(basename "$proxy")"
  pids=()
  for i in 1 2 3; do
    "$tmp/gorgo" engine --listen 127.0.0.1:1880$i --model m --seed $i --store-responses >"$tmp/engine$i.log" 2>&1 & pids+=($!)
  done
  sleep 1
  "$proxy" serve --listen 127.0.0.1:18080 --admin-listen off \
    --replica a=http://127.0.0.1:18801 --replica b=http://127.0.0.1:18802 --replica c=http://127.0.0.1:18803 >"$tmp/serve.log" 2>&1 & pids+=($!)
  sleep 3
  "$tmp/conversations" --target http://127.0.0.1:18080 --rate "$RATE" --n "$N" --turns "$TURNS" --seed "$SEED"
  for i in 1 2 3; do
    curl -s 127.0.0.1:1880$i/metrics | awk -v r=$i '/^sglang:num_requests_total/ {n=$2} /^sglang:prompt_tokens_total/ {p=$2} END {printf "replica %s: %d requests, %d prompt tokens\n", r, n, p}'
  done
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
done
