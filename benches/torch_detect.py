"""PyTorch counterpart of benches/detect.rs: the official YOLOv9 code, timed the same way.

Run on the GPU machine with the official repository (WongKinYiu/yolov9, never committed here) on
PYTHONPATH: python3 benches/torch_detect.py --repo PATH --weights W --image IMG [--device 0]
Prints `name value unit` lines with the same names as benches/detect.rs.
"""
import argparse
import os
import sys
import time
import types

p = argparse.ArgumentParser()
p.add_argument("--repo", required=True)
p.add_argument("--weights", required=True)
p.add_argument("--image", required=True)
p.add_argument("--device", default="0")
p.add_argument("--iters", type=int, default=50)
p.add_argument("--batch", type=int, default=32)
a = p.parse_args()

# Shims the official code needs on a current stack (see ../shared/BASELINE.md).
ipy = types.ModuleType("IPython")
ipy.display = types.ModuleType("IPython.display")
ipy.display.display = lambda *x, **k: None
ipy.get_ipython = lambda: None
ipy.version_info = (8, 0, 0)
sys.modules["IPython"] = ipy
sys.modules["IPython.display"] = ipy.display
os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
sys.path.insert(0, a.repo)
import numpy as np  # noqa: E402

if not hasattr(np, "trapz"):
    np.trapz = np.trapezoid
import torch  # noqa: E402
from models.experimental import attempt_load  # noqa: E402
from utils.augmentations import letterbox  # noqa: E402
from utils.general import non_max_suppression, scale_boxes  # noqa: E402
import cv2  # noqa: E402

dev = torch.device("cpu" if a.device == "cpu" else f"cuda:{a.device}")
torch.backends.cudnn.benchmark = False
model = attempt_load(a.weights, device=dev, fuse=True).eval()
im0 = cv2.imread(a.image)


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


pre, fwd, post, total = [], [], [], []
with torch.no_grad():
    for i in range(a.iters + 3):
        t0 = time.perf_counter()
        im = letterbox(im0, 640, stride=32, auto=True)[0]
        im = im.transpose((2, 0, 1))[::-1]
        im = torch.from_numpy(np.ascontiguousarray(im)).to(dev).float()[None] / 255
        sync()
        t1 = time.perf_counter()
        pred = model(im)
        pred = pred[0][1] if isinstance(pred[0], list) else pred[0]
        pred = pred.float().cpu()
        t2 = time.perf_counter()
        det = non_max_suppression(pred, 0.25, 0.45, max_det=1000)[0]
        det[:, :4] = scale_boxes(im.shape[2:], det[:, :4], im0.shape).round()
        t3 = time.perf_counter()
        if i >= 3:
            pre.append((t1 - t0) * 1e3)
            fwd.append((t2 - t1) * 1e3)
            post.append((t3 - t2) * 1e3)
            total.append((t3 - t0) * 1e3)
    print("detections", len(det))
    for n, v in [("preprocess", pre), ("forward", fwd), ("nms", post), ("total", total)]:
        print(f"b1_{n}_ms {np.median(v):.3f}")
    x = im.repeat(a.batch, 1, 1, 1)
    t = []
    for i in range(max(a.iters // 2, 2) + 2):
        sync()
        t0 = time.perf_counter()
        y = model(x)
        y = (y[0][1] if isinstance(y[0], list) else y[0]).float().cpu()
        if i >= 2:
            t.append((time.perf_counter() - t0) * 1e3)
    ms = float(np.median(t))
    print(f"b{a.batch}_forward_ms {ms:.3f}")
    print(f"b{a.batch}_img_per_s {a.batch * 1e3 / ms:.1f}")
