//! Detection matching and average precision, as the official YOLOv9 validator computes them
//! (WongKinYiu/yolov9 `val_dual.py process_batch` and `run`, `utils/metrics.py ap_per_class`,
//! `compute_ap`, `smooth`, `fitness`).
//!
//! The arithmetic follows the official one step for step so the numbers agree to the last bits where
//! possible: IoU and thresholds in f32 (torch), curves in f64 (numpy), numpy's pairwise summation
//! for `sum`/`mean`/`trapz`, numpy's `interp` rules (left/right values, exact-hit rule), round half to
//! even. Known residual difference: numpy's `convolve` (used by `smooth`) sums through BLAS `ddot`,
//! whose order is not reproduced; it changes the smoothed F1 by ~1e-17 and could only move the chosen
//! confidence on an exact near-tie. Sorting by confidence is stable here; numpy's quicksort order among
//! equal confidences is unspecified.
//!
//! These are not COCO numbers: predictions are matched by IoU regardless of their score, each
//! label to the lowest-index detection among those whose best label it is, and the curve is
//! interpolated at 101 recall points with the official sentinels (pycocotools matches greedily by
//! score, with `maxDets`).

use crate::boxes::box_iou;
use std::fmt::Write as _;

/// Number of IoU thresholds (0.50:0.05:0.95).
pub const N_IOU: usize = 10;

/// The IoU thresholds 0.50, 0.55, ..., 0.95 as f32, as `torch.linspace(0.5, 0.95, 10)` on CPU
/// (start + i·step for the first half, end − (9 − i)·step for the second, step = (0.95 − 0.5)/9 in f32).
pub fn iou_thresholds() -> [f32; N_IOU] {
    let (start, end) = (0.5f32, 0.95f32);
    let step = (end - start) / (N_IOU as f32 - 1.0);
    let mut t = [0f32; N_IOU];
    for (i, v) in t.iter_mut().enumerate() {
        *v = if i < N_IOU / 2 {
            start + step * i as f32
        } else {
            end - step * (N_IOU - i - 1) as f32
        };
    }
    t
}

/// The official `val_dual.process_batch`: which detections are true positives at each IoU threshold.
///
/// - `detections`: N rows `[x1, y1, x2, y2, conf, cls]` (pixels, same space as the labels).
/// - `labels`: M rows `[cls, x1, y1, x2, y2]`.
///
/// Returns N rows of [`N_IOU`] flags. For each threshold, candidate pairs are (label, detection) with
/// equal class and IoU ≥ threshold; each detection keeps its highest-IoU label, then each label keeps
/// the detection with the lowest index among those — the score plays no part.
pub fn process_batch(detections: &[[f32; 6]], labels: &[[f32; 5]]) -> Vec<[bool; N_IOU]> {
    if labels.is_empty() || detections.is_empty() {
        return vec![[false; N_IOU]; detections.len()];
    }
    // iou[l][d], label-major like torch.where's row-major order
    let iou: Vec<Vec<f32>> = labels
        .iter()
        .map(|l| {
            let lb = [l[1], l[2], l[3], l[4]];
            detections
                .iter()
                .map(|d| box_iou(&lb, &[d[0], d[1], d[2], d[3]]))
                .collect()
        })
        .collect();
    match_by_iou(&iou, detections, labels)
}

/// The matching of [`process_batch`] on a given label-major IoU matrix `iou[label][detection]`
/// (box IoU, or the mask IoU of the segmentation validator): the true-positive flags per
/// detection and threshold.
pub fn match_by_iou(
    iou: &[Vec<f32>],
    detections: &[[f32; 6]],
    labels: &[[f32; 5]],
) -> Vec<[bool; N_IOU]> {
    let mut correct = vec![[false; N_IOU]; detections.len()];
    if labels.is_empty() || detections.is_empty() {
        return correct;
    }
    for (t, thr) in iou_thresholds().iter().enumerate() {
        // (label, detection, iou) in torch.where order
        let mut m: Vec<(usize, usize, f32)> = Vec::new();
        for (li, l) in labels.iter().enumerate() {
            for (di, d) in detections.iter().enumerate() {
                if iou[li][di] >= *thr && l[0] == d[5] {
                    m.push((li, di, iou[li][di]));
                }
            }
        }
        if m.len() > 1 {
            // argsort ascending (stable) then reversed: descending IoU, ties in reverse order
            m.sort_by(|a, b| a.2.total_cmp(&b.2));
            m.reverse();
            // first occurrence per detection, ordered by detection index
            m = first_per_key(&m, |x| x.1);
            // first occurrence per label in that order
            m = first_per_key(&m, |x| x.0);
        }
        for &(_, d, _) in &m {
            correct[d][t] = true;
        }
    }
    correct
}

