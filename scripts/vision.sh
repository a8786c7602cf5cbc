#!/usr/bin/env bash
# A vision model's traffic through gorgo serve: three emulated replicas
# (gorgo engine, real time, an image standing for 1,024 prompt tokens as in
# the router), one proxy, and N chat requests at RATE per second, each a new
# picture (its own URL) and the same 180-token question (scripts/vision).
# MEDIA=audio asks about a new audio clip instead (a fetched clip: 10 s, 250
# tokens), MEDIA=video about a new video (4,096 tokens).
# Prints the client's TTFT and E2E and each replica's requests and prompt
# tokens (its /metrics). With BASE=REV, the proxy of git revision REV runs
# the same load first (the replicas are always this tree's).
#
#   scripts/vision.sh                 # RATE=24 N=600
#   BASE=5c89d0a scripts/vision.sh    # before images were read
#   MEDIA=audio BASE=f8ed233 scripts/vision.sh   # before audio was read
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-24} N=${N:-600} SEED=${SEED:-1} MEDIA=${MEDIA:-image}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; git worktree remove --force "$tmp/base" 2>/dev/null || true; rm -rf "$tmp"' EXIT
go build -o "$tmp/gorgo" ./cmd/gorgo
go build -o "$tmp/vision" ./scripts/vision
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
    "$tmp/gorgo" engine --listen 127.0.0.1:1880$i --model m --seed $i >"$tmp/engine$i.log" 2>&1 & pids+=($!)
  done
  sleep 1
  "$proxy" serve --listen 127.0.0.1:18080 --admin-listen off \
    --replica a=http://127.0.0.1:18801 --replica b=http://127.0.0.1:18802 --replica c=http://127.0.0.1:18803 >"$tmp/serve.log" 2>&1 & pids+=($!)
  sleep 3
  "$tmp/vision" --target http://127.0.0.1:18080 --rate "$RATE" --n "$N" --seed "$SEED" --media "$MEDIA"
  for i in 1 2 3; do
    curl -s 127.0.0.1:1880$i/metrics | awk -v r=$i '/^sglang:num_requests_total/ {n=$2} /^sglang:prompt_tokens_total/ {p=$2} END {printf "replica %s: %d requests, %d prompt tokens\n", r, n, p}'
  done
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
done
