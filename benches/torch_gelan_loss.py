"""Oracle of the single-head GELAN loss (issue 34): the official `utils/loss_tal.py ComputeLoss` (what the
official train.py uses for gelan-*) on one fixed batch, written as `gelan_loss_batch.safetensors` for
`tests/train/gelan.rs::gelan_loss_matches_the_official_loss_tal` (put it in ../shared/reference/).
usage (any machine with torch; CPU is enough), with a checkout of WongKinYiu/yolov9 at REPO:
  python3 benches/torch_gelan_loss.py REPO weights/yolov9-s-bccd.safetensors OUT.safetensors
The model: `Model(models/detect/gelan-s.yaml, nc=3)` with the shipped BCCD weights (gelan-s, official names,
fp16 -> fp32), `model.hyp` = hyp.scratch-high.yaml, **eval mode** (BN from the running statistics, so the
Rust side sees the same head outputs without replaying a train-mode BN update). Input: 2 images 256x256,
uniform [0,1) from torch.Generator seed 0; targets: 5 boxes (below), official [img, cls, cx, cy, w, h].
Writes `x` f32 [2,3,256,256], `targets` f32 [5,6], `loss_items` f32 [3] (box, cls, dfl after the gains),
`loss_total` f32 [] and `head_p{3,4,5}` (the raw DDetect outputs) for debugging."""
import sys, os
repo, weights, out = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
sys.path.insert(0, repo); os.chdir(repo)
import torch, yaml
from safetensors.torch import load_file, save_file
from models.yolo import Model
from utils.loss_tal import ComputeLoss

torch.set_grad_enabled(True)
sd = {k: v.float() for k, v in load_file(weights).items()}
model = Model('models/detect/gelan-s.yaml', ch=3, nc=3)
missing, unexpected = model.load_state_dict(sd, strict=False)
assert not [m for m in missing if not m.endswith('num_batches_tracked')] and not unexpected, (missing, unexpected)
model.hyp = yaml.safe_load(open('data/hyps/hyp.scratch-high.yaml'))
model.eval()
g = torch.Generator().manual_seed(0)
x = torch.rand(2, 3, 256, 256, generator=g)
targets = torch.tensor([[0, 0, 0.30, 0.35, 0.25, 0.30], [0, 2, 0.70, 0.60, 0.10, 0.12], [1, 1, 0.50, 0.50, 0.40, 0.45],
                        [1, 0, 0.20, 0.80, 0.15, 0.20], [1, 2, 0.75, 0.25, 0.08, 0.08]], dtype=torch.float32)
p = model(x)  # eval: (y, [P3, P4, P5]); ComputeLoss takes p[1]
loss, items = ComputeLoss(model)(p, targets)
feats = p[1]
t = {'x': x.contiguous(), 'targets': targets, 'loss_items': items.detach().float().contiguous(),
     'loss_total': loss.detach().float().reshape(()).contiguous()}
for i, f in enumerate(feats):
    t[f'head_p{i + 3}'] = f.detach().float().contiguous()
save_file(t, out)
print('loss_items', items.tolist(), 'total', float(loss))
