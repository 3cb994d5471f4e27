"""ONNX Runtime (and OpenVINO, when installed) counterpart of benches/cpu_detect.rs: yolo9's own
`yolo9 export --format onnx` of the same weights, one static model per (size, batch), timed at
the same settings with the same intra-op thread counts.

    pip install onnxruntime openvino          # from the package index; OpenVINO is optional
    python3 benches/ort_cpu.py --yolo9 target/release/yolo9 [--weights W] [--threads 1,2,4,all]
        [--sizes 640x640,480x640] [--batches 1,8] [--iters 10] [--dir DIR]

Prints `ort_cpu engine=onnxruntime|openvino size=HxW batch=B threads=T forward_ms=.. img_s=..`,
the median of `--iters` runs after two warm-up runs on a random input (the network and, as in
yolo9's forward, the decode inside the exported graph).
"""
import argparse
import os
import subprocess
import tempfile
import time

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("--yolo9", default="target/release/yolo9")
p.add_argument("--weights", default="weights/yolov9-s-bccd.safetensors")
p.add_argument("--threads", default="1,2,4,all")
p.add_argument("--sizes", default="640x640,480x640")
p.add_argument("--batches", default="1,8")
p.add_argument("--iters", type=int, default=10)
p.add_argument("--dir", default=None, help="where the exported models go (default: a temp folder)")
p.add_argument("--no-openvino", action="store_true")
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


for (h, w) in sizes:
    for b in batches:
        path = os.path.join(out_dir, f"m-{h}x{w}-b{b}.onnx")
        if not os.path.exists(path):
            subprocess.run([a.yolo9, "export", "--weights", a.weights, "--img", str(h), str(w),
                            "--batch", str(b), "-o", path], check=True, capture_output=True)
        x = np.random.default_rng(0).random((b, 3, h, w), dtype=np.float32)
        for t in threads:
            so = ort.SessionOptions()
            so.intra_op_num_threads = t
            so.inter_op_num_threads = 1
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            name = s.get_inputs()[0].name
            ms = timed(lambda x: s.run(None, {name: x}), x)
            print(f"ort_cpu engine=onnxruntime size={h}x{w} batch={b} threads={t} forward_ms={ms:.2f} img_s={b * 1e3 / ms:.2f}", flush=True)
            if ov is not None:
                core = ov.Core()
                c = core.compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": t, "INFERENCE_PRECISION_HINT": "f32",
                                                     "PERFORMANCE_HINT": "LATENCY"})
                req = c.create_infer_request()
                ms = timed(lambda x: req.infer({0: x}), x)
                print(f"ort_cpu engine=openvino size={h}x{w} batch={b} threads={t} forward_ms={ms:.2f} img_s={b * 1e3 / ms:.2f}", flush=True)
