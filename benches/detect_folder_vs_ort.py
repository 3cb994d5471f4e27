"""`yolo9 detect --device cpu` on a folder against ONNX Runtime's forward plus the same JPEG decode
(issue 55's command-line criterion): what a user waits per image, on the same cores.

    pip install onnxruntime pillow
    cargo build --release
    python3 benches/detect_folder_vs_ort.py --yolo9 target/release/yolo9 \
        --images ../shared/datasets/bccd/images/test --threads 2 --rounds 3

yolo9: the wall time of `yolo9 detect FOLDER --device cpu --threads T` (decode, letterbox, forward,
NMS, drawing and saving each image, as a user runs it) minus that of the same command on the
folder's first image alone (process start, weights, thread pool), divided by the other images.
ONNX Runtime: for each image, the JPEG decoded with Pillow, letterboxed to the export's static
size as yolo9 does (scale to fit, centred grey padding) and normalised, then the session run on
`T` intra-op threads: yolo9's own ONNX export of the same weights at that size (network and
decode, no NMS). Rounds alternate the two sides; each prints one line, then the medians and the
median of the rounds' ratios.
"""
import argparse
import glob
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("--yolo9", default="target/release/yolo9")
p.add_argument("--weights", default="weights/yolov9-s-bccd.safetensors")
p.add_argument("--images", required=True, help="a folder of JPEG images of one size")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--img", type=int, default=640, help="inference size (the longer side)")
a = p.parse_args()

from PIL import Image  # noqa: E402
import onnxruntime as ort  # noqa: E402

files = sorted(f for f in glob.glob(os.path.join(a.images, "*")) if f.lower().endswith((".jpg", ".jpeg")))
if len(files) < 2:
    raise SystemExit(f"{a.images}: need at least 2 JPEG images")
work = tempfile.mkdtemp(prefix="yolo9-folder-")
one = os.path.join(work, "one")
os.makedirs(one)
shutil.copy(files[0], one)
w0, h0 = Image.open(files[0]).size
# The letterbox of yolo9 detect (and the official detect.py): the longer side to --img, the other
# side padded up to a multiple of 32.
r = a.img / max(w0, h0)
nw, nh = round(w0 * r), round(h0 * r)
W, H = -(-nw // 32) * 32, -(-nh // 32) * 32
model = os.path.join(work, f"m-{H}x{W}.onnx")
subprocess.run([a.yolo9, "export", "--weights", a.weights, "--img", str(H), str(W), "-o", model],
               check=True, capture_output=True)


def yolo9_wall(src):
    out = os.path.join(work, "runs")
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([a.yolo9, "detect", src, "--weights", a.weights, "--device", "cpu", "--threads",
                    str(a.threads), "--img", str(a.img), "--project", out],
                   check=True, capture_output=True)
    return time.perf_counter() - t0


def yolo9_per_image():
    full = yolo9_wall(a.images)
    single = yolo9_wall(one)
    return (full - single) / (len(files) - 1) * 1e3


so = ort.SessionOptions()
so.intra_op_num_threads = a.threads
so.inter_op_num_threads = 1
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
name = sess.get_inputs()[0].name


def ort_per_image():
    t0 = time.perf_counter()
    for f in files:
        im = Image.open(f).convert("RGB")
        w, h = im.size
        s = min(W / w, H / h)
        rw, rh = round(w * s), round(h * s)
        if (rw, rh) != (w, h):
            im = im.resize((rw, rh), Image.BILINEAR)
        canvas = np.full((H, W, 3), 114, np.uint8)
        top, left = (H - rh) // 2, (W - rw) // 2
        canvas[top:top + rh, left:left + rw] = np.asarray(im)
        x = (canvas.transpose(2, 0, 1)[None].astype(np.float32)) / 255.0
        sess.run(None, {name: x})
    return (time.perf_counter() - t0) / len(files) * 1e3


ort_per_image()  # warm-up
ys, os_, ratios = [], [], []
for rnd in range(1, a.rounds + 1):
    y = yolo9_per_image()
    o = ort_per_image()
    ys.append(y)
    os_.append(o)
    ratios.append(y / o)
    print(f"round {rnd}: yolo9 detect {y:.1f} ms/image, onnxruntime decode+forward {o:.1f} ms/image, "
          f"ratio {y / o:.2f}x", flush=True)
print(f"detect_folder images={len(files)} size={H}x{W} threads={a.threads} yolo9_ms={statistics.median(ys):.1f} "
      f"onnxruntime_ms={statistics.median(os_):.1f} ratio={statistics.median(ratios):.2f}x")
shutil.rmtree(work, ignore_errors=True)