/// numpy `unique(key, return_index=True)` then take: the first row of each key, sorted by key.
fn first_per_key(
    m: &[(usize, usize, f32)],
    key: impl Fn(&(usize, usize, f32)) -> usize,
) -> Vec<(usize, usize, f32)> {
    let mut out: Vec<(usize, usize, f32)> = Vec::new();
    let mut seen = std::collections::BTreeMap::new();
    for (i, r) in m.iter().enumerate() {
        seen.entry(key(r)).or_insert(i);
    }
    for (_, i) in seen {
        out.push(m[i]);
    }
    out
}

/// Validation statistics accumulated over images exactly like `val_dual.run`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValStats {
    /// Per prediction: true-positive flags at the [`N_IOU`] thresholds.
    pub tp: Vec<[bool; N_IOU]>,
    /// Per prediction: confidence.
    pub conf: Vec<f32>,
    /// Per prediction: predicted class.
    pub pred_cls: Vec<u32>,
    /// Per ground-truth box: class.
    pub target_cls: Vec<u32>,
    /// Images seen.
    pub seen: usize,
    /// The confusion matrix at conf 0.25 / IoU 0.45 ([`super::confusion`]), when asked for with
    /// [`ValStats::with_confusion`].
    pub confusion: Option<super::confusion::ConfusionMatrix>,
}

impl ValStats {
    /// Statistics that also fill a confusion matrix for `nc` classes.
    pub fn with_confusion(nc: usize) -> Self {
        ValStats {
            confusion: Some(super::confusion::ConfusionMatrix::new(nc)),
            ..ValStats::default()
        }
    }

    /// Adds one image: `detections` rows `[x1, y1, x2, y2, conf, cls]` after NMS and `labels` rows
    /// `[cls, x1, y1, x2, y2]`, both in the same pixel space (the official uses original-image pixels).
    /// An image with labels but no detections adds only its target classes; an image with detections
    /// and no labels adds its detections as false positives.
    pub fn add_image(&mut self, detections: &[[f32; 6]], labels: &[[f32; 5]]) {
        self.seen += 1;
        if let Some(cm) = self.confusion.as_mut() {
            cm.process_batch(detections, labels);
        }
        self.target_cls.extend(labels.iter().map(|l| l[0] as u32));
        if detections.is_empty() {
            return;
        }
        self.tp.extend(process_batch(detections, labels));
        self.conf.extend(detections.iter().map(|d| d[4]));
        self.pred_cls.extend(detections.iter().map(|d| d[5] as u32));
    }

    /// Computes the metrics for `nc` classes (the official `run` tail: `ap_per_class` only when at
    /// least one prediction is a true positive at some threshold, otherwise all zero).
    pub fn metrics(&self, nc: usize) -> ValMetrics {
        let mut nt = vec![0usize; nc];
        for &c in &self.target_cls {
            if let Some(n) = nt.get_mut(c as usize) {
                *n += 1;
            }
        }
        let any_tp = self.tp.iter().any(|r| r.iter().any(|&b| b));
        let ap = if any_tp {
            ap_per_class(&self.tp, &self.conf, &self.pred_cls, &self.target_cls)
        } else {
            ApPerClass::default()
        };
        let ap50: Vec<f64> = ap.ap.iter().map(|a| a[0]).collect();
        let ap50_95: Vec<f64> = ap.ap.iter().map(|a| np_sum(a) / N_IOU as f64).collect();
        let mean = |v: &[f64]| {
            if v.is_empty() {
                0.0
            } else {
                np_sum(v) / v.len() as f64
            }
        };
        ValMetrics {
            seen: self.seen,
            nt,
            mp: mean(&ap.p),
            mr: mean(&ap.r),
            map50: mean(&ap50),
            map50_95: mean(&ap50_95),
            ap50,
            ap50_95,
            per_class: ap,
        }
    }
}

