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
RATE=${RATE:-24} N=${N:-600} SEED=${SEED:-1} MEDIA=${MEDIA:-image}
exec "$(dirname "$0")/three-replicas.sh" ./scripts/vision "" --rate "$RATE" --n "$N" --seed "$SEED" --media "$MEDIA"
