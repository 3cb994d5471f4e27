"""BCCD test accuracy (mAP50, mAP50-95) of ONNX Runtime FP32, ONNX Runtime's static INT8 (QDQ) and
OpenVINO's NNCF INT8 of yolo9's own ONNX export, evaluated as the official `val_dual.py` does, so
that they sit beside `yolo9 val` of the f32 and INT8 weights.

    pip install onnxruntime openvino nncf pillow
    python3 benches/int8_accuracy.py --yolo9 target/release/yolo9 --bccd ../shared/datasets/bccd

Steps: `yolo9 export` of the shipped BCCD weights at 512x672 (the official rectangular val shape of
BCCD's 640x480 images at --img 640: `ceil(shape * 640 / 32 + 0.5) * 32` for both sides); ONNX Runtime's
`quantize_static` (QDQ, per-channel i8 weights, u8 activations, MinMax) and NNCF's `quantize`
(default preset), both calibrated on BCCD's val images letterboxed the same way (pad 114); each
engine on the 72 test images; the official NMS (multi-label, conf 0.001, IoU 0.7, 300 per image,
class offsets of 7680 px); the official matching at IoU 0.50:0.95 and `ap_per_class` (101-point
interpolated AP per class, averaged). Also runs `yolo9 val` on the f32 weights and on the INT8
weights (`yolo9 convert --int8` calibrated on the same val images) and prints all rows. The ONNX
Runtime FP32 row checks this script's evaluation against yolo9's: same weights, same letterbox.

Prints `int8_accuracy engine=... map50=... map50_95=...` per engine.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ort_int8 import qdq_model  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--yolo9", default="target/release/yolo9")
p.add_argument("--weights", default="weights/yolov9-s-bccd.safetensors")
p.add_argument("--bccd", default="../shared/datasets/bccd")
p.add_argument("--dir", default=None, help="folder for the models (kept between runs)")
p.add_argument("--threads", type=int, default=os.cpu_count())
a = p.parse_args()
H, W = 512, 672
d = a.dir or tempfile.mkdtemp()
os.makedirs(d, exist_ok=True)


def rgb(path):
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB"))


def letterbox(im):
    """`im` (h, w, 3) u8 → (1, 3, H, W) f32 in 0..1, resized by r = min(H/h, W/w, 1) (never up,
    as the official val loader; none for BCCD's 640x480 images), centred, padded with 114; and
    (r, left, top)."""
    h, w = im.shape[:2]
    r = min(H / h, W / w, 1.0)
    nh, nw = round(h * r), round(w * r)
    if (nh, nw) != (h, w):
        from PIL import Image

        im = np.asarray(Image.fromarray(im).resize((nw, nh), Image.BILINEAR))
    top, left = round((H - nh) / 2 - 0.1), round((W - nw) / 2 - 0.1)
    canvas = np.full((H, W, 3), 114, np.uint8)
    canvas[top:top + nh, left:left + nw] = im
    return canvas.transpose(2, 0, 1)[None].astype(np.float32) / 255.0, (r, left, top)


def images(split):
    folder = os.path.join(a.bccd, "images", split)
    return [os.path.join(folder, f) for f in sorted(os.listdir(folder))
            if f.lower().endswith((".jpg", ".jpeg", ".png"))]


def labels(img_path, w, h):
    """The image's YOLO labels as (class, x1, y1, x2, y2) in pixels; malformed lines skipped."""
    path = re.sub(r"/images/", "/labels/", img_path)
    path = os.path.splitext(path)[0] + ".txt"
    out = []
    if os.path.exists(path):
        for line in open(path, errors="replace"):
            f = line.split()
            try:
                c, cx, cy, bw, bh = int(f[0]), *map(float, f[1:5])
            except (ValueError, IndexError):
                continue
            out.append((c, (cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h))
    return np.array(out, np.float64).reshape(-1, 5)


def iou(a_, b_):
    """IoU matrix of xyxy boxes a (n, 4) and b (m, 4)."""
    lt = np.maximum(a_[:, None, :2], b_[None, :, :2])
    rb = np.minimum(a_[:, None, 2:], b_[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(2)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    return inter / (area(a_)[:, None] + area(b_)[None] - inter)


def nms(pred, conf=0.001, iou_thres=0.7, max_det=300, max_wh=7680, max_nms=30000):
    """Official `non_max_suppression` (multi-label) of one image's (4+nc, A) output → (n, 6)
    x1, y1, x2, y2, score, class."""
    box, cls = pred[:4].T, pred[4:].T
    i, j = np.nonzero(cls > conf)
    if i.size == 0:
        return np.zeros((0, 6))
    xy, wh = box[i, :2], box[i, 2:]
    det = np.concatenate([xy - wh / 2, xy + wh / 2, cls[i, j, None], j[:, None].astype(np.float64)], 1)
    det = det[np.argsort(-det[:, 4], kind="stable")[:max_nms]]
    boxes = det[:, :4] + det[:, 5:6] * max_wh
    keep, order = [], np.arange(len(det))
    while order.size and len(keep) < max_det:
        k = order[0]
        keep.append(k)
        order = order[1:][iou(boxes[k:k + 1], boxes[order[1:]])[0] <= iou_thres]
    return det[keep]


def ap_per_class(tp, conf, pred_cls, target_cls):
    """Official `ap_per_class`: per class, precision/recall over detections by confidence and the
    101-point interpolated AP at each IoU threshold; returns AP (classes, 10)."""
    order = np.argsort(-conf, kind="stable")
    tp, conf, pred_cls = tp[order], conf[order], pred_cls[order]
    classes = np.unique(target_cls)
    ap = np.zeros((len(classes), tp.shape[1]))
    for ci, c in enumerate(classes):
        m = pred_cls == c
        n_l, n_p = (target_cls == c).sum(), m.sum()
        if n_p == 0 or n_l == 0:
            continue
        fpc = (1 - tp[m]).cumsum(0)
        tpc = tp[m].cumsum(0)
        recall = tpc / (n_l + 1e-16)
        precision = tpc / (tpc + fpc)
        for t in range(tp.shape[1]):
            mrec = np.concatenate(([0.0], recall[:, t], [1.0]))
            mpre = np.concatenate(([1.0], precision[:, t], [0.0]))
            mpre = np.flip(np.maximum.accumulate(np.flip(mpre)))
            x = np.linspace(0, 1, 101)
            ap[ci, t] = np.trapezoid(np.interp(x, mrec, mpre), x)
    return ap


def evaluate(run):
    """mAP50 and mAP50-95 of `run` (a function of the letterboxed input → (1, 4+nc, A))."""
    ious = np.linspace(0.5, 0.95, 10)
    stats = []
    for path in images("test"):
        im = rgb(path)
        h, w = im.shape[:2]
        x, (r, left, top) = letterbox(im)
        det = nms(run(x)[0].astype(np.float64))
        det[:, [0, 2]] = ((det[:, [0, 2]] - left) / r).clip(0, w)
        det[:, [1, 3]] = ((det[:, [1, 3]] - top) / r).clip(0, h)
        lab = labels(path, w, h)
        correct = np.zeros((len(det), 10), bool)
        if len(lab) and len(det):
            o = iou(lab[:, 1:], det[:, :4])
            for t, thr in enumerate(ious):
                li, di = np.nonzero((o >= thr) & (lab[:, :1] == det[:, 5]))
                if li.size:
                    mt = np.stack([li, di, o[li, di]], 1)
                    mt = mt[mt[:, 2].argsort()[::-1]]
                    mt = mt[np.unique(mt[:, 1], return_index=True)[1]]
                    mt = mt[np.unique(mt[:, 0], return_index=True)[1]]
                    correct[mt[:, 1].astype(int), t] = True
        stats.append((correct, det[:, 4], det[:, 5], lab[:, 0]))
    tp, conf, pcls, tcls = (np.concatenate(s, 0) for s in zip(*stats))
    ap = ap_per_class(tp.astype(np.float64), conf, pcls, tcls)
    return ap[:, 0].mean(), ap.mean()


def calibration():
    return [letterbox(rgb(f))[0] for f in images("val")]


onnx = os.path.join(d, f"bccd-{H}x{W}.onnx")
if not os.path.exists(onnx):
    subprocess.run([a.yolo9, "export", "--weights", a.weights, "--img", str(H), str(W), "-o", onnx],
                   check=True, stdout=subprocess.DEVNULL)

import onnxruntime as ort  # noqa: E402


def ort_run(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    return lambda x: s.run(None, {name: x})[0]


rows = []
rows.append(("onnxruntime-fp32", *evaluate(ort_run(onnx))))

batches = calibration()
qdq = qdq_model(onnx, batches)
rows.append(("onnxruntime-int8-qdq", *evaluate(ort_run(qdq))))

try:
    import nncf
    import openvino as ov

    core = ov.Core()
    xml = onnx.replace(".onnx", "-int8-nncf.xml")
    if not os.path.exists(xml):
        ov.save_model(nncf.quantize(core.read_model(onnx), nncf.Dataset(batches)), xml)
    for tag, model in (("openvino-fp32", core.read_model(onnx)), ("openvino-int8-nncf", core.read_model(xml))):
        c = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": a.threads,
                                              "INFERENCE_PRECISION_HINT": "f32"})
        rows.append((tag, *evaluate(lambda x, c=c: c(x)[0])))
except ImportError:
    print("int8_accuracy: openvino/nncf not installed: no OpenVINO rows")


def yolo9_val(weights):
    out = subprocess.run([a.yolo9, "val", "--weights", weights, "--data", os.path.join(a.bccd, "data.yaml"),
                          "--split", "test", "--device", "cpu", "--noplots"],
                         check=True, capture_output=True, text=True).stdout
    m = re.search(r"^\s*all\s+\d+\s+\d+\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)\s+([0-9.]+)", out, re.M)
    return (float(m.group(1)), float(m.group(2))) if m else (float("nan"), float("nan"))


int8 = os.path.join(d, "bccd-int8.safetensors")
if not os.path.exists(int8):
    subprocess.run([a.yolo9, "convert", a.weights, "--int8", "--data", os.path.join(a.bccd, "data.yaml"),
                    "-o", int8], check=True, stdout=subprocess.DEVNULL)
rows.append(("yolo9-f32", *yolo9_val(a.weights)))
rows.append(("yolo9-int8", *yolo9_val(int8)))
for name, m50, m in rows:
    print(f"int8_accuracy engine={name} map50={m50:.4f} map50_95={m:.4f}")
