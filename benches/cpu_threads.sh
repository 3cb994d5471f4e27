#!/bin/bash
# yolo9's CPU engine (widest kernel, AVX2 forced; Winograd F(4x4) and F(2x2)) and ONNX Runtime at 1, 2, 4
# and 16 threads, in alternating rounds: 1 thread pinned to core 2, 2 to cores 2-3, 4 to 2-5, 16
# unpinned; 480x640, batch 1, medians of 10 per run. For a machine without cargo (the device
# host): the cpu_detect bench binary and a folder holding the export m-480x640-b1.onnx are given.
#
#   bash benches/cpu_threads.sh BENCH_BINARY ONNX_DIR [ROUNDS]
#
# BENCH_BINARY: `cargo bench --bench cpu_detect --no-run` prints its path. ONNX_DIR: the --dir of
# an earlier `python3 benches/ort_cpu.py --sizes 480x640 --batches 1` run. Prints one line per run.
set -uo pipefail
bin=$1; dir=$2; rounds=${3:-3}
# The yolo9 settings, `;`-separated (env SETTINGS): the widest kernel and AVX2 forced, each with
# Winograd's F(4x4, 3x3) (the default) and F(2x2, 3x3).
IFS=';' read -ra settings <<< "${SETTINGS:-YOLO9_CPU_GEMM=avx512;YOLO9_CPU_GEMM=avx2;YOLO9_CPU_GEMM=avx512 YOLO9_CPU_WINOGRAD=2;YOLO9_CPU_GEMM=avx2 YOLO9_CPU_WINOGRAD=2}"
for r in $(seq "$rounds"); do for t in 1 2 4 16; do
  case $t in 1) pin="taskset -c 2";; 2) pin="taskset -c 2,3";; 4) pin="taskset -c 2-5";; *) pin="";; esac
  for s in "${settings[@]}"; do
    echo "r$r T$t [$s] $(env $s $pin "$bin" --threads $t --sizes 480x640 --batches 1 --iters 10 2>&1 | grep -o 'forward_ms=[0-9.]*')"
  done
  echo "r$r T$t [ort] $($pin python3 benches/ort_cpu.py --yolo9 /bin/false --threads $t --sizes 480x640 --batches 1 --iters 10 --no-openvino --dir "$dir" 2>&1 | grep -o 'forward_ms=[0-9.]*')"
done; done
