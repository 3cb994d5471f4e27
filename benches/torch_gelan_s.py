"""Official YOLOv9 code (WongKinYiu/yolov9 @ 5b1ea9a, unmodified): the gelan-s inference graph
(models/detect/gelan-s.yaml, the inference counterpart of yolov9-s; nc=80), seeded random weights,
fused as attempt_load(fuse=True) does (Conv+BN folded, RepConvN merged), eval, on cuda:0.
Timers follow ../shared/bench/torch_infer_graph.py (host clock, synchronize, median), and the timed
region matches benches/detect.rs's forward timer: an f32 NCHW input already on the device ->
.half() (f16 runs) -> model -> head output y[0].float() -> synchronize.
Eager and CUDA-graph (torch.cuda.CUDAGraph, capture on a side stream after 3 warm-ups) replay.
usage: PYTHONPATH=../shared/bench python3 benches/torch_gelan_s.py REPO ROUND_TAG (the shim of ../shared/bench/sitecustomize.py)
"""
import os
import sys
import time

repo, tag = sys.argv[1], sys.argv[2]
sys.path.insert(0, repo)
os.chdir(repo)
import torch  # noqa: E402
from models.yolo import Model  # noqa: E402
from models.common import Conv  # noqa: E402,F401

dev = torch.device("cuda:0")
torch.manual_seed(0)
base = Model("models/detect/gelan-s.yaml", ch=3, nc=80)
n_unfused = sum(p.numel() for p in base.parameters())
base = base.fuse().eval()
for m in base.modules():
    if type(m) in (torch.nn.SiLU,):
        m.inplace = True
n_fused = sum(p.numel() for p in base.parameters())
base = base.to(dev)
print(f"# {tag} torch {torch.__version__} cudnn {torch.backends.cudnn.version()} "
      f"gpu {torch.cuda.get_device_name(0)} gelan-s params unfused {n_unfused} fused {n_fused} "
      f"allow_tf32(cudnn) {torch.backends.cudnn.allow_tf32}", flush=True)


def make_fn(m, half):
    def f(x):
        y = m(x.half() if half else x)
        y = y[0] if isinstance(y, (tuple, list)) else y
        return y.float()
    return f


def t_eager(f, x, n):
    for _ in range(5):
        f(x)
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f(x)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2] * 1e3


def t_graph(f, x, n):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            f(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = f(x)  # noqa: F841
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2] * 1e3


with torch.no_grad():
    configs = [
        # (half, batch, cudnn.benchmark)
        (True, 1, False), (True, 32, False),
        (True, 1, True), (True, 32, True),
        (False, 1, False), (False, 32, False),
    ]
    for half, b, bench in configs:
        torch.backends.cudnn.benchmark = bench
        m = base.half() if half else base.float()
        f = make_fn(m, half)
        x = torch.rand(b, 3, 640, 640, device=dev)
        n = 50 if b == 1 else 30
        e = t_eager(f, x, n)
        g = t_graph(f, x, n)
        name = f"torch_{'f16' if half else 'f32'}_b{b}{'_cudnnbench' if bench else ''}"
        print(f"{tag} {name}_eager_ms {e:.3f}", flush=True)
        print(f"{tag} {name}_cudagraph_ms {g:.3f}", flush=True)
        print(f"{tag} {name}_img_per_s eager {b * 1e3 / e:.1f} cudagraph {b * 1e3 / g:.1f}", flush=True)
    print(f"{tag} torch_max_allocated_GiB {torch.cuda.max_memory_allocated() / 2**30:.2f}", flush=True)
