#!/usr/bin/env bash
# The library's tests for aarch64 (the NEON micro-kernels, the whole CPU engine against candle's
# forward) cross-compiled and run under qemu-user. `.ci/aarch64.sh build` installs what it needs
# and builds; `.ci/aarch64.sh test` runs the tests built (`.ci/run` overlaps the build with the
# x86 tests). Exit 3 from `build`: the aarch64 standard library could not be installed.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
args=(--locked --target aarch64-unknown-linux-gnu --profile emu --no-default-features --lib
  --target-dir target/aarch64)
case "${1:-}" in
  build)
    if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
      rustup target add aarch64-unknown-linux-gnu || exit 3
    fi
    if ! command -v qemu-aarch64 >/dev/null 2>&1 || ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1; then
      SUDO=""
      if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
      $SUDO apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
    fi
    cargo test "${args[@]}" --no-run
    ;;
  test)
    # The CPU engine's modules: GEMM, INT8 GEMM, convolutions, Winograd, math, pool, engine.
    cargo test "${args[@]}" model::cpu
    ;;
  *)
    echo "usage: .ci/aarch64.sh build|test" >&2
    exit 2
    ;;
esac
