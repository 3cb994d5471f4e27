#!/bin/bash
# yolo9's CPU engine against ONNX Runtime on yolo9's own ONNX export of the same weights, in one
# command: rounds of (each yolo9 setting, then ONNX Runtime) alternating, so that a shared
# machine's drift hits every side alike; prints each run and the median ratio per setting.
#
#   bash benches/cpu_vs_ort.sh [ROUNDS] [THREADS,...] [HxW]     (default: 3 1,2 480x640)
#
# Settings (env SETTINGS, `;`-separated, an empty one for the defaults): the widest kernel the CPU
# has; the AVX2 kernel forced (YOLO9_CPU_GEMM=avx2); each again with Winograd's F(2x2, 3x3)
# (YOLO9_CPU_WINOGRAD=2) instead of F(4x4, 3x3); YOLO9_CPU_WINOGRAD=0 turns Winograd off. Forward of one image (network and decode),
# median of 10 per run (benches/cpu_detect.rs, benches/ort_cpu.py). Needs `pip install onnxruntime`.
# Without cargo (another machine), set BIN (the cpu_detect bench binary) and DIR (a folder for the
# ONNX export, kept between runs; the export is written there by `BIN --export-onnx` when missing).
set -euo pipefail
rounds=${1:-3}; threads=${2:-1,2}; size=${3:-480x640}
if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet
  cargo bench --bench cpu_detect --no-run --quiet 2>/dev/null
  BIN=$(ls -t target/release/deps/cpu_detect-* | grep -v '\.d$' | head -1)
fi
dir=${DIR:-$(mktemp -d)}; mkdir -p "$dir"; log=$dir/runs.txt; : >"$log"
model=$dir/m-$size-b1.onnx
[ -f "$model" ] || "$BIN" --sizes "$size" --export-onnx "$model" >/dev/null
IFS=';' read -ra settings <<< "${SETTINGS:-;YOLO9_CPU_GEMM=avx2;YOLO9_CPU_WINOGRAD=2;YOLO9_CPU_GEMM=avx2 YOLO9_CPU_WINOGRAD=2}"
[ ${#settings[@]} -gt 0 ] || settings=("")
for r in $(seq "$rounds"); do
  for t in ${threads//,/ }; do
    for s in "${settings[@]}"; do
      ms=$(env $s "$BIN" --threads "$t" --sizes "$size" --batches 1 --iters 10 2>/dev/null | grep -o 'forward_ms=[0-9.]*' | cut -d= -f2)
      echo "$r $t yolo9${s:+ $s} $ms" | tee -a "$log"
    done
    ms=$(python3 benches/ort_cpu.py --yolo9 /bin/false --threads "$t" --sizes "$size" --batches 1 --iters 10 --no-openvino --dir "$dir" | grep -o 'forward_ms=[0-9.]*' | cut -d= -f2)
    echo "$r $t onnxruntime $ms" | tee -a "$log"
  done
done
python3 - "$log" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    f = line.split()
    runs[(f[1], " ".join(f[2:-1]))][f[0]] = float(f[-1])
print("threads | setting | median ms | median ratio to ONNX Runtime (per round)")
for (t, name), v in sorted(runs.items(), key=lambda kv: (int(kv[0][0]), kv[0][1] == "onnxruntime")):
    ort = runs[(t, "onnxruntime")]
    ratios = [v[r] / ort[r] for r in v if r in ort]
    print(f"{t} | {name} | {statistics.median(v.values()):.1f} | {statistics.median(ratios):.2f}x")
PY
