"""ONNX Runtime (and OpenVINO, when installed) counterpart of benches/cpu_detect.rs: yolo9's own
`yolo9 export --format onnx` of the same weights, one static model per (size, batch), timed at
the same settings with the same intra-op thread counts.

    pip install onnxruntime openvino          # from the package index; OpenVINO is optional
    python3 benches/ort_cpu.py --yolo9 target/release/yolo9 [--weights W] [--threads 1,2,4,all]
        [--sizes 640x640,480x640] [--batches 1,8] [--iters 10] [--dir DIR]

Prints `ort_cpu engine=onnxruntime|openvino size=HxW batch=B threads=T forward_ms=.. img_s=..`,
the median of `--iters` runs after two warm-up runs on a random input (the network and, as in
yolo9's forward, the decode inside the exported graph).

`--int8 IMAGES` (a folder of images, e.g. BCCD's `images/val`, the images `yolo9 convert --int8`
calibrates on) also times each engine's own static INT8 of the same export, calibrated on those
images letterboxed to the model's size: ONNX Runtime's `quantize_static` (QDQ, per-channel i8
weights, u8 activations, MinMax: the settings of yolo9's INT8; the head's last convolutions and the
decode stay f32, as in yolo9's INT8) as `engine=onnxruntime-int8`, and
OpenVINO's NNCF `quantize` (its default preset) as `engine=openvino-int8` where `nncf` is
installed (`pip install nncf pillow`).
"""
import argparse
import os
import sys
import subprocess
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ort_int8 import qdq_model  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--yolo9", default="target/release/yolo9")
p.add_argument("--weights", default="weights/yolov9-s-bccd.safetensors")
p.add_argument("--threads", default="1,2,4,all")
p.add_argument("--sizes", default="640x640,480x640")
p.add_argument("--batches", default="1,8")
p.add_argument("--iters", type=int, default=10)
p.add_argument("--dir", default=None, help="where the exported models go (default: a temp folder)")
p.add_argument("--no-openvino", action="store_true")
p.add_argument("--int8", default=None,
               help="a folder of calibration images (or an .npz of letterboxed uint8 ones): also time static INT8")
p.add_argument("--calib-images", type=int, default=100)
a = p.parse_args()

cpus = len(os.sched_getaffinity(0))
threads = [cpus if t == "all" else int(t) for t in a.threads.split(",")]
threads = list(dict.fromkeys(threads))
sizes = [tuple(int(v) for v in s.split("x")) for s in a.sizes.split(",")]
batches = [int(b) for b in a.batches.split(",")]
out_dir = a.dir or tempfile.mkdtemp(prefix="yolo9-ort-")
os.makedirs(out_dir, exist_ok=True)

import onnxruntime as ort  # noqa: E402

try:
    import openvino as ov  # noqa: E402
except ImportError:
    ov = None
if a.no_openvino:
    ov = None
print(f"ort_cpu cpus={cpus} onnxruntime={ort.__version__} openvino={ov.__version__ if ov else '-'}")


