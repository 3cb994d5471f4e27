#!/usr/bin/env bash
# Sliced inference on large images (docs/detect-and-track.md, "Small objects in large images"):
# builds 2560x1920 images from 4x4 BCCD test images (examples/compose_large.rs), then validates
# the built-in BCCD weights on the source split (per image), on the large images as one 640-px
# letterbox each, and with tiles of 640; then the peak memory of `detect --tile 640` on a
# 10000x10000 JPEG. Run from the repository root: bash benches/tiles.sh [SHARED]
set -euo pipefail
shared=${1:-${YOLO9_SHARED:-../shared}}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cargo build --release --bin yolo9 --example compose_large
bin=target/release/yolo9
w=weights/yolov9-s-bccd.safetensors
target/release/examples/compose_large "$shared/datasets/bccd/data.yaml" test "$out/large" 4
val() { "$bin" val --weights "$w" --img 640 --noplots --project "$out/runs" "$@" 2>&1 | grep -E "^ +all "; }
echo "per image (640x480, --img 640):"; val --data "$shared/datasets/bccd/data.yaml" --split test
echo "large, whole (--img 640):";        val --data "$out/large/data.yaml" --split test
echo "large, --tile 640:";                val --data "$out/large/data.yaml" --split test --tile 640
echo "large, --tile 640 --tile-full-image true:"; val --data "$out/large/data.yaml" --split test --tile 640 --tile-full-image true
ffmpeg -loglevel error -y -loop 1 -i examples/images/BloodImage_00007.jpg \
  -vf "scale=625:625,tile=16x16" -frames:v 1 -q:v 3 "$out/big.jpg"
/usr/bin/time -f "detect --tile 640, 10000x10000: peak RSS %M KiB, %e s" \
  "$bin" detect "$out/big.jpg" --tile 640 --nosave --project "$out/runs" 2>&1 | grep -E "tiles of|peak RSS"
