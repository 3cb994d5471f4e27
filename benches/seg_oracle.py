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
