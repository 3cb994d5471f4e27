"""Makes the ByteTrack oracle files tests/detect/track_oracle/*.json with the authors' tracker.

The authors' code (ifzhang/ByteTrack: yolox/tracker/{byte_tracker,kalman_filter,matching,
basetrack}.py) is NOT part of this repository: check it out and pass the folder that holds
`yolox/tracker/`:

    python3 -m venv /tmp/bt && /tmp/bt/bin/pip install numpy scipy lap
    git clone https://github.com/ifzhang/ByteTrack /tmp/ByteTrack   # any checkout
    /tmp/bt/bin/python benches/track_oracle.py --bytetrack /tmp/ByteTrack \
        --out tests/detect/track_oracle --mot-case tests/detect/track_mot_case.json

(`--mot-case` needs `pip install motmetrics`: a small case with py-motmetrics' MOTA, ID switches
and IDF1, which yolo9::track::mot must reproduce.)

Stand-ins for imports the tracker does not use for this (torch, cv2) are empty modules;
`cython_bbox.bbox_overlaps` is replaced by the same formula in numpy (sides counted as
x2 - x1 + 1, as in the Faster R-CNN code cython_bbox packages); numpy 2's removed `np.float`
alias is set to `float`. The tracking algorithm runs unchanged.

Each scenario is a designed detection sequence (crossings, occlusions, low-score recoveries,
births, deaths, a lost track returning just after its buffer, random crowds). Coordinates are
multiples of 1/64 and scores multiples of 1/1024, so the f32 detections of the Rust test are the
same numbers. Output per file: {"name", "config" (the Rust TrackerConfig fields), "frames":
[{"frame", "dets": [[x1, y1, x2, y2, score, class]], "tracks": [[id, x1, y1, x2, y2, score]]}]}.
"""

import argparse
import importlib
import json
import os
import sys
import types

import numpy as np


def install_shims(root):
    np.float = float  # removed in numpy 2; the authors' code still names it

    def bbox_overlaps(boxes, query):
        boxes = np.asarray(boxes, dtype=np.float64)
        query = np.asarray(query, dtype=np.float64)
        out = np.zeros((len(boxes), len(query)), dtype=np.float64)
        for k in range(len(query)):
            qa = (query[k, 2] - query[k, 0] + 1) * (query[k, 3] - query[k, 1] + 1)
            for n in range(len(boxes)):
                iw = min(boxes[n, 2], query[k, 2]) - max(boxes[n, 0], query[k, 0]) + 1
                if iw > 0:
                    ih = min(boxes[n, 3], query[k, 3]) - max(boxes[n, 1], query[k, 1]) + 1
                    if ih > 0:
                        ua = (boxes[n, 2] - boxes[n, 0] + 1) * (boxes[n, 3] - boxes[n, 1] + 1) + qa - iw * ih
                        out[n, k] = iw * ih / ua
        return out

    cb = types.ModuleType("cython_bbox")
    cb.bbox_overlaps = bbox_overlaps
    sys.modules["cython_bbox"] = cb
    for name in ["torch", "torch.nn", "torch.nn.functional", "cv2"]:
        sys.modules[name] = types.ModuleType(name)
    sys.modules["torch"].nn = sys.modules["torch.nn"]
    sys.modules["torch.nn"].functional = sys.modules["torch.nn.functional"]
    for pkg, sub in [("yolox", "yolox"), ("yolox.tracker", os.path.join("yolox", "tracker"))]:
        m = types.ModuleType(pkg)
        m.__path__ = [os.path.join(root, sub)]
        sys.modules[pkg] = m
    sys.modules["yolox"].tracker = sys.modules["yolox.tracker"]
    return importlib.import_module("yolox.tracker.byte_tracker")


def q64(v):
    return float(np.round(v * 64.0) / 64.0)


def q1024(s):
    return float(np.round(s * 1024.0) / 1024.0)


def box(cx, cy, w, h):
    return [q64(cx - w / 2), q64(cy - h / 2), q64(cx + w / 2), q64(cy + h / 2)]


