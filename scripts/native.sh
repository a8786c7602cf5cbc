#!/usr/bin/env bash
# SGLang's native API through gorgo serve: N streamed POST /generate
# requests at RATE per second (scripts/native) to three emulated replicas
# (gorgo engine, real time), 20 ms away; with MIXED=1 the first is a vLLM
# replica (no /generate) 30 ms away and the others 40 ms, as in a fleet of
# both engines. Prints
# the client's TTFT and E2E and each replica's requests and the attempts
# it failed (a 404 included). With BASE=REV, the proxy of git revision REV
# runs the same load first (the replicas are always this tree's).
#
# With ABORT=D every request asks MAX_NEW tokens (default 2000) and the
# client aborts them all D after the start through the router (SGLang's
# /abort_request), the replicas' KV caches small enough (KV tokens, default
# 20000) that most requests wait in their queues.
#
#   scripts/native.sh                            # RATE=6 N=240
#   MIXED=1 BASE=fff26c5 scripts/native.sh       # before a replica's 404 was remembered
#   ABORT=5s N=60 RATE=20 BASE=fff26c5 scripts/native.sh  # a trainer's abort of its rollouts
set -euo pipefail
RATE=${RATE:-6} N=${N:-240} SEED=${SEED:-1}
if [[ -n "${ABORT:-}" ]]; then
  exec "$(dirname "$0")/three-replicas.sh" ./scripts/native "--rtt 20ms --kv-capacity ${KV:-20000}" --rate "$RATE" --n "$N" --seed "$SEED" \
    --max-new "${MAX_NEW:-2000}" --abort-after "$ABORT"
fi
if [[ -n "${MIXED:-}" ]]; then
  export ENGINE1_FLAGS="--metrics-format vllm --rtt 30ms" ENGINE2_FLAGS="--rtt 40ms" ENGINE3_FLAGS="--rtt 40ms"
  exec "$(dirname "$0")/three-replicas.sh" ./scripts/native "" --rate "$RATE" --n "$N" --seed "$SEED"
fi
exec "$(dirname "$0")/three-replicas.sh" ./scripts/native "--rtt 20ms" --rate "$RATE" --n "$N" --seed "$SEED"
