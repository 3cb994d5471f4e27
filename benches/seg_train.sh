#!/usr/bin/env bash
# Segmentation training, yolo9 and the official segment/train.py side by side in one command
# (docs/segmentation.md, "Training"): BCCD (205 train / 87 val images) with every box given as
# the 16-point ellipse inscribed in it, gelan-c-seg from scratch, 640 px, batch 16, 3 epochs,
# AMP, validation of the final epoch; wall time of each whole run and its log.
#
#   bash benches/seg_train.sh BIN OFFICIAL SHARED OUT
#
# BIN: a `cargo build --release --features cuda` yolo9 (with yolo9-cuda beside it); OFFICIAL: a
# checkout of WongKinYiu/yolov9 with ../shared/bench/sitecustomize.py in it; SHARED: the shared
# folder (datasets/bccd); OUT: where the dataset, runs and logs go. Needs one CUDA GPU and the
# official code's Python stack (torch); YOLOV5_CONFIG_DIR must hold a font named Arial.ttf.
set -uo pipefail
bin=$1 official=$(cd "$2" && pwd) shared=$3 out=$(mkdir -p "$4" && cd "$4" && pwd)
python3 - "$shared/datasets/bccd" "$out/segbccd" <<'PY'
import math, os, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
for split in ("train", "val"):
    os.makedirs(f"{dst}/images/{split}", exist_ok=True)
    os.makedirs(f"{dst}/labels/{split}", exist_ok=True)
    for name in sorted(os.listdir(f"{src}/images/{split}")):
        shutil.copy(f"{src}/images/{split}/{name}", f"{dst}/images/{split}/{name}")
        stem = os.path.splitext(name)[0]
        rows = []
        lp = f"{src}/labels/{split}/{stem}.txt"
        for line in open(lp) if os.path.exists(lp) else []:
            p = line.split()
            try:
                c, cx, cy, w, h = int(p[0]), *map(float, p[1:5])
            except (ValueError, IndexError):
                continue
            pts = []
            for k in range(16):
                a = 2 * math.pi * k / 16
                pts += [min(max(cx + w / 2 * math.cos(a), 0), 1), min(max(cy + h / 2 * math.sin(a), 0), 1)]
            rows.append(" ".join([str(c)] + [f"{v:.5f}" for v in pts]))
        open(f"{dst}/labels/{split}/{stem}.txt", "w").write("".join(r + "\n" for r in rows))
open(f"{dst}/data.yaml", "w").write(
    f"path: {dst}\ntrain: images/train\nval: images/val\nnc: 3\nnames: [RBC, WBC, Platelets]\n")
PY
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s%N)
"$bin" train --data "$out/segbccd/data.yaml" --cfg gelan-c-seg --img 640 --batch 16 --epochs 3 \
  --workers 8 --device 0 --noval --project "$out/yolo9" --name seg > "$out/yolo9.log" 2>&1
echo "yolo9 rc=$? wall_ms=$(( ($(date +%s%N) - t0) / 1000000 ))"
cd "$official"
t0=$(date +%s%N)
PYTHONPATH="$official:${PYTHONPATH:-}" TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 python3 segment/train.py \
  --weights '' --cfg models/segment/gelan-c-seg.yaml --data "$out/segbccd/data.yaml" \
  --hyp data/hyps/hyp.scratch-high.yaml --epochs 3 --batch-size 16 --img 640 --device 0 \
  --workers 8 --noval --noplots --project "$out/official" --name seg > "$out/official.log" 2>&1
echo "official rc=$? wall_ms=$(( ($(date +%s%N) - t0) / 1000000 ))"
grep -E "^epoch [0-9]+/" "$out/yolo9.log"
tr '\r' '\n' < "$out/official.log" | grep -E "^ +[0-9]+/[0-9]+ .*100%" | sort -u