/// The official `ap_per_class` outputs, one entry per class present in the targets (sorted).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApPerClass {
    /// Class ids (those with at least one target).
    pub classes: Vec<usize>,
    /// Targets per class.
    pub nt: Vec<usize>,
    /// True positives at the chosen confidence, `round(r · nt)`.
    pub tp: Vec<f64>,
    /// False positives at the chosen confidence, `round(tp / p − tp)`.
    pub fp: Vec<f64>,
    /// Precision at the confidence of maximum smoothed mean F1 (IoU 0.5).
    pub p: Vec<f64>,
    /// Recall at that confidence (IoU 0.5).
    pub r: Vec<f64>,
    /// F1 at that confidence.
    pub f1: Vec<f64>,
    /// AP at each IoU threshold (101-point interpolation).
    pub ap: Vec<[f64; N_IOU]>,
    /// The curves behind these numbers (the official `plot=True` outputs), for the plots.
    pub curves: PrCurves,
}

/// The curves of [`ap_per_class`], one row per class of [`ApPerClass::classes`], each sampled at
/// the 1000 points of `px` (0..=1): precision, recall and F1 against the confidence threshold
/// (IoU 0.5), and the precision envelope against recall (IoU 0.5, the curve whose area is AP50).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrCurves {
    /// The sample points: confidences for `p`, `r`, `f1`; recalls for `pr`.
    pub px: Vec<f64>,
    /// Precision at each confidence.
    pub p: Vec<Vec<f64>>,
    /// Recall at each confidence.
    pub r: Vec<Vec<f64>>,
    /// F1 at each confidence.
    pub f1: Vec<Vec<f64>>,
    /// Precision (envelope) at each recall.
    pub pr: Vec<Vec<f64>>,
}

/// The official `utils.metrics.ap_per_class`.
///
/// Inputs, one entry per prediction: `tp` flags at the [`N_IOU`] thresholds, `conf`, `pred_cls`;
/// and `target_cls`, one entry per ground-truth box. Classes with no target are ignored; a class with
/// targets and no predictions gets zeros. P and R are read off curves sampled at 1000 confidences
/// in 0..1, at the index maximizing the box-filtered (fraction 0.1) class-mean F1.
pub fn ap_per_class(
    tp: &[[bool; N_IOU]],
    conf: &[f32],
    pred_cls: &[u32],
    target_cls: &[u32],
) -> ApPerClass {
    let eps = 1e-16f64;
    // sort by descending confidence (stable)
    let mut order: Vec<usize> = (0..conf.len()).collect();
    order.sort_by(|&a, &b| (-conf[a]).total_cmp(&-conf[b]));

    let mut classes: Vec<u32> = target_cls.to_vec();
    classes.sort_unstable();
    classes.dedup();
    let nt: Vec<usize> = classes
        .iter()
        .map(|c| target_cls.iter().filter(|t| *t == c).count())
        .collect();
    let nc = classes.len();

    let px: Vec<f64> = linspace(0.0, 1.0, 1000);
    let neg_px: Vec<f64> = px.iter().map(|x| -x).collect();
    let mut ap = vec![[0f64; N_IOU]; nc];
    let mut p = vec![vec![0f64; 1000]; nc];
    let mut r = vec![vec![0f64; 1000]; nc];
    let mut pr = vec![vec![0f64; 1000]; nc];
    for (ci, &c) in classes.iter().enumerate() {
        let idx: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&i| pred_cls[i] == c)
            .collect();
        let n_l = nt[ci];
        if idx.is_empty() || n_l == 0 {
            continue;
        }
        let neg_conf: Vec<f64> = idx.iter().map(|&i| -(conf[i] as f64)).collect();
        let mut recall = vec![vec![0f64; idx.len()]; N_IOU];
        let mut precision = vec![vec![0f64; idx.len()]; N_IOU];
        for j in 0..N_IOU {
            let (mut tpc, mut fpc) = (0i64, 0i64);
            for (k, &i) in idx.iter().enumerate() {
                if tp[i][j] {
                    tpc += 1;
                } else {
                    fpc += 1;
                }
                recall[j][k] = tpc as f64 / (n_l as f64 + eps);
                precision[j][k] = tpc as f64 / (tpc + fpc) as f64;
            }
        }
        r[ci] = np_interp(&neg_px, &neg_conf, &recall[0], 0.0);
        p[ci] = np_interp(&neg_px, &neg_conf, &precision[0], 1.0);
        for j in 0..N_IOU {
            let (a, mrec, mpre) = ap_envelope(&recall[j], &precision[j]);
            ap[ci][j] = a;
            if j == 0 {
                pr[ci] = np_interp(&px, &mrec, &mpre, mpre[0]);
            }
        }
    }
    // f1 and its class mean (numpy mean over axis 0: sequential row sums, then divide)
    let f1: Vec<Vec<f64>> = (0..nc)
        .map(|ci| {
            (0..1000)
                .map(|k| 2.0 * p[ci][k] * r[ci][k] / (p[ci][k] + r[ci][k] + eps))
                .collect()
        })
        .collect();
    let mut f1_mean = vec![0f64; 1000];
    for k in 0..1000 {
        let mut s = 0.0;
        for row in &f1 {
            s += row[k];
        }
        f1_mean[k] = s / nc as f64;
    }
    let sm = smooth(&f1_mean, 0.1);
    let mut best = 0;
    for (k, v) in sm.iter().enumerate() {
        if *v > sm[best] {
            best = k;
        }
    }
    let pk: Vec<f64> = p.iter().map(|row| row[best]).collect();
    let rk: Vec<f64> = r.iter().map(|row| row[best]).collect();
    let f1k: Vec<f64> = f1.iter().map(|row| row[best]).collect();
    let tpk: Vec<f64> = rk
        .iter()
        .zip(&nt)
        .map(|(r, &n)| (r * n as f64).round_ties_even())
        .collect();
    let fpk: Vec<f64> = tpk
        .iter()
        .zip(&pk)
        .map(|(t, p)| (t / (p + eps) - t).round_ties_even())
        .collect();
    ApPerClass {
        classes: classes.iter().map(|&c| c as usize).collect(),
        nt,
        tp: tpk,
        fp: fpk,
        p: pk,
        r: rk,
        f1: f1k,
        ap,
        curves: PrCurves { px, p, r, f1, pr },
    }
}

