#!/usr/bin/env bash
# GPU inference, two yolo9 builds and the official code side by side in one command (the H100
# table of docs/benchmarks.md): each build's detect bench (benches/detect.rs) on yolov9-s with
# seeded random weights at batch 1 (letterboxed image to detections) and batch 32 (forward alone,
# then the batch-1 forward alone), ROUNDS alternating rounds; then the official gelan-s forward
# (benches/torch_gelan_s.py, eager and CUDA graph); then, with ncu on PATH, the kernel times of
# one batch-32 forward of the second build.
#
# usage (on the GPU machine, from the repository root):
#   benches/gpu_detect_compare.sh BEFORE AFTER IMG640 OFFICIAL OUT [ROUNDS]
# BEFORE, AFTER: detect bench binaries (BEFORE `none`: AFTER alone) (`cargo bench --features cuda --bench detect --no-run`
# of each build); IMG640: a 640x640 image; OFFICIAL: a checkout of WongKinYiu/yolov9 with
# ../shared/bench/sitecustomize.py beside its folder or on PYTHONPATH; OUT: where the logs go.
# env: PY (the Python with torch, default python3), EXTRA (environment settings of AFTER run as
# further settings, separated by `;`, each one or more VAR=VALUE words, e.g.
# `YOLO9_INPUT_CONV=0;YOLO9_LOW_RES_PRODUCTS=0 YOLO9_CUDNN_CACHE=/tmp/other`; named extra1,
# extra2, ...). Prints one line per figure and setting.
set -uo pipefail
before=$1 after=$2 img=$3 official=$(cd "$4" && pwd) out=$(mkdir -p "$5" && cd "$5" && pwd)
rounds=${6:-2}
py=${PY:-python3}
args=(--device 0 --cfg yolov9-s --image "$img" --half)
settings=("before" "after")
# BEFORE `none`: the second build and its EXTRA settings alone.
[ "$before" = none ] && settings=("after")
declare -A env_of=([before]="YOLO9_UNUSED=1" [after]="YOLO9_UNUSED=1")
if [ -n "${EXTRA:-}" ]; then
  IFS=';' read -ra extras <<< "$EXTRA"
  for i in "${!extras[@]}"; do
    settings+=("extra$((i + 1))")
    env_of[extra$((i + 1))]=${extras[$i]}
    echo "extra$((i + 1)): ${extras[$i]}"
  done
fi
for r in $(seq "$rounds"); do
  for s in "${settings[@]}"; do
    bin=$after
    [ "$s" = before ] && bin=$before
    # shellcheck disable=SC2086 # one or more VAR=VALUE words
    env ${env_of[$s]} "$bin" --bench "${args[@]}" --iters 100 --batch 1 > "$out/b1_${s}_$r.txt" 2>&1
    # shellcheck disable=SC2086
    env ${env_of[$s]} "$bin" --bench "${args[@]}" --iters 50 --batch 32 --batch-only > "$out/b32_${s}_$r.txt" 2>&1
    for f in "$out/b1_${s}_$r.txt" "$out/b32_${s}_$r.txt"; do
      grep -E "^b(1|32)_(total|forward|forward_only|img_per_s)" "$f" | sed "s/^/round $r $s /"
    done
  done
done
PYTHONPATH="${PYTHONPATH:-}:$(dirname "$official")" "$py" benches/torch_gelan_s.py "$official" t \
  > "$out/torch.txt" 2>&1
grep -E "f16" "$out/torch.txt"
if command -v ncu > /dev/null; then
  YOLO9_PROFILE_ONE=1 ncu --clock-control none --profile-from-start off --csv \
    --metrics gpu__time_duration.sum "$after" --bench "${args[@]}" --iters 5 --batch 32 \
    --batch-only > "$out/ncu.csv" 2> "$out/ncu.err"
  python3 - "$out/ncu.csv" <<'PY'
import collections, csv, sys
hdr, agg, total, n = None, collections.defaultdict(lambda: [0, 0.0]), 0.0, 0
for r in csv.reader(open(sys.argv[1])):
    if "Kernel Name" in r and "Metric Value" in r:
        hdr = r
        continue
    if hdr is None or len(r) != len(hdr):
        continue
    d = dict(zip(hdr, r))
    try:
        v = float(d["Metric Value"].replace(",", ""))
    except ValueError:
        continue
    unit = d.get("Metric Unit", "nsecond")
    us = v / 1000 if unit.startswith("n") else (v if unit.startswith("u") else v * 1000)
    agg[d["Kernel Name"][:90]][0] += 1
    agg[d["Kernel Name"][:90]][1] += us
    total += us
    n += 1
print(f"ncu kernels {n} total_us {total:.1f}")
for name, (c, us) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:30]:
    print(f"ncu {us:9.1f} us {c:4d} {name}")
PY
fi