class Scene:
    """Objects with paths: frames -> list of [x1, y1, x2, y2, score, cls]."""

    def __init__(self, n_frames, seed):
        self.n = n_frames
        self.rng = np.random.default_rng(seed)
        self.frames = [[] for _ in range(n_frames)]

    def add(self, start, end, p0, v, size, cls=0, score=(0.75, 0.95), gone=(), low=(), acc=(0.0, 0.0)):
        """An object from frame `start` to `end` (exclusive) from centre p0 with velocity v
        (px/frame, plus acceleration acc), size (w, h); no detection on frames in `gone`, a low
        score (0.15..0.45) on frames in `low`."""
        for f in range(start, min(end, self.n)):
            t = f - start
            cx = p0[0] + v[0] * t + 0.5 * acc[0] * t * t + self.rng.normal(0, 0.6)
            cy = p0[1] + v[1] * t + 0.5 * acc[1] * t * t + self.rng.normal(0, 0.6)
            w = size[0] * (1 + self.rng.normal(0, 0.01))
            h = size[1] * (1 + self.rng.normal(0, 0.01))
            if f in gone:
                continue
            s = self.rng.uniform(0.15, 0.45) if f in low else self.rng.uniform(*score)
            self.frames[f].append(box(cx, cy, w, h) + [q1024(s), cls])

    def noise(self, k, w=(20, 60), score=(0.12, 0.7)):
        """k random one-frame detections (false positives) over the whole sequence."""
        for _ in range(k):
            f = int(self.rng.integers(0, self.n))
            cx, cy = self.rng.uniform(50, 900), self.rng.uniform(50, 600)
            bw = self.rng.uniform(*w)
            self.frames[f].append(box(cx, cy, bw, bw * self.rng.uniform(0.7, 1.4))
                                  + [q1024(self.rng.uniform(*score)), 1])

    def shuffled(self):
        for fr in self.frames:
            self.rng.shuffle(fr)
        return self.frames


def scenarios():
    out = []
    # Two objects cross head-on, a third passes over them diagonally.
    s = Scene(45, 1)
    s.add(0, 45, (100, 300), (12, 0.3), (40, 80))
    s.add(0, 45, (640, 310), (-12, -0.2), (44, 84))
    s.add(5, 45, (200, 100), (9, 5), (36, 70), cls=2)
    out.append(("crossing", s.shuffled(), {}))
    # Full occlusions of 3 and 8 frames (no box), then found again by the filter's prediction.
    s = Scene(50, 2)
    s.add(0, 50, (100, 200), (6, 0), (50, 100), gone=range(15, 18))
    s.add(0, 50, (600, 400), (-5, -2), (60, 60), gone=range(20, 28))
    s.add(0, 50, (300, 500), (0, 0), (30, 30))
    out.append(("occlusion", s.shuffled(), {}))
    # Low-score recovery: the score falls into 0.15..0.45 for stretches (second association).
    s = Scene(40, 3)
    s.add(0, 40, (150, 150), (5, 3), (40, 90), low=range(10, 20))
    s.add(0, 40, (500, 150), (-4, 3), (40, 90), low=set(range(12, 16)) | set(range(25, 30)))
    s.add(0, 40, (320, 450), (3, -2), (70, 50), low=range(0, 6))  # born only when it scores high
    out.append(("low_score", s.shuffled(), {}))
    # Births and deaths at 10 fps (buffer 10 frames): one returns within the buffer, one on the
    # frame after its removal, one later (a new ID); false positives; a 0.5-0.6 score starts none.
    s = Scene(60, 4)
    s.add(0, 20, (100, 100), (4, 1), (40, 40))
    s.add(3, 60, (400, 300), (2, 0), (50, 80), gone=range(10, 18))
    s.add(5, 60, (700, 200), (-1, 2), (50, 50), gone=range(20, 31))
    s.add(8, 60, (200, 500), (3, -1), (45, 60), gone=range(30, 45))
    s.add(12, 40, (800, 500), (-3, 0), (40, 40), score=(0.51, 0.59))
    s.add(40, 60, (100, 400), (5, 0), (40, 70), cls=3)
    s.noise(15, score=(0.3, 0.9))
    out.append(("births_deaths", s.shuffled(), {"frame_rate": 10.0}))
    # Changing speeds and a crowd with random dropouts, low scores and false positives.
    s = Scene(70, 5)
    rng = np.random.default_rng(55)
    for k in range(14):
        start = int(rng.integers(0, 20))
        end = int(rng.integers(45, 71))
        p0 = (rng.uniform(80, 880), rng.uniform(80, 560))
        v = (rng.uniform(-6, 6), rng.uniform(-4, 4))
        acc = (rng.uniform(-0.15, 0.15), rng.uniform(-0.1, 0.1))
        size = (rng.uniform(30, 70), rng.uniform(40, 110))
        gone = set(int(x) for x in rng.integers(start, end, 3))
        low = set(int(x) for x in rng.integers(start, end, 4))
        s.add(start, end, p0, v, size, cls=k % 3, gone=gone, low=low, acc=acc)
    s.noise(25)
    frames = s.shuffled()
    out.append(("crowd", frames, {}))
    out.append(("crowd_no_fuse", frames, {"fuse_score": False}))
    out.append(("crowd_high_thresh", frames, {"track_high_thresh": 0.6, "match_thresh": 0.9}))
    return out


