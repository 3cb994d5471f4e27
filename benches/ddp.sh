#!/usr/bin/env bash
# Data-parallel training throughput (issue 38): yolo9 at 1 GPU, as a group of one on it, and at 2
# GPUs (`--device 0,1`, one process per GPU, gradients summed by NCCL; `train::dist`), and the official DDP
# (`torchrun --nproc_per_node N train_dual.py --device 0,...`) beside it when a checkout is given.
#
# usage (on the GPU machine, from the repository root, a `cuda` release build in target/release):
#   benches/ddp.sh [DATA_YAML] [OFFICIAL_REPO]
# env: EPOCHS (default 2), BATCH (global batch, default 32), IMG (default 640), WORKERS (8),
# REPEAT (default 1: the train split as it is; N: a copy of it N times over, hard-linked into a
# temporary folder, e.g. REPEAT=16 for issue 56's "16x BCCD"; the val split as it is).
# Prints `ddp_yolo9_gpus{N}_img_per_s` (the last epoch's training images/s as yolo9 reports it,
# validation excluded) and `ddp_official_gpus{N}_img_per_s` (images trained / wall-clock seconds
# of the whole command: start-up and the final validation included, so a lower bound).
# The 2-GPU lines are printed as "not measured" when fewer than 2 GPUs are visible.
# For the official code: PYTHONPATH with shared/bench/sitecustomize.py, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
# and YOLOV5_CONFIG_DIR holding an Arial.ttf (see shared/bench/README.md).
set -euo pipefail
DATA=${1:-/work/shared/datasets/bccd/data.yaml}
REPO=${2:-}
EPOCHS=${EPOCHS:-2}
BATCH=${BATCH:-32}
IMG=${IMG:-640}
WORKERS=${WORKERS:-8}
BIN=${YOLO9:-target/release/yolo9}
OUT=$(mktemp -d)
GPUS=$( (nvidia-smi -L 2>/dev/null || true) | wc -l)
REPEAT=${REPEAT:-1}
if [ "$REPEAT" -gt 1 ]; then
  src=$(dirname "$DATA")
  rep=$OUT/data
  mkdir -p "$rep/images/train" "$rep/labels/train"
  for k in $(seq "$REPEAT"); do
    for f in "$src"/images/train/*; do
      n=$(basename "$f")
      ln "$f" "$rep/images/train/r${k}_$n" 2>/dev/null || cp "$f" "$rep/images/train/r${k}_$n"
      l="$src/labels/train/${n%.*}.txt"
      [ -f "$l" ] && { ln "$l" "$rep/labels/train/r${k}_${n%.*}.txt" 2>/dev/null || cp "$l" "$rep/labels/train/r${k}_${n%.*}.txt"; }
    done
  done
  ln -s "$(cd "$src" && pwd)/images/val" "$rep/images/val"
  ln -s "$(cd "$src" && pwd)/labels/val" "$rep/labels/val"
  grep -E '^(nc|names):' "$DATA" > "$rep/data.yaml"
  printf 'path: %s\ntrain: images/train\nval: images/val\n' "$rep" >> "$rep/data.yaml"
  DATA=$rep/data.yaml
fi
NTRAIN=$(ls "$(dirname "$DATA")/images/train" | wc -l)

yolo9_run() { # $1 = device list, $2 = label; env passes through (WORLD_SIZE=1 for a group of one)
  local log="$OUT/yolo9_$2.log"
  "$BIN" train --data "$DATA" --device "$1" --batch "$BATCH" --img "$IMG" --epochs "$EPOCHS" \
    --workers "$WORKERS" --noval --noplots --project "$OUT/runs" --name "$2" >"$log" 2>&1
  # The last "epoch i/N: ... X img/s" summary line of rank 0.
  grep -o '[0-9.]* img/s' "$log" | tail -1 | cut -d' ' -f1
}

official_run() { # $1 = number of GPUs
  local devs
  devs=$(seq -s, 0 $(($1 - 1)))
  local t0 t1
  t0=$(date +%s.%N)
  (cd "$REPO" && torchrun --standalone --nproc_per_node "$1" train_dual.py --device "$devs" \
    --batch "$BATCH" --data "$DATA" --img "$IMG" --cfg models/detect/yolov9-s.yaml --weights '' \
    --hyp hyp.scratch-high.yaml --epochs "$EPOCHS" --workers "$WORKERS" --noval --noplots \
    --close-mosaic 0 --project "$OUT/official" --name "g$1" >"$OUT/official_$1.log" 2>&1)
  t1=$(date +%s.%N)
  awk -v n="$NTRAIN" -v e="$EPOCHS" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", n * e / (b - a) }'
}

echo "ddp_yolo9_gpus1_img_per_s $(yolo9_run 0 g1)"
# The same GPU as rank 0 of a group of one: the data-parallel path (NCCL by default), whose
# step replays from CUDA graphs as one GPU's does (without --sync-bn).
echo "ddp_yolo9_group1_img_per_s $(WORLD_SIZE=1 RANK=0 MASTER_PORT=${MASTER_PORT:-29517} yolo9_run 0 group1)"
grep -h "data-parallel training" "$OUT/yolo9_group1.log" || echo "(no backend line: see $OUT/yolo9_group1.log)"
if [ "$GPUS" -ge 2 ]; then
  echo "ddp_yolo9_gpus2_img_per_s $(yolo9_run 0,1 g2)"
else
  echo "ddp_yolo9_gpus2_img_per_s not measured ($GPUS GPU(s) visible)"
fi
if [ -n "$REPO" ]; then
  echo "ddp_official_gpus1_img_per_s $(official_run 1)"
  if [ "$GPUS" -ge 2 ]; then
    echo "ddp_official_gpus2_img_per_s $(official_run 2)"
  else
    echo "ddp_official_gpus2_img_per_s not measured ($GPUS GPU(s) visible)"
  fi
fi
echo "logs and runs in $OUT"
