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
RATE=${RATE:-2} N=${N:-60} TURNS=${TURNS:-6} SEED=${SEED:-1}
exec "$(dirname "$0")/three-replicas.sh" ./scripts/conversations --store-responses --rate "$RATE" --n "$N" --turns "$TURNS" --seed "$SEED"
