"""PyTorch counterpart of benches/conv.rs: the same convolutions, timed the same way.

python3 benches/torch_conv.py [--device 0] [--iters 10] [--warmup 3]

Cases: s1 (3x3 128->128, 160x160, batch 16, pad 1, stride 1), s2 (same, stride 2), g4 (3x3
64->64 groups 4, 80x80, batch 16, pad 1). Modes: f32 with TF32 off (`torch-f32`), f32 with TF32 on
(`torch-tf32`), bf16 (`torch-bf16`, s1/s2 only), each with cudnn.benchmark off (PyTorch's default,
cuDNN heuristics) and on (`-bench`). Median ms over --iters runs after --warmup runs, device
synchronized around each timed region, of the forward and of forward+backward (loss = sum(y*g),
gradients to x and w), and of the two backward convolutions alone (torch.nn.grad). Prints `name value unit` lines named like benches/conv.rs.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--device", default="0")
p.add_argument("--iters", type=int, default=10)
p.add_argument("--warmup", type=int, default=3)
a = p.parse_args()
dev = torch.device(f"cuda:{a.device}")

CASES = [
    dict(name="s1", n=16, c_in=128, c_out=128, hw=160, k=3, pad=1, stride=1, groups=1),
    dict(name="s2", n=16, c_in=128, c_out=128, hw=160, k=3, pad=1, stride=2, groups=1),
    dict(name="g4", n=16, c_in=64, c_out=64, hw=80, k=3, pad=1, stride=1, groups=4),
]


def timed(fn):
    for _ in range(a.warmup):
        fn()
    v = []
    for _ in range(a.iters):
        torch.cuda.synchronize(dev)
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize(dev)
        v.append((time.perf_counter() - t) * 1e3)
    return statistics.median(v)


def run(c, dtype, tf32, bench):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = bench
    g = torch.Generator(device=dev).manual_seed(0)
    fan_in = c["c_in"] // c["groups"] * c["k"] ** 2
    x = torch.randn(c["n"], c["c_in"], c["hw"], c["hw"], device=dev, generator=g).to(dtype)
    w = (torch.randn(c["c_out"], c["c_in"] // c["groups"], c["k"], c["k"], device=dev,
                     generator=g) / fan_in ** 0.5).to(dtype)
    ho = (c["hw"] + 2 * c["pad"] - c["k"]) // c["stride"] + 1
    gy = torch.randn(c["n"], c["c_out"], ho, ho, device=dev, generator=g).to(dtype)
    x.requires_grad_(True)
    w.requires_grad_(True)

    def fwd():
        with torch.no_grad():
            F.conv2d(x, w, None, c["stride"], c["pad"], 1, c["groups"])

    def fwd_bwd():
        y = F.conv2d(x, w, None, c["stride"], c["pad"], 1, c["groups"])
        (y * gy).sum().backward()
        x.grad = None
        w.grad = None

    if dtype == torch.float32:
        label = "torch-tf32" if tf32 else "torch-f32"
        tag = f"{c['name']}_f32"
    else:
        label = "torch-bf16"
        tag = f"{c['name']}_bf16"
    if bench:
        label += "-bench"
    def bwd_data():
        torch.nn.grad.conv2d_input(x.shape, w, gy, c["stride"], c["pad"], 1, c["groups"])

    def bwd_filter():
        torch.nn.grad.conv2d_weight(x, w.shape, gy, c["stride"], c["pad"], 1, c["groups"])

    print(f"{tag}_fwd_{label} {timed(fwd):.3f} ms", flush=True)
    print(f"{tag}_fwdbwd_{label} {timed(fwd_bwd):.3f} ms", flush=True)
    with torch.no_grad():
        print(f"{tag}_bwddata_{label} {timed(bwd_data):.3f} ms", flush=True)
        print(f"{tag}_bwdfilter_{label} {timed(bwd_filter):.3f} ms", flush=True)


print(f"torch {torch.__version__} cudnn {torch.backends.cudnn.version()} "
      f"{torch.cuda.get_device_name(dev)}", flush=True)
for bench in (False, True):
    for c in CASES:
        run(c, torch.float32, False, bench)
        run(c, torch.float32, True, bench)
    for c in CASES[:2]:
        run(c, torch.bfloat16, False, bench)
