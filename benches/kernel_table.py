"""Kernel time per phase and per kernel from a profile of one training iteration.
usage:
  python3 benches/kernel_table.py ncu.csv [--top 25] [--detail NAME_PREFIX ...]
  python3 benches/kernel_table.py kernels.tsv [--top 25]
ncu.csv: `ncu --profile-from-start off --metrics gpu__time_duration.sum --clock-control none --cache-control none
--csv --page raw --log-file ncu.csv ...` over `cargo bench --features cuda,train --bench train_step -- --device 0
--batches B [--amp] --iters 1 --profile-iter 3` (the bench launches one `uexp_f64` kernel after the forward, the loss,
the backward and the optimizer, so the list splits into forward / loss / backward / optimizer / ema), or over
`benches/torch_train_step.py --profile-iter 3` (one float64 exp kernel between forward+loss and backward).
kernels.tsv: `benches/torch_train_step.py --kernels kernels.tsv` (torch.profiler, `microseconds<TAB>name` per kernel).
Prints per phase the kernel count and time, then the `--top` kernels by total time (template arguments cut);
`--detail P` adds the grid sizes of the kernels whose name starts with P, with their mean time."""
import argparse, collections, csv, re, sys

p = argparse.ArgumentParser(); p.add_argument("file"); p.add_argument("--top", type=int, default=25)
p.add_argument("--detail", nargs="*", default=[])
a = p.parse_args()

def short(n):
    return re.sub(r"\(.*", "", n)[:100]

kernels = []  # (name, ns, grid)
if a.file.endswith(".tsv"):
    for line in open(a.file):
        us, name = line.rstrip("\n").split("\t", 1)
        kernels.append((name, float(us) * 1e3, ""))
    phases = [("step", kernels)]
else:
    lines = open(a.file).read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    rows = list(csv.reader(lines[start:]))
    h = rows[0]
    kn, td, gs = h.index("Kernel Name"), h.index("gpu__time_duration.sum"), h.index("Grid Size")
    if rows[1][td] != "ns":
        sys.exit(f"expected gpu__time_duration in ns, found {rows[1][td]!r}")
    for r in rows[2:]:
        if len(r) > td and r[td]:
            kernels.append((r[kn], float(r[td].replace(",", "")), r[gs]))
    groups = [[]]
    for k in kernels:
        if "uexp_f64" in k[0] or re.match(r".*exp_kernel.*double", k[0]):
            groups.append([])
        else:
            groups[-1].append(k)
    names = ["forward", "loss", "backward", "optimizer", "ema"] if len(groups) == 5 else \
        ["forward+loss", "backward"] if len(groups) == 2 else [f"part {i}" for i in range(len(groups))]
    phases = list(zip(names, groups))

total = sum(k[1] for k in kernels) / 1e6
print(f"{len(kernels)} kernels, {total:.2f} ms")
for name, ks in phases:
    print(f"{name}: {len(ks)} kernels, {sum(k[1] for k in ks) / 1e6:.2f} ms")
for name, ks in phases:
    by = collections.defaultdict(lambda: [0, 0.0])
    for k in ks:
        by[short(k[0])][0] += 1
        by[short(k[0])][1] += k[1] / 1e6
    print(f"== {name}")
    for n, (c, ms) in sorted(by.items(), key=lambda x: -x[1][1])[: a.top]:
        print(f"{ms:9.2f} ms {c:6d}  {n}")
for prefix in a.detail:
    by = collections.defaultdict(lambda: [0, 0.0])
    for k in kernels:
        if k[0].startswith(prefix):
            by[k[2]][0] += 1
            by[k[2]][1] += k[1] / 1e3
    print(f"== {prefix} by grid")
    for g, (c, us) in sorted(by.items(), key=lambda x: -x[1][1])[:12]:
        print(f"  grid {g:>18} n {c:5d} total {us:10.1f} us mean {us / c:9.1f} us")