def run(bt_mod, name, frames, over):
    cfg = {"track_high_thresh": 0.5, "track_low_thresh": 0.1, "new_track_thresh": 0.6,
           "track_buffer": 30, "match_thresh": 0.8, "fuse_score": True, "frame_rate": 30.0}
    cfg.update(over)
    # The authors' fixed relations, which the Rust config states explicitly.
    cfg["new_track_thresh"] = round(cfg["track_high_thresh"] + 0.1, 6)
    assert cfg["track_low_thresh"] == 0.1
    args = types.SimpleNamespace(track_thresh=cfg["track_high_thresh"], track_buffer=cfg["track_buffer"],
                                 match_thresh=cfg["match_thresh"], mot20=not cfg["fuse_score"])
    bt_mod.BaseTrack._count = 0
    tracker = bt_mod.BYTETracker(args, frame_rate=cfg["frame_rate"])
    rows = []
    for k, dets in enumerate(frames):
        arr = np.array([d[:5] for d in dets], dtype=np.float64).reshape(-1, 5)
        tracks = tracker.update(arr, (1000, 1000), (1000, 1000))
        rows.append({
            "frame": k + 1,
            "dets": dets,
            "tracks": [[int(t.track_id)] + [round(float(v), 6) for v in t.tlbr] + [float(t.score)]
                       for t in tracks],
        })
    return {"name": name, "config": cfg, "frames": rows}


def mot_case(path):
    """A small MOT case (3 objects, 12 frames: an ID switch, a fragmented track, misses, false
    positives, a box under the IoU limit) with py-motmetrics' answer (`pip install motmetrics`),
    for yolo9::track::mot."""
    if not hasattr(np, "asfarray"):
        np.asfarray = lambda a: np.asarray(a, dtype=np.float64)  # removed in numpy 2
    import motmetrics as mm

    rng = np.random.default_rng(7)
    frames = []
    acc = mm.MOTAccumulator(auto_id=True)
    for t in range(12):
        gt = [[1, 10 + 5 * t, 10, 40, 40], [2, 200 - 6 * t, 30, 40, 50], [3, 100, 150 + 2 * t, 30, 30]]
        hyp = []
        for oid, x, y, w, h in gt:
            if oid == 3 and t in (4, 5):
                continue  # missed
            hid = {1: 11, 2: 22 if t < 7 else 23, 3: 33 if t < 8 else 34}[oid]
            if oid == 3 and t >= 10:
                hid = 33  # the fragment's old ID comes back
            jx, jy = rng.normal(0, 2, 2)
            hyp.append([hid, x + jx, y + jy, w, h])
        if t == 6:
            hyp.append([99, 300, 300, 20, 20])  # a false positive
        if t == 9:
            hyp[0][1] += 25  # under the IoU limit: a miss and a false positive
        hyp = [[h[0]] + [q64(v) for v in h[1:]] for h in hyp]
        g = np.array([r[1:] for r in gt], dtype=np.float64)
        hh = np.array([r[1:] for r in hyp], dtype=np.float64)
        acc.update([r[0] for r in gt], [r[0] for r in hyp], mm.distances.iou_matrix(g, hh, max_iou=0.5))
        frames.append({"gt": gt, "hyp": hyp})
    names = ["num_frames", "num_objects", "num_predictions", "num_matches", "num_misses",
             "num_false_positives", "num_switches", "mota", "idtp", "idf1", "idp", "idr"]
    summary = mm.metrics.create().compute(acc, metrics=names, name="case")
    res = {"frames": frames, "boxes": "x, y, w, h (top-left, size)",
           "motmetrics": {n: float(summary[n].iloc[0]) for n in names}}
    with open(path, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"mot case: {res['motmetrics']}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytetrack", required=True, help="folder holding yolox/tracker/ of the authors")
    ap.add_argument("--out", required=True)
    ap.add_argument("--mot-case", help="also write the py-motmetrics case to this JSON file")
    a = ap.parse_args()
    if a.mot_case:
        mot_case(a.mot_case)
    bt_mod = install_shims(a.bytetrack)
    os.makedirs(a.out, exist_ok=True)
    for name, frames, over in scenarios():
        res = run(bt_mod, name, frames, over)
        ids = {t[0] for f in res["frames"] for t in f["tracks"]}
        n = sum(len(f["tracks"]) for f in res["frames"])
        with open(os.path.join(a.out, name + ".json"), "w") as fh:
            json.dump(res, fh, separators=(",", ":"))
        print(f"{name}: {len(res['frames'])} frames, {n} track boxes, {len(ids)} IDs")


if __name__ == "__main__":
    main()
