//! TaskAlignedAssigner parity against the official PyTorch oracle
//! (`../shared/reference/tal_case.safetensors`, README §5) and hand-made cases.

use crate::common;

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use yolo9::internals::loss::{Anchors, AssignerInput, GtBatch, Scores, TaskAlignedAssigner};

fn load_case() -> HashMap<String, Tensor> {
    let path = common::reference("tal_case.safetensors");
    candle_core::safetensors::load(&path, &Device::Cpu)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn f32s(t: &HashMap<String, Tensor>, k: &str) -> Vec<f32> {
    t[k].to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn i64s(t: &HashMap<String, Tensor>, k: &str) -> Vec<i64> {
    t[k].to_dtype(DType::I64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn boxes(v: &[f32]) -> Vec<[f32; 4]> {
    v.chunks_exact(4)
        .map(|c| [c[0], c[1], c[2], c[3]])
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn tal_case_matches_official_assigner() {
    let t = load_case();
    let (bs, na, nc) = (2usize, 420usize, 80usize);

    // Our anchors for a 128 x 160 image equal the stored ones.
    let anchors = Anchors::new(&[(16, 20), (8, 10), (4, 5)], &[8, 16, 32]).unwrap();
    let anc_px = anchors.points_px();
    let stored_anc = f32s(&t, "anc_points");
    let ours: Vec<f32> = anc_px.iter().flatten().copied().collect();
    assert_eq!(
        ours, stored_anc,
        "anchor points differ from make_anchors * stride"
    );
    assert_eq!(anchors.strides, f32s(&t, "stride_tensor"));

    let gt = GtBatch::from_tensors(&t["gt_labels"], &t["gt_bboxes"], &t["mask_gt"], nc).unwrap();
    assert_eq!(gt.n_max_boxes, 3);
    let scores = f32s(&t, "pd_scores");
    let pd = boxes(&f32s(&t, "pd_bboxes"));
    let assigner = TaskAlignedAssigner::new(nc);
    let input = AssignerInput {
        scores: Scores::Probs(&scores),
        pd_bboxes: &pd,
        anc_points: &anc_px,
        gt: &gt,
    };
    let (out, diag) = assigner.assign_with_diagnostics(&input).unwrap();

    // Intermediates.
    let ov_ref = f32s(&t, "overlaps");
    let am_ref = f32s(&t, "align_metric");
    let d_ov = max_abs_diff(&diag.overlaps, &ov_ref);
    let d_am = max_abs_diff(&diag.align_metric, &am_ref);
    let rel_am = diag
        .align_metric
        .iter()
        .zip(&am_ref)
        .filter(|(_, r)| **r > 1e-12)
        .map(|(x, r)| (x - r).abs() / r)
        .fold(0f32, f32::max);
    println!("overlaps max|diff| {d_ov:e}, align_metric max|diff| {d_am:e}, max rel {rel_am:e}");
    assert!(d_ov <= 1e-6, "overlaps differ by {d_ov}");
    assert!(d_am <= 1e-6, "align_metric differs by {d_am}");
    assert!(rel_am <= 1e-4, "align_metric relative diff {rel_am}");
    let pre_ref: Vec<bool> = f32s(&t, "mask_pos_pre").iter().map(|&v| v != 0.0).collect();
    assert_eq!(diag.mask_pos_pre, pre_ref, "mask_pos_pre differs");
    let pos_ref: Vec<bool> = f32s(&t, "mask_pos").iter().map(|&v| v != 0.0).collect();
    assert_eq!(diag.mask_pos, pos_ref, "mask_pos differs");
    // The case really exercises de-duplication: some anchors are claimed by two GTs.
    assert!(pre_ref.iter().filter(|&&v| v).count() > pos_ref.iter().filter(|&&v| v).count());

    // Outputs.
    let fg_ref: Vec<bool> = i64s(&t, "fg_mask").iter().map(|&v| v != 0).collect();
    assert_eq!(out.fg_mask, fg_ref, "fg_mask differs");
    assert_eq!(
        fg_ref.iter().filter(|&&v| v).count(),
        18,
        "oracle has 18 fg anchors"
    );
    let gt_idx_ref: Vec<usize> = i64s(&t, "target_gt_idx")
        .iter()
        .map(|&v| v as usize)
        .collect();
    assert_eq!(out.target_gt_idx, gt_idx_ref, "target_gt_idx differs");
    let labels_ref = i64s(&t, "target_labels");
    for i in 0..bs * na {
        if fg_ref[i] {
            assert_eq!(
                out.target_labels[i], labels_ref[i],
                "target label of fg anchor {i}"
            );
        }
    }
    // Background labels follow the official rule too (label of GT row 0).
    assert_eq!(out.target_labels, labels_ref);
    let tb: Vec<f32> = out.target_bboxes.iter().flatten().copied().collect();
    let d_tb = max_abs_diff(&tb, &f32s(&t, "target_bboxes"));
    let ts_ref = f32s(&t, "target_scores");
    let d_ts = max_abs_diff(&out.target_scores_dense(), &ts_ref);
    println!("target_bboxes max|diff| {d_tb:e}, target_scores max|diff| {d_ts:e}");
    assert!(d_tb <= 1e-5, "target_bboxes differ by {d_tb}");
    assert!(d_ts <= 1e-5, "target_scores differ by {d_ts}");
    let sum_ref: f64 = ts_ref.iter().map(|&v| v as f64).sum();
    assert!((out.target_scores_sum() as f64 - sum_ref).abs() <= 1e-5 * sum_ref.max(1.0));

    // The fast path (no diagnostics) gives the same assignment.
    assert_eq!(assigner.assign(&input).unwrap(), out);

    // Same scores given as head logits (channel-first, with the 64 DFL channels before them).
    let no = 64 + nc;
    let mut head = vec![0f32; bs * no * na];
    for b in 0..bs {
        for a in 0..na {
            for c in 0..nc {
                let p = scores[(b * na + a) * nc + c] as f64;
                head[(b * no + 64 + c) * na + a] = (p / (1.0 - p)).ln() as f32;
            }
        }
    }
    let via_logits = assigner
        .assign(&AssignerInput {
            scores: Scores::HeadLogits {
                data: &head,
                channels: no,
                offset: 64,
            },
            ..input
        })
        .unwrap();
    assert_eq!(via_logits.fg_mask, out.fg_mask);
    assert_eq!(via_logits.target_gt_idx, out.target_gt_idx);
    let d = max_abs_diff(&via_logits.target_score, &out.target_score);
    assert!(d <= 1e-5, "logit input changes target scores by {d}");
}

#[test]
fn tal_case_empty_gt_early_return() {
    let t = load_case();
    let (bs, na, nc) = (2usize, 420usize, 80usize);
    let anc = Anchors::new(&[(16, 20), (8, 10), (4, 5)], &[8, 16, 32])
        .unwrap()
        .points_px();
    let scores = f32s(&t, "pd_scores");
    let pd = boxes(&f32s(&t, "pd_bboxes"));
    let gt = GtBatch::from_tensors(
        &Tensor::zeros((bs, 0, 1), DType::F32, &Device::Cpu).unwrap(),
        &Tensor::zeros((bs, 0, 4), DType::F32, &Device::Cpu).unwrap(),
        &Tensor::zeros((bs, 0, 1), DType::F32, &Device::Cpu).unwrap(),
        nc,
    )
    .unwrap();
    let out = TaskAlignedAssigner::new(nc)
        .assign(&AssignerInput {
            scores: Scores::Probs(&scores),
            pd_bboxes: &pd,
            anc_points: &anc,
            gt: &gt,
        })
        .unwrap();
    let labels_ref: Vec<i64> = f32s(&t, "empty_target_labels")
        .iter()
        .map(|&v| v as i64)
        .collect();
    assert_eq!(out.target_labels, labels_ref);
    assert!(labels_ref.iter().all(|&l| l == 80));
    let fg_ref: Vec<bool> = f32s(&t, "empty_fg_mask")
        .iter()
        .map(|&v| v != 0.0)
        .collect();
    assert_eq!(out.fg_mask, fg_ref);
    assert!(out.target_bboxes.iter().all(|b| *b == [0.0; 4]));
    assert!(out.target_scores_dense().iter().all(|&s| s == 0.0));
    assert_eq!(out.target_scores_dense().len(), bs * na * nc);
}

/// Hand-made: one 4x4-cell GT on a single 8x8 grid (stride 1), two classes, every anchor scored
/// 0.25 on the GT class (so the metric is `0.5 * CIoU^6`). Anchor `a` predicts the GT box
/// shifted right by `(a % 16) * 0.05` px, so the metric falls with `a % 16`, with exact ties
/// between anchors 16 apart. Checks: positives = the top 10 of the 16 inside anchors (ties by
/// index), target score = `align * max_overlap / max_align`.
#[test]
fn hand_case_topk_inside_and_normalisation() {
    let anchors = Anchors::new(&[(8, 8)], &[1]).unwrap();
    let anc = anchors.points_px();
    let na = anc.len();
    let gt_box = [2.0f32, 2.0, 6.0, 6.0]; // anchors with centres 2.5..5.5 inside: 4 x 4 = 16
    let gt = GtBatch {
        batch: 1,
        n_max_boxes: 1,
        labels: vec![1],
        bboxes: vec![gt_box],
        mask: vec![true],
    };
    // Predictions: anchor a predicts the GT box shifted right by (a % 16) * 0.05 pixels, so the
    // overlap decreases with a (within the 16 inside anchors the order is by index mod 16).
    let pd: Vec<[f32; 4]> = (0..na)
        .map(|a| {
            let s = (a % 16) as f32 * 0.05;
            [gt_box[0] + s, gt_box[1], gt_box[2] + s, gt_box[3]]
        })
        .collect();
    let scores: Vec<f32> = (0..na).flat_map(|_| [0.9f32, 0.25]).collect();
    let mut asg = TaskAlignedAssigner::new(2);
    asg.topk = 10;
    let (out, diag) = asg
        .assign_with_diagnostics(&AssignerInput {
            scores: Scores::Probs(&scores),
            pd_bboxes: &pd,
            anc_points: &anc,
            gt: &gt,
        })
        .unwrap();
    let inside: Vec<usize> = (0..na)
        .filter(|&a| {
            let [x, y] = anc[a];
            x > 2.0 && x < 6.0 && y > 2.0 && y < 6.0
        })
        .collect();
    assert_eq!(inside.len(), 16);
    // Rank inside anchors by metric (decreasing), i.e. by shift (increasing), ties by index.
    let mut ranked = inside.clone();
    ranked.sort_by(|&a, &b| (a % 16).cmp(&(b % 16)).then(a.cmp(&b)));
    let expect: Vec<usize> = ranked[..10].to_vec();
    let mut got = out.fg_indices();
    got.sort();
    let mut expect_sorted = expect.clone();
    expect_sorted.sort();
    assert_eq!(got, expect_sorted);
    // Normalisation: max align among positives -> score = max overlap; all scores = align *
    // max_ov / max_align.
    let ov = |a: usize| diag.overlaps[a];
    let al = |a: usize| diag.align_metric[a];
    let max_ov = expect.iter().map(|&a| ov(a)).fold(0f32, f32::max);
    let max_al = expect.iter().map(|&a| al(a)).fold(0f32, f32::max);
    for &a in &expect {
        let want = al(a) * max_ov / (max_al + 1e-9);
        assert!((out.target_score[a] - want).abs() <= 1e-7, "anchor {a}");
        assert_eq!(out.target_labels[a], 1);
        assert!((al(a) - 0.5 * ov(a).powf(6.0)).abs() <= 1e-6);
    }
    // The best anchor (smallest shift inside, 0.1 px) gets exactly its overlap.
    let best = expect[0];
    assert_eq!(best, 18);
    assert!((out.target_score[best] - ov(best)).abs() <= 1e-6);
    assert!(ov(best) > 0.9 && ov(best) < 0.96);
}

/// An anchor claimed by two GTs goes to the GT with the larger CIoU with its prediction.
#[test]
fn hand_case_anchor_claimed_twice_keeps_best_overlap() {
    let anchors = Anchors::new(&[(4, 4)], &[8]).unwrap();
    let anc = anchors.points_px(); // centres 4, 12, 20, 28
    let na = anc.len();
    // Two big overlapping GTs covering every anchor; topk = 16 so every inside anchor is a
    // candidate of both.
    let g0 = [0.0f32, 0.0, 32.0, 32.0];
    let g1 = [1.0f32, 1.0, 31.0, 31.0];
    let gt = GtBatch {
        batch: 1,
        n_max_boxes: 2,
        labels: vec![0, 1],
        bboxes: vec![g0, g1],
        mask: vec![true, true],
    };
    // Anchor 0 predicts g1 exactly; the others predict g0 exactly.
    let pd: Vec<[f32; 4]> = (0..na).map(|a| if a == 0 { g1 } else { g0 }).collect();
    let scores = vec![0.5f32; na * 2];
    let mut asg = TaskAlignedAssigner::new(2);
    asg.topk = 16;
    let (out, diag) = asg
        .assign_with_diagnostics(&AssignerInput {
            scores: Scores::Probs(&scores),
            pd_bboxes: &pd,
            anc_points: &anc,
            gt: &gt,
        })
        .unwrap();
    assert!(
        diag.mask_pos_pre.iter().all(|&v| v),
        "every anchor is claimed by both GTs"
    );
    assert!(out.fg_mask.iter().all(|&v| v));
    assert_eq!(out.target_gt_idx[0], 1);
    assert!(out.target_gt_idx[1..].iter().all(|&j| j == 0));
    assert_eq!(out.target_labels[0], 1);
    assert_eq!(out.target_bboxes[0], g1);
    // GT 1 has a single positive: its score is its overlap (~1).
    assert!((out.target_score[0] - diag.overlaps[na]).abs() < 1e-6);
}

#[test]
fn bad_inputs_are_errors() {
    let anc = Anchors::new(&[(2, 2)], &[8]).unwrap().points_px();
    let gt = GtBatch {
        batch: 1,
        n_max_boxes: 1,
        labels: vec![5],
        bboxes: vec![[0.0, 0.0, 16.0, 16.0]],
        mask: vec![true],
    };
    let pd = vec![[0.0f32, 0.0, 8.0, 8.0]; 4];
    let scores = vec![0.5f32; 4 * 3];
    let asg = TaskAlignedAssigner::new(3);
    let input = AssignerInput {
        scores: Scores::Probs(&scores),
        pd_bboxes: &pd,
        anc_points: &anc,
        gt: &gt,
    };
    let e = asg.assign(&input).unwrap_err().to_string();
    assert!(e.contains("label 5"), "{e}");
    let short = vec![0.5f32; 5];
    let e = asg
        .assign(&AssignerInput {
            scores: Scores::Probs(&short),
            ..input
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("scores"), "{e}");
    // Targets: image index out of range, fractional class, NaN.
    assert!(GtBatch::from_targets(&[[2.0, 0.0, 0.5, 0.5, 0.1, 0.1]], 2, (64, 64), 3).is_err());
    assert!(GtBatch::from_targets(&[[0.0, 1.5, 0.5, 0.5, 0.1, 0.1]], 2, (64, 64), 3).is_err());
    assert!(GtBatch::from_targets(&[[0.0, 1.0, f32::NAN, 0.5, 0.1, 0.1]], 2, (64, 64), 3).is_err());
    assert!(GtBatch::from_targets(&[[0.0, 1.0, 0.5, 0.5, -0.1, 0.1]], 2, (64, 64), 3).is_err());
}

/// `preprocess`: grouping by image, padding, normalized cxcywh -> xyxy pixels with (h, w) order.
#[test]
fn targets_are_grouped_and_scaled() {
    let rows = [
        [1.0f32, 2.0, 0.5, 0.25, 0.5, 0.25],
        [0.0, 1.0, 0.25, 0.5, 0.125, 0.5],
        [1.0, 0.0, 0.75, 0.75, 0.25, 0.25],
    ];
    // Image 128 high, 256 wide.
    let gt = GtBatch::from_targets(&rows, 3, (128, 256), 3).unwrap();
    assert_eq!(gt.n_max_boxes, 2);
    assert_eq!(gt.labels, vec![1, 0, 2, 0, 0, 0]);
    assert_eq!(gt.mask, vec![true, false, true, true, false, false]);
    assert_eq!(gt.bboxes[0], [48.0, 32.0, 80.0, 96.0]);
    assert_eq!(gt.bboxes[2], [64.0, 16.0, 192.0, 48.0]);
    assert_eq!(gt.bboxes[3], [160.0, 80.0, 224.0, 112.0]);
    assert_eq!(gt.bboxes[1], [0.0; 4]);
}

/// Tie rule (documented in the assigner): when a GT has fewer than `topk` anchors with a positive
/// metric, the remaining slots go to metric-0 entries of the masked row in anchor-index order,
/// counting anchors outside the GT (which then do not become positives).
#[test]
fn zero_metric_ties_follow_a_stable_topk() {
    let anc = Anchors::new(&[(4, 4)], &[8]).unwrap().points_px(); // centres 4, 12, 20, 28
    let far = [100.0f32, 100.0, 110.0, 110.0];
    let run = |gt_box: [f32; 4], good: usize, zero: usize| {
        let gt = GtBatch {
            batch: 1,
            n_max_boxes: 1,
            labels: vec![0],
            bboxes: vec![gt_box],
            mask: vec![true],
        };
        let pd: Vec<[f32; 4]> = (0..16)
            .map(|a| if a == good { gt_box } else { far })
            .collect();
        let scores = vec![0.5f32; 16];
        let input = AssignerInput {
            scores: Scores::Probs(&scores),
            pd_bboxes: &pd,
            anc_points: &anc,
            gt: &gt,
        };
        let (out, diag) = TaskAlignedAssigner::new(1)
            .assign_with_diagnostics(&input)
            .unwrap();
        // The fast path (positives only) takes the same fill-up rule.
        assert_eq!(TaskAlignedAssigner::new(1).assign(&input).unwrap(), out);
        assert!(diag.align_metric[good] > 0.5);
        assert_eq!(
            diag.align_metric[zero], 0.0,
            "far prediction: CIoU < 0 clamps to 0"
        );
        out
    };
    // GT over anchors 0 and 1: anchor 1 (metric 0) is among the first 9 zero entries.
    let out = run([0.0, 0.0, 16.0, 8.0], 0, 1);
    assert_eq!(out.fg_indices(), vec![0, 1]);
    assert_eq!(out.target_score[1], 0.0);
    assert!(out.target_score[0] > 0.99);
    // GT over anchors 14 and 15: the 9 zero slots go to anchors 0..9, so 15 is not positive.
    let out = run([16.0, 24.0, 32.0, 32.0], 14, 15);
    assert_eq!(out.fg_indices(), vec![14]);
}

/// `assign` (positives only) equals the reference path of `assign_with_diagnostics` on random
/// batches: overlapping GTs (anchors claimed twice), padded GT rows, GTs smaller than a cell
/// (fewer than top-k candidates: the fill-up rule), predictions near and far.
#[test]
fn fast_assignment_equals_the_reference_on_random_batches() {
    let hw = [(8usize, 8usize), (4, 4), (2, 2)];
    let anchors = yolo9::internals::loss::anchors::Anchors::new(&hw, &[8, 16, 32]).unwrap();
    let anc = anchors.points_px();
    let na = anc.len();
    for seed in 0..12u64 {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut r = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 1_000_000) as f32 / 1_000_000.0
        };
        let (bs, m, nc) = (3usize, 1 + (seed as usize % 5), 3usize);
        let mut labels = Vec::new();
        let mut bboxes = Vec::new();
        let mut mask = Vec::new();
        for _ in 0..bs * m {
            let (cx, cy) = (8.0 + 48.0 * r(), 8.0 + 48.0 * r());
            let (w, h) = (2.0 + 40.0 * r() * r(), 2.0 + 40.0 * r() * r());
            let valid = r() > 0.15;
            labels.push((r() * nc as f32).floor() as i64 % nc as i64);
            bboxes.push(if valid {
                [cx - w / 2.0, cy - h / 2.0, cx + w / 2.0, cy + h / 2.0]
            } else {
                [0.0; 4]
            });
            mask.push(valid);
        }
        let gt = GtBatch {
            batch: bs,
            n_max_boxes: m,
            labels,
            bboxes,
            mask,
        };
        let pd: Vec<[f32; 4]> = (0..bs * na)
            .map(|i| {
                let p = anc[i % na];
                let d = 1.0 + 20.0 * r();
                [p[0] - d * r(), p[1] - d * r(), p[0] + d, p[1] + d * r()]
            })
            .collect();
        let scores: Vec<f32> = (0..bs * na * nc).map(|_| r()).collect();
        let input = AssignerInput {
            scores: Scores::Probs(&scores),
            pd_bboxes: &pd,
            anc_points: &anc,
            gt: &gt,
        };
        let a = TaskAlignedAssigner::new(nc);
        let (reference, diag) = a.assign_with_diagnostics(&input).unwrap();
        let claimed_twice = (0..bs * na).any(|i| {
            let (b, an) = (i / na, i % na);
            (0..m)
                .filter(|&j| diag.mask_pos_pre[(b * m + j) * na + an])
                .count()
                > 1
        });
        assert_eq!(
            a.assign(&input).unwrap(),
            reference,
            "seed {seed} (claimed twice: {claimed_twice})"
        );
    }
}

/// The assigner op ([`yolo9::internals::loss::assign_op`], the GPU assigner's reference) on the CPU is the
/// host assigner: on the official case (probabilities) and on a head-layout batch (logits) that
/// exercises the top-k fallback, zero overlaps, padding and double claims; the planes hold the
/// target box and DFL distances of each foreground anchor in grid units.
#[test]
fn assign_op_on_the_cpu_is_the_host_assigner() {
    use yolo9::internals::loss::assign_op::{assign_dense, planes_to_assignment, ScoreLayout};
    use yolo9::internals::loss::targets::bbox2dist;
    let t = load_case();
    let (nc, na) = (80usize, 420usize);
    let anchors = Anchors::new(&[(16, 20), (8, 10), (4, 5)], &[8, 16, 32]).unwrap();
    let gt = GtBatch::from_tensors(&t["gt_labels"], &t["gt_bboxes"], &t["mask_gt"], nc).unwrap();
    let scores = f32s(&t, "pd_scores");
    let pd = boxes(&f32s(&t, "pd_bboxes"));
    let assigner = TaskAlignedAssigner::new(nc);
    let want = assigner
        .assign(&AssignerInput {
            scores: Scores::Probs(&scores),
            pd_bboxes: &pd,
            anc_points: &anchors.points_px(),
            gt: &gt,
        })
        .unwrap();
    // Boxes in grid units: the strides are powers of two, so px / s * s is exact.
    let mut grid = vec![0f32; 2 * 4 * na];
    for (i, b) in pd.iter().enumerate() {
        let (img, a) = (i / na, i % na);
        for c in 0..4 {
            grid[(img * 4 + c) * na + a] = b[c] / anchors.strides[a];
        }
    }
    let pbox = Tensor::from_vec(grid, (2, 4, na), &Device::Cpu).unwrap();
    let sc = Tensor::from_vec(scores, (2, na, nc), &Device::Cpu).unwrap();
    let planes = assign_dense(&assigner, &pbox, &sc, ScoreLayout::Probs, &anchors, &gt).unwrap();
    assert_eq!(planes.dims(), [11, 2, na]);
    let got = planes_to_assignment(&planes, &gt, nc).unwrap();
    assert_eq!(got, want);
    assert_eq!(got.fg_mask.iter().filter(|&&f| f).count(), 18);

    let (anchors, pbox, logits, gt) = common::assigner_batch(320, 4, 12, 5, 3);
    let na = anchors.len();
    let assigner = TaskAlignedAssigner::new(5);
    let layout = ScoreLayout::HeadLogits {
        channels: 69,
        offset: 64,
    };
    let planes = assign_dense(&assigner, &pbox, &logits, layout, &anchors, &gt).unwrap();
    let got = planes_to_assignment(&planes, &gt, 5).unwrap();
    let px: Vec<f32> = pbox.flatten_all().unwrap().to_vec1().unwrap();
    let pd: Vec<[f32; 4]> = (0..4 * na)
        .map(|i| {
            let (b, a) = (i / na, i % na);
            let s = anchors.strides[a];
            [0, 1, 2, 3].map(|c| px[(b * 4 + c) * na + a] * s)
        })
        .collect();
    let lv: Vec<f32> = logits.flatten_all().unwrap().to_vec1().unwrap();
    let want = assigner
        .assign(&AssignerInput {
            scores: Scores::HeadLogits {
                data: &lv,
                channels: 69,
                offset: 64,
            },
            pd_bboxes: &pd,
            anc_points: &anchors.points_px(),
            gt: &gt,
        })
        .unwrap();
    assert_eq!(got, want);
    // Every image but the last (no GTs) has positives, image 1 only through the fallback.
    for b in 0..4 {
        let n = want.fg_mask[b * na..(b + 1) * na]
            .iter()
            .filter(|&&f| f)
            .count();
        assert_eq!(n > 0, b < 3, "image {b} has {n} positives");
    }
    assert!(want.target_score[na..2 * na].iter().all(|&s| s == 0.0));
    let pl: Vec<f32> = planes.flatten_all().unwrap().to_vec1().unwrap();
    let ba = 4 * na;
    for i in (0..ba).filter(|&i| want.fg_mask[i]) {
        let a = i % na;
        let st = anchors.strides[a];
        let tb = want.target_bboxes[i].map(|v| v / st);
        let d = bbox2dist(anchors.points[a], tb);
        for k in 0..4 {
            assert_eq!(pl[(2 + k) * ba + i], tb[k]);
            assert_eq!(pl[(6 + k) * ba + i], d[k]);
        }
        assert_eq!(pl[ba + i], want.target_labels[i] as f32);
    }
}
