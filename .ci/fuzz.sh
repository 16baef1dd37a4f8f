#!/usr/bin/env bash
# Fuzzing: the ring packet decoder, the message decoder, the bootstrap
# protocol's parsers, the frames of `pwrun --hosts` and its agents and the TCP wire's frame
# decoder, each fed
# PAGEWIRE_FUZZ_INPUTS mutated inputs by the stable harness in test-support/src/fuzz.rs (about
# a second per million inputs per target here). A longer run:
#   PAGEWIRE_FUZZ_INPUTS=10000000 PAGEWIRE_FUZZ_SEED=2 bash .ci/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PAGEWIRE_FUZZ_INPUTS="${PAGEWIRE_FUZZ_INPUTS:-1000000}" \
  cargo test --release -p pagewire-soft -p pagewire-transport -p pagewire-boot --lib fuzz:: -- --ignored --nocapture --test-threads 1