/// The official `compute_ap`: AP of one recall/precision curve (confidence-sorted), with sentinels
/// (recall 0 → precision 1, recall 1 → precision 0), the precision envelope, and the trapezoid rule
/// over the envelope sampled at 101 recall points 0, 0.01, ..., 1.
pub fn compute_ap(recall: &[f64], precision: &[f64]) -> f64 {
    ap_envelope(recall, precision).0
}

/// [`compute_ap`] with the sentinel-extended recall and the precision envelope it integrates (the
/// official `compute_ap` returns all three).
fn ap_envelope(recall: &[f64], precision: &[f64]) -> (f64, Vec<f64>, Vec<f64>) {
    let mut mrec = Vec::with_capacity(recall.len() + 2);
    mrec.push(0.0);
    mrec.extend_from_slice(recall);
    mrec.push(1.0);
    let mut mpre = Vec::with_capacity(precision.len() + 2);
    mpre.push(1.0);
    mpre.extend_from_slice(precision);
    mpre.push(0.0);
    for i in (0..mpre.len() - 1).rev() {
        mpre[i] = mpre[i].max(mpre[i + 1]);
    }
    let x = linspace(0.0, 1.0, 101);
    let y = np_interp(&x, &mrec, &mpre, mpre[0]);
    // np.trapz: add.reduce(diff(x) * (y[1:] + y[:-1]) / 2.0)
    let terms: Vec<f64> = (0..x.len() - 1)
        .map(|i| (x[i + 1] - x[i]) * (y[i + 1] + y[i]) / 2.0)
        .collect();
    (np_sum(&terms), mrec, mpre)
}

/// The official `smooth`: box filter of fraction `f` (odd width `round(len·f·2)//2 + 1`), edges padded
/// with the end values, `valid` convolution (same length as `y`).
pub fn smooth(y: &[f64], f: f64) -> Vec<f64> {
    if y.is_empty() {
        return Vec::new();
    }
    let nf = ((y.len() as f64 * f * 2.0).round_ties_even() as usize) / 2 + 1;
    let pad = nf / 2;
    let mut yp = vec![y[0]; pad];
    yp.extend_from_slice(y);
    yp.extend(std::iter::repeat_n(y[y.len() - 1], pad));
    let w = 1.0 / nf as f64;
    (0..yp.len() + 1 - nf)
        .map(|i| {
            let mut s = 0.0;
            for v in &yp[i..i + nf] {
                s += v * w;
            }
            s
        })
        .collect()
}

/// numpy `linspace(start, stop, n)`: `start + i·step`, last element exactly `stop`.
fn linspace(start: f64, stop: f64, n: usize) -> Vec<f64> {
    let step = (stop - start) / (n - 1) as f64;
    let mut v: Vec<f64> = (0..n).map(|i| i as f64 * step + start).collect();
    v[n - 1] = stop;
    v
}

