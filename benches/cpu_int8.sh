#!/bin/bash
# yolo9's INT8 CPU engine against its f32 engine, ONNX Runtime FP32, ONNX Runtime's static INT8
# (QDQ) and OpenVINO's NNCF INT8 of yolo9's own export of the same weights, in one command:
# rounds alternating every engine, so that a shared machine's drift hits each alike; prints each
# run, then the median ms and the median per-round ratio to ONNX Runtime FP32 and INT8.
#
#   bash benches/cpu_int8.sh [ROUNDS] [THREADS,...] [HxW]        (default: 3 1,2 480x640)
#
# Weights: the shipped BCCD weights; INT8: `yolo9 convert --int8` calibrated on BCCD's val images
# (../shared/datasets/bccd, or $BCCD), which also calibrate ONNX Runtime and OpenVINO. Without
# cargo (the device host), set BIN (the cpu_detect bench binary), YOLO9 (a yolo9 binary, only
# if the INT8 weights or the export are not in $DIR yet), DIR (a folder for the models, kept
# between runs) and CALIB (ONNX Runtime's calibration images: a folder, or an .npz of letterboxed
# ones as benches/ort_cpu.py reads them).
# Threads are pinned to cores 0.. with taskset where it exists. Needs `pip install onnxruntime`
# (and `openvino nncf pillow` for OpenVINO).
set -euo pipefail
rounds=${1:-3}; threads=${2:-1,2}; size=${3:-480x640}
bccd=${BCCD:-../shared/datasets/bccd}; calib=${CALIB:-$bccd/images/val}
dir=${DIR:-$(mktemp -d)}; mkdir -p "$dir"; log=$dir/runs.txt; : >"$log"
if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet
  cargo bench --bench cpu_detect --no-run --quiet 2>/dev/null
  BIN=$(ls -t target/release/deps/cpu_detect-* | grep -v '\.d$' | head -1)
fi
yolo9=${YOLO9:-target/release/yolo9}
f32=weights/yolov9-s-bccd.safetensors; int8=$dir/bccd-int8.safetensors
[ -f "$int8" ] || "$yolo9" convert "$f32" --int8 --data "$bccd/data.yaml" -o "$int8" >/dev/null
pin() { local n=$1; shift; if command -v taskset >/dev/null && [ "$n" -lt "$(nproc)" ]; then taskset -c 0-$((n - 1)) "$@"; else "$@"; fi; }
for r in $(seq "$rounds"); do
  for t in ${threads//,/ }; do
    for w in "$f32" "$int8"; do
      name=yolo9-f32; [ "$w" = "$int8" ] && name=yolo9-int8
      ms=$(pin "$t" "$BIN" --weights "$w" --threads "$t" --sizes "$size" --batches 1 --iters 10 2>/dev/null | grep -o 'forward_ms=[0-9.]*' | cut -d= -f2)
      echo "$r $t $name $ms" | tee -a "$log"
    done
    pin "$t" python3 benches/ort_cpu.py --yolo9 "$yolo9" --weights "$f32" --threads "$t" --sizes "$size" --batches 1 --iters 10 --dir "$dir" --int8 "$calib" 2>/dev/null \
      | grep -o 'engine=[a-z0-9-]* .*forward_ms=[0-9.]*' | sed -E 's/engine=([a-z0-9-]*) .*forward_ms=([0-9.]*)/\1 \2/' \
      | while read -r e ms; do echo "$r $t $e $ms" | tee -a "$log"; done
  done
done
python3 - "$log" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, t, name, ms = line.split()
    runs[(int(t), name)][r] = float(ms)
print("threads | engine | median ms | ratio to onnxruntime FP32 | ratio to onnxruntime INT8")
for (t, name), v in sorted(runs.items()):
    def ratio(base):
        b = runs.get((t, base), {})
        rs = [v[r] / b[r] for r in v if r in b]
        return f"{statistics.median(rs):.2f}x" if rs else "-"
    print(f"{t} | {name} | {statistics.median(v.values()):.1f} | {ratio('onnxruntime')} | {ratio('onnxruntime-int8')}")
PY
