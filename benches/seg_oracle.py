"""Oracle of the segmentation models (issue 53), made with the official code, written into
tests/model/seg_oracle/ for tests/model/seg.rs.

The official code (WongKinYiu/yolov9) is NOT part of this repository: pass a checkout of it.
CPU torch is enough (any torch >= 1.12 with numpy, pyyaml, opencv, pandas, safetensors):

    python3 benches/seg_oracle.py --yolov9 /tmp/yolov9-official --out tests/model/seg_oracle

Writes, for each tiny graph of tests/model/seg_oracle/*.yaml (nc 3, built by the official
`models/yolo.py::Model`, every parameter and BN statistic drawn from a seeded generator so that
BN folding and every branch are exercised):

- `{name}.safetensors`: the float state_dict (official names; `num_batches_tracked` left out),
  `x` f32 [2, 3, 64, 96] (values k/255), and the eval-mode outputs of the official forward:
  `pred` f32 [2, 4+nc+nm, A] (`torch.cat([y, mc], 1)`: cx, cy, w, h in pixels, class
  sigmoids, raw mask coefficients; for DualDSegment the main branch, as the official forward
  returns it) and `proto` f32 [2, nm, Hp, Wp]; for tiny-seg also what `segment/predict.py` keeps
  of image 0 at conf 0.05: `det0` f32 [n, 6] (official NMS rows x1 y1 x2 y2 conf cls, input
  pixels) and `masks0` f32 [n, 64, 96] (`process_mask(..., upsample=True)`, 0/1).

`{name}.loss.safetensors`: the official segmentation loss (`utils/segment/loss_tal.py` for tiny-seg,
`loss_tal_dual.py` for tiny-dseg, hyp.scratch-high) on the recorded head outputs of a train-mode
forward (`{aux,main}_p{3,4,5}`, `_coeffs` (B, nm, A), `_proto`), `targets` [5, 6], and per
case (`overlap`: (B, 16, 24) overlap masks; tiny-seg also `instances`: (5, 32, 48) one mask
per target, downsampled by the loss) `{case}_masks`, `{case}_items` [4] (box, seg, cls, dfl
after the gains) and `{case}_total`;
`polygons.safetensors`: 40 random outlines inside a 96x64 image (`points` [40, 12, 2] pixels,
`counts` [40]) with the official `polygon2mask` at ratio 1 and 4 (`mask1`, `mask4`) and
`polygons2masks_overlap` of the first six at ratio 4 (`overlap4` [16, 24], `order` [6]);
`val_metrics.safetensors`: designed predictions on 6 images (`dets` [N, 6], `labels` [M, 5],
`pred_masks` [N, 16, 24], overlap `gt_masks` [6, 16, 24], per-image counts `nd`, `nl`) and the
official `segment/val.py` table of them (`table` f64 [8]: Box P, R, mAP50, mAP50-95, Mask P,
R, mAP50, mAP50-95);
`tiny-seg.pt` (an official checkpoint of tiny-seg: `{'model': Model.half(), ...}` as
`train.py` saves one), and `official_keys.json`: for each full-size segmentation model (the official
models/segment/*.yaml and yolo9's models/gelan-{t,s}-seg.yaml read by the official parser), nc 80,
`{"keys": [[name, shape], ...] in state_dict order, "parameters": official summary count}`.
"""
import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--yolov9", required=True, help="checkout of WongKinYiu/yolov9")
    ap.add_argument("--out", required=True, help="tests/model/seg_oracle")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    here = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    sys.path.insert(0, os.path.abspath(a.yolov9))
    os.chdir(a.yolov9)
    import torch
    from safetensors.torch import save_file
    from models.yolo import Model

    torch.set_grad_enabled(False)
    for name in ("tiny-seg", "tiny-dseg"):
        torch.manual_seed(0)
        model = Model(os.path.join(out, f"{name}.yaml"), ch=3, nc=3)
        g = torch.Generator().manual_seed(1)
        sd = model.state_dict()
        for k, v in sd.items():
            if k.endswith("num_batches_tracked") or ".dfl" in k:
                continue
            if k.endswith("bn.weight"):
                v.copy_(torch.rand(v.shape, generator=g) + 0.5)
            elif k.endswith("bn.bias") or k.endswith("running_mean"):
                v.copy_(torch.randn(v.shape, generator=g) * 0.1)
            elif k.endswith("running_var"):
                v.copy_(torch.rand(v.shape, generator=g) * 1.5 + 0.5)
            elif k.endswith(".bias"):
                v.copy_(torch.randn(v.shape, generator=g) * 0.1)
            else:  # conv weights: He-like scale keeps activations O(1) through the depth
                fan_in = max(1, v[0].numel())
                v.copy_(torch.randn(v.shape, generator=g) * (2.0 / fan_in) ** 0.5)
        model.eval()
        # Pixel values k/255, so that an 8-bit image of x[0] is the same input.
        x = torch.randint(0, 256, (2, 3, 64, 96), generator=g).float() / 255.0
        y = model(x)
        pred, proto = y[0], y[1][2]
        t = {k: v.float().contiguous() for k, v in sd.items() if not k.endswith("num_batches_tracked")}
        t["x"] = x.contiguous()
        t["pred"] = pred.float().contiguous()
        t["proto"] = proto.float().contiguous()
        if name == "tiny-seg":
            # What segment/predict.py makes of image 0 (conf 0.05 on this untrained model).
            from utils.general import non_max_suppression
            from utils.segment.general import process_mask
            det = non_max_suppression(pred, 0.05, 0.45, max_det=1000, nm=8)[0]
            masks = process_mask(proto[0], det[:, 6:], det[:, :4], x.shape[2:], upsample=True)
            t["det0"] = det[:, :6].float().contiguous()
            t["masks0"] = masks.float().contiguous()
            print(name, "image 0:", det.shape[0], "detections, mask pixels", int(masks.sum()))
        save_file(t, os.path.join(out, f"{name}.safetensors"))
        if name == "tiny-seg":
            # An official checkpoint of it, as train.py saves one (the pickled model in f16),
            # for the converter: a Segment head pickles `getattr(Detect, 'forward')`.
            import copy
            m = copy.deepcopy(model).half()
            m.names = {0: "a", 1: "b", 2: "c"}
            torch.save({"epoch": -1, "model": m, "ema": None, "optimizer": None},
                       os.path.join(out, f"{name}.pt"))
        print(name, "pred", tuple(pred.shape), "proto", tuple(proto.shape),
              "pred range", float(pred.min()), float(pred.max()))

    # The loss on recorded head outputs (train-mode forward, as training computes it):
    # utils/segment/loss_tal.py for tiny-seg (overlap masks at the prototype size, and
    # per-instance masks at twice it, which the loss downsamples), loss_tal_dual.py for tiny-dseg.
    import yaml
    from utils.segment.loss_tal import ComputeLoss as SegLoss
    from utils.segment.loss_tal_dual import ComputeLoss as DualSegLoss
    hyp = yaml.safe_load(open("data/hyps/hyp.scratch-high.yaml"))
    # [img, cls, cx, cy, w, h] normalized; image 0 three objects, image 1 two.
    targets = torch.tensor([[0, 0, 0.30, 0.35, 0.30, 0.40], [0, 2, 0.70, 0.60, 0.20, 0.30],
                            [0, 1, 0.55, 0.45, 0.50, 0.60], [1, 1, 0.50, 0.50, 0.40, 0.50],
                            [1, 0, 0.20, 0.75, 0.15, 0.25]], dtype=torch.float32)

    def instance_masks(h, w):
        """Per target row: an ellipse inscribed in its box, (N, h, w) 0/1."""
        ys = (torch.arange(h).float() + 0.5) / h
        xs = (torch.arange(w).float() + 0.5) / w
        out = torch.zeros(targets.shape[0], h, w)
        for k, (_, _, cx, cy, bw, bh) in enumerate(targets.tolist()):
            e = ((xs[None, :] - cx) / (bw / 2)) ** 2 + ((ys[:, None] - cy) / (bh / 2)) ** 2
            out[k] = (e <= 1).float()
        return out

    def overlap_masks(h, w):
        """(B, h, w): value k+1 where the image's k-th object is (later rows on top)."""
        inst = instance_masks(h, w)
        out = torch.zeros(2, h, w)
        seen = [0, 0]
        for k, row in enumerate(targets.tolist()):
            b = int(row[0])
            seen[b] += 1
            out[b][inst[k] > 0] = seen[b]
        return out

    for name, cls, cases in (("tiny-seg", SegLoss, (("overlap", True, 1), ("instances", False, 2))),
                             ("tiny-dseg", DualSegLoss, (("overlap", True, 1),))):
        torch.manual_seed(0)
        model = Model(os.path.join(out, f"{name}.yaml"), ch=3, nc=3)
        from safetensors.torch import load_file
        model.load_state_dict({k: v for k, v in load_file(os.path.join(out, f"{name}.safetensors")).items()
                               if k.startswith("model.")}, strict=False)
        model.hyp = hyp
        model.train()
        g = torch.Generator().manual_seed(2)
        x = torch.randint(0, 256, (2, 3, 64, 96), generator=g).float() / 255.0
        p = model(x)  # train mode: (feats, mc, proto), each a list of two for the dual head
        t = {"x": x, "targets": targets}
        feats, mc, proto = p
        branches = (("aux", 0), ("main", 1)) if name == "tiny-dseg" else (("main", None),)
        for br, j in branches:
            f = feats if j is None else feats[j]
            for lvl, fl in enumerate(f):
                t[f"{br}_p{lvl + 3}"] = fl.detach().float().contiguous()
            t[f"{br}_coeffs"] = (mc if j is None else mc[j]).detach().float().contiguous()
            t[f"{br}_proto"] = (proto if j is None else proto[j]).detach().float().contiguous()
        ph, pw = t["main_proto"].shape[2:]
        for case, overlap, up in cases:
            m = overlap_masks(ph * up, pw * up) if overlap else instance_masks(ph * up, pw * up)
            loss, items = cls(model, overlap=overlap)(p, targets, m)
            t[f"{case}_masks"] = m.contiguous()
            t[f"{case}_items"] = items.detach().float().contiguous()
            t[f"{case}_total"] = loss.detach().float().reshape(()).contiguous()
            print(name, case, "items (box, seg, cls, dfl)", [round(v, 6) for v in items.tolist()],
                  "total", float(loss))
        save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(out, f"{name}.loss.safetensors"))

    # Ground-truth masks from outlines (utils/segment/dataloaders.py: cv2.fillPoly, cv2.resize):
    # 40 random outlines inside a 96x64 image, each as polygon2mask at ratio 1 and 4, and the
    # overlap mask of the first 6 at ratio 4 with its order.
    from utils.segment.dataloaders import polygon2mask, polygons2masks_overlap
    import numpy as np
    rng = np.random.default_rng(3)
    polys, m1, m4 = [], [], []
    for _ in range(40):
        k = int(rng.integers(3, 12))
        c = rng.random(2) * [56, 34] + [20, 15]
        ang = np.sort(rng.random(k) * 2 * np.pi)
        rad = rng.random(k) * 13 + 2
        p = np.stack([c[0] + rad * np.cos(ang), c[1] + rad * np.sin(ang)], 1).astype(np.float32)
        polys.append(p)
        m1.append(polygon2mask((64, 96), [p.reshape(-1)], color=1, downsample_ratio=1))
        m4.append(polygon2mask((64, 96), [p.reshape(-1)], color=1, downsample_ratio=4))
    ov, order = polygons2masks_overlap((64, 96), polys[:6], downsample_ratio=4)
    pts = np.zeros((40, 12, 2), np.float32)
    counts = np.zeros(40, np.float32)
    for i, p in enumerate(polys):
        pts[i, :len(p)] = p
        counts[i] = len(p)
    save_file({"points": torch.from_numpy(pts), "counts": torch.from_numpy(counts),
               "mask1": torch.from_numpy(np.stack(m1).astype(np.float32)),
               "mask4": torch.from_numpy(np.stack(m4).astype(np.float32)),
               "overlap4": torch.from_numpy(ov.astype(np.float32)),
               "order": torch.from_numpy(order.astype(np.float32))},
              os.path.join(out, "polygons.safetensors"))
    print("polygons: 40 outlines,", int(np.stack(m1).sum()), "pixels at ratio 1")

    # Box and mask metrics (segment/val.py process_batch, ap_per_class_box_and_mask) on designed
    # predictions: 6 images, 3 classes, overlap GT masks 16x24, predictions jittered from the
    # labels (boxes and masks) plus false positives.
    sys.argv = ["val.py"]
    if not hasattr(np, "trapz"):  # numpy 2.4 removed the alias the official compute_ap calls
        np.trapz = np.trapezoid
    from segment.val import process_batch as seg_process_batch
    from utils.segment.metrics import Metrics, ap_per_class_box_and_mask
    from utils.general import xywh2xyxy
    rng = np.random.default_rng(4)
    iouv = torch.linspace(0.5, 0.95, 10)
    stats, rows = [], {"dets": [], "labels": [], "pred_masks": [], "gt_masks": [], "nd": [], "nl": []}
    for img in range(6):
        nl = int(rng.integers(1, 5))
        lab = np.zeros((nl, 5), np.float32)
        gtm = np.zeros((16, 24), np.float32)
        inst = []
        for k in range(nl):
            cx, cy = rng.random() * 60 + 18, rng.random() * 36 + 14
            w, h = rng.random() * 30 + 8, rng.random() * 20 + 8
            lab[k] = [rng.integers(0, 3), cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]
            ys, xs = np.mgrid[0:16, 0:24]
            e = (((xs + 0.5) * 4 - cx) / (w / 2)) ** 2 + (((ys + 0.5) * 4 - cy) / (h / 2)) ** 2 <= 1
            gtm[e] = k + 1
            inst.append(e)
        dets, pms = [], []
        for k in range(nl):
            if rng.random() < 0.85:
                j = rng.normal(0, 2.5, 4)
                dets.append([*(lab[k, 1:] + j), rng.random() * 0.9 + 0.05,
                             lab[k, 0] if rng.random() < 0.9 else (lab[k, 0] + 1) % 3])
                m = inst[k].copy()
                flip = rng.random((16, 24)) < 0.012
                pms.append(np.where(flip, ~m, m))
        for _ in range(int(rng.integers(0, 3))):
            x1, y1 = rng.random() * 70, rng.random() * 40
            dets.append([x1, y1, x1 + 15, y1 + 12, rng.random() * 0.5, rng.integers(0, 3)])
            pms.append(rng.random((16, 24)) < 0.1)
        dets = np.array(dets, np.float32).reshape(-1, 6)
        pms = np.array(pms, bool).reshape(-1, 16, 24)
        d_t, l_t = torch.from_numpy(dets), torch.from_numpy(lab)
        pm_t = torch.from_numpy(pms.astype(np.float32))
        gm_t = torch.from_numpy(gtm)[None]
        cb = seg_process_batch(d_t, l_t, iouv)
        cm = seg_process_batch(d_t, l_t, iouv, pm_t, gm_t, overlap=True, masks=True)
        stats.append((torch.as_tensor(cm), torch.as_tensor(cb), d_t[:, 4], d_t[:, 5], l_t[:, 0]))
        rows["dets"].append(dets); rows["labels"].append(lab)
        rows["pred_masks"].append(pms.astype(np.float32)); rows["gt_masks"].append(gtm[None])
        rows["nd"].append(len(dets)); rows["nl"].append(nl)
    st = [torch.cat(x, 0).cpu().numpy() for x in zip(*stats)]
    metrics = Metrics()
    metrics.update(ap_per_class_box_and_mask(*st, names={0: "a", 1: "b", 2: "c"}))
    mr = np.array(metrics.mean_results(), np.float64)
    print("segment/val.py table (Box P R mAP50 mAP50-95, Mask P R mAP50 mAP50-95):", mr.round(4).tolist())
    save_file({"dets": torch.from_numpy(np.concatenate(rows["dets"])),
               "labels": torch.from_numpy(np.concatenate(rows["labels"])),
               "pred_masks": torch.from_numpy(np.concatenate(rows["pred_masks"])),
               "gt_masks": torch.from_numpy(np.concatenate(rows["gt_masks"])),
               "nd": torch.tensor(rows["nd"], dtype=torch.float32),
               "nl": torch.tensor(rows["nl"], dtype=torch.float32),
               "table": torch.from_numpy(mr)},
              os.path.join(out, "val_metrics.safetensors"))

    keys = {}
    for name, path in (
        ("gelan-c-seg", "models/segment/gelan-c-seg.yaml"),
        ("gelan-c-dseg", "models/segment/gelan-c-dseg.yaml"),
        ("yolov9-c-dseg", "models/segment/yolov9-c-dseg.yaml"),
        ("gelan-t-seg", os.path.join(here, "models/gelan-t-seg.yaml")),
        ("gelan-s-seg", os.path.join(here, "models/gelan-s-seg.yaml")),
    ):
        model = Model(path, ch=3, nc=80)
        keys[name] = {
            "keys": [[k, list(v.shape)] for k, v in model.state_dict().items()],
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        print(name, len(keys[name]["keys"]), "entries,", keys[name]["parameters"], "parameters")
    with open(os.path.join(out, "official_keys.json"), "w") as f:
        json.dump(keys, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
