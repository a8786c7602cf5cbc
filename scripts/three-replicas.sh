#!/usr/bin/env bash
# Runs a client program against three emulated replicas (gorgo engine, real
# time, this tree's) behind one gorgo serve on 127.0.0.1:18080, then prints
# each replica's requests and prompt tokens (its /metrics). With BASE=REV,
# the proxy of git revision REV runs the same load first. Used by
# scripts/vision.sh and scripts/conversations.sh:
#
#   scripts/three-replicas.sh CLIENT_PACKAGE "ENGINE FLAGS" CLIENT_ARGS...
#
# The client is built from CLIENT_PACKAGE (or is this tree's gorgo replay,
# for CLIENT_PACKAGE "replay") and run with --target
# http://127.0.0.1:18080 and CLIENT_ARGS. SERVE_FLAGS are given to every
# gorgo serve; ENGINE1_FLAGS, ENGINE2_FLAGS and ENGINE3_FLAGS to one
# replica each, after the ENGINE FLAGS (a fleet of different engines).
set -euo pipefail
cd "$(dirname "$0")/.."
client_pkg=$1 engine_flags=$2
shift 2
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; git worktree remove --force "$tmp/base" 2>/dev/null || true; rm -rf "$tmp"' EXIT
go build -o "$tmp/gorgo" ./cmd/gorgo
client=("$tmp/client")
if [[ $client_pkg == replay ]]; then
  client=("$tmp/gorgo" replay)
else
  go build -o "$tmp/client" "$client_pkg"
fi
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
    own=ENGINE${i}_FLAGS
    # shellcheck disable=SC2086 # the engine flags are words
    "$tmp/gorgo" engine --listen 127.0.0.1:1880$i --model m --seed $i $engine_flags ${!own:-} >"$tmp/engine$i.log" 2>&1 & pids+=($!)
  done
  sleep 1
  # shellcheck disable=SC2086 # the serve flags are words
  "$proxy" serve --listen 127.0.0.1:18080 --admin-listen off \
    --replica a=http://127.0.0.1:18801 --replica b=http://127.0.0.1:18802 --replica c=http://127.0.0.1:18803 ${SERVE_FLAGS:-} >"$tmp/serve.log" 2>&1 & pids+=($!)
  sleep 3
  "${client[@]}" --target http://127.0.0.1:18080 "$@" || echo "(the client failed: exit status $?)"
  retries=$(curl -s 127.0.0.1:18080/metrics) ids=(a b c)
  for i in 1 2 3; do
    id=${ids[i-1]}
    curl -s 127.0.0.1:1880$i/metrics | awk -v r=$i -v f="$(grep "^gorgo_retries_total{replica=\"$id\"}" <<<"$retries" | awk '{print $2}')" \
      '/^(sglang:num_requests_total|vllm:request_success_total)/ {n+=$2} /^(sglang|vllm):prompt_tokens_total/ {p=$2} END {printf "replica %s: %d requests, %d prompt tokens; %d attempts it failed or refused\n", r, n, p, f}'
  done
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
done
