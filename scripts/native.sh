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
#   scripts/native.sh                            # RATE=6 N=240
#   MIXED=1 BASE=fff26c5 scripts/native.sh       # before a replica's 404 was remembered
set -euo pipefail
RATE=${RATE:-6} N=${N:-240} SEED=${SEED:-1}
if [[ -n "${MIXED:-}" ]]; then
  export ENGINE1_FLAGS="--metrics-format vllm --rtt 30ms" ENGINE2_FLAGS="--rtt 40ms" ENGINE3_FLAGS="--rtt 40ms"
  exec "$(dirname "$0")/three-replicas.sh" ./scripts/native "" --rate "$RATE" --n "$N" --seed "$SEED"
fi
exec "$(dirname "$0")/three-replicas.sh" ./scripts/native "--rtt 20ms" --rate "$RATE" --n "$N" --seed "$SEED"