def median(v):
    v = sorted(v)
    return v[len(v) // 2]


def timed(run, x):
    run(x)
    run(x)
    ts = []
    for _ in range(a.iters):
        t = time.perf_counter()
        run(x)
        ts.append((time.perf_counter() - t) * 1e3)
    return median(ts)


def calibration(h, w, b):
    """The first --calib-images images of --int8 (sorted) letterboxed to h x w (pad 114, as
    yolo9's letterbox), RGB 0..1, as (b, 3, h, w) batches."""
    if a.int8.endswith(".npz"):
        # Images letterboxed beforehand (for a machine without PIL): uint8 (N, 3, h, w) as "x".
        xs = list(np.load(a.int8)["x"].astype(np.float32) / 255.0)[: a.calib_images]
        return [np.stack([xs[(i + j) % len(xs)] for j in range(b)]) for i in range(0, len(xs), b)]
    try:
        from PIL import Image

        def rgb(path):
            return np.asarray(Image.open(path).convert("RGB"))

        def resize(im, nw, nh):
            return np.asarray(Image.fromarray(im).resize((nw, nh), Image.BILINEAR))
    except ImportError:  # OpenCV instead (BGR on disk)
        import cv2

        def rgb(path):
            return cv2.imread(path)[:, :, ::-1]

        def resize(im, nw, nh):
            return cv2.resize(np.ascontiguousarray(im), (nw, nh), interpolation=cv2.INTER_LINEAR)

    names = sorted(f for f in os.listdir(a.int8) if f.lower().endswith((".jpg", ".jpeg", ".png")))
    step = max(1, len(names) // a.calib_images)
    xs = []
    for f in names[::step][: a.calib_images]:
        im = rgb(os.path.join(a.int8, f))
        r = min(h / im.shape[0], w / im.shape[1])
        nh, nw = round(im.shape[0] * r), round(im.shape[1] * r)
        canvas = np.full((h, w, 3), 114, np.uint8)
        top, left = (h - nh) // 2, (w - nw) // 2
        canvas[top:top + nh, left:left + nw] = resize(im, nw, nh)
        xs.append(canvas.astype(np.float32).transpose(2, 0, 1) / 255.0)
    return [np.stack([xs[(i + j) % len(xs)] for j in range(b)]) for i in range(0, len(xs), b)]


def int8_models(path, h, w, b):
    """(ORT QDQ model path, NNCF-quantized OpenVINO model or None) of the export at `path`."""
    batches = calibration(h, w, b)
    qdq = qdq_model(path, batches)
    vino = None
    xml = path.replace(".onnx", "-int8-nncf.xml")
    if ov is not None and os.path.exists(xml):
        vino = ov.Core().read_model(xml)
    elif ov is not None:
        try:
            import nncf

            model = ov.Core().read_model(path)
            vino = nncf.quantize(model, nncf.Dataset(batches))
            ov.save_model(vino, xml)
        except ImportError:
            pass
    return qdq, vino


def time_ort(path, t, x, engine, b, h, w):
    """Times an ONNX Runtime session of `path` on `t` intra-op threads and prints its line."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = t
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    ms = timed(lambda x: s.run(None, {name: x}), x)
    print(f"ort_cpu engine={engine} size={h}x{w} batch={b} threads={t} forward_ms={ms:.2f} img_s={b * 1e3 / ms:.2f}", flush=True)


def time_ov(model, t, x, engine, b, h, w, precision):
    """Times OpenVINO's compiled `model` (a path or a model) on `t` threads and prints its line."""
    c = ov.Core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": t, "INFERENCE_PRECISION_HINT": precision,
                                               "PERFORMANCE_HINT": "LATENCY"})
    req = c.create_infer_request()
    ms = timed(lambda x: req.infer({0: x}), x)
    print(f"ort_cpu engine={engine} size={h}x{w} batch={b} threads={t} forward_ms={ms:.2f} img_s={b * 1e3 / ms:.2f}", flush=True)


for (h, w) in sizes:
    for b in batches:
        path = os.path.join(out_dir, f"m-{h}x{w}-b{b}.onnx")
        if not os.path.exists(path):
            subprocess.run([a.yolo9, "export", "--weights", a.weights, "--img", str(h), str(w),
                            "--batch", str(b), "-o", path], check=True, capture_output=True)
        qdq, vino = int8_models(path, h, w, b) if a.int8 else (None, None)
        x = np.random.default_rng(0).random((b, 3, h, w), dtype=np.float32)
        for t in threads:
            time_ort(path, t, x, "onnxruntime", b, h, w)
            if ov is not None:
                time_ov(path, t, x, "openvino", b, h, w, "f32")
            if qdq is not None:
                time_ort(qdq, t, x, "onnxruntime-int8", b, h, w)
            if vino is not None:
                time_ov(vino, t, x, "openvino-int8", b, h, w, "f32")