/// numpy `interp(x, xp, fp, left=left)` (right = last fp) for non-decreasing `xp`: exact hits take
/// the last equal `xp`'s value, otherwise linear `slope·(x − xp[j]) + fp[j]`.
fn np_interp(x: &[f64], xp: &[f64], fp: &[f64], left: f64) -> Vec<f64> {
    let n = xp.len();
    let right = fp[n - 1];
    x.iter()
        .map(|&v| {
            if v > xp[n - 1] {
                return right;
            }
            if v < xp[0] {
                return left;
            }
            // largest j with xp[j] <= v
            let j = xp.partition_point(|&a| a <= v) - 1;
            if j == n - 1 || xp[j] == v {
                return fp[j];
            }
            let slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]);
            slope * (v - xp[j]) + fp[j]
        })
        .collect()
}

/// numpy's pairwise summation of a contiguous f64 array (`add.reduce`), identity 0.
pub fn np_sum(a: &[f64]) -> f64 {
    0.0 + pairwise(a)
}

fn pairwise(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        let mut res = -0.0;
        for v in a {
            res += v;
        }
        res
    } else if n <= 128 {
        let mut r = [0f64; 8];
        r.copy_from_slice(&a[..8]);
        let mut i = 8;
        while i < n - n % 8 {
            for k in 0..8 {
                r[k] += a[i + k];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        while i < n {
            res += a[i];
            i += 1;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise(&a[..n2]) + pairwise(&a[n2..])
    }
}

/// The validation summary: `ap_per_class` plus the means the official prints.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValMetrics {
    /// Images seen.
    pub seen: usize,
    /// Targets per class id (`np.bincount`, `nc` entries).
    pub nt: Vec<usize>,
    /// Mean precision over classes with targets.
    pub mp: f64,
    /// Mean recall.
    pub mr: f64,
    /// mAP at IoU 0.5.
    pub map50: f64,
    /// mAP averaged over IoU 0.50:0.95.
    pub map50_95: f64,
    /// AP at IoU 0.5 per class of `per_class.classes`.
    pub ap50: Vec<f64>,
    /// AP 0.50:0.95 per class of `per_class.classes`.
    pub ap50_95: Vec<f64>,
    /// The per-class details.
    pub per_class: ApPerClass,
}

impl ValMetrics {
    /// The official model fitness: `0.1·mAP50 + 0.9·mAP50-95` (P and R weigh 0).
    pub fn fitness(&self) -> f64 {
        fitness(self.map50, self.map50_95)
    }

    /// The official table: header `Class Images Instances P R mAP50 mAP50-95`, row `all`, then one row
    /// per class with targets (only when more than one class exists), numbers as `%11.3g`.
    /// `names[i]` is the name of class id `i`.
    pub fn table(&self, names: &[String]) -> String {
        let mut s = format!(
            "{:>22}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}\n",
            "Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95"
        );
        let total: usize = self.nt.iter().sum();
        let row = |s: &mut String, name: &str, n: usize, p: f64, r: f64, a50: f64, a: f64| {
            let _ = writeln!(
                s,
                "{:>22}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}",
                name,
                self.seen,
                n,
                fmt_g3(p),
                fmt_g3(r),
                fmt_g3(a50),
                fmt_g3(a)
            );
        };
        row(
            &mut s,
            "all",
            total,
            self.mp,
            self.mr,
            self.map50,
            self.map50_95,
        );
        if self.nt.len() > 1 {
            let pc = &self.per_class;
            for (i, &c) in pc.classes.iter().enumerate() {
                let name = names.get(c).cloned().unwrap_or_else(|| c.to_string());
                let n = self.nt.get(c).copied().unwrap_or(0);
                row(
                    &mut s,
                    &name,
                    n,
                    pc.p[i],
                    pc.r[i],
                    self.ap50[i],
                    self.ap50_95[i],
                );
            }
        }
        s
    }
}

/// The official `fitness`: `0.1·mAP50 + 0.9·mAP50-95`.
pub fn fitness(map50: f64, map50_95: f64) -> f64 {
    0.1 * map50 + 0.9 * map50_95
}

/// C's `%.3g`: 3 significant digits, trailing zeros removed, exponent form below 1e-4 or from 1e3.
pub fn fmt_g3(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v == 0.0 {
            "0".to_string()
        } else {
            format!("{v}")
        };
    }
    let e = format!("{v:.2e}");
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..3).contains(&exp) {
        let m = mant.trim_end_matches('0').trim_end_matches('.');
        return format!("{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    let decimals = (2 - exp).max(0) as usize;
    let f = format!("{v:.decimals$}");
    if f.contains('.') {
        f.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        f
    }
}
