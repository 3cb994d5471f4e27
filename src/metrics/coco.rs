//! COCO bbox evaluation with the semantics of pycocotools `COCOeval(iouType='bbox')`:
//! `evaluate()` (per image and category: `computeIoU`, `evaluateImg`), `accumulate()` and
//! `summarize()`, written from the documented algorithm.
//!
//! Inputs are plain structs: ground truth [`CocoGt`] and detections [`CocoDt`], boxes
//! `[x, y, w, h]` in pixels (top-left corner, width, height). The parameters are pycocotools'
//! defaults for `bbox` ([`CocoParams::default`]): IoU thresholds 0.50:0.05:0.95, 101 recall
//! thresholds, `maxDets` [1, 10, 100], area ranges all / small (< 32²) / medium / large (> 96²).
//!
//! Semantics kept on purpose (they change numbers):
//! - detections of one (image, category) are ordered by decreasing score with a stable sort
//!   (pycocotools `np.argsort(-scores, kind='mergesort')`) and cut to `maxDets[-1]` = 100 per
//!   image **and category**;
//! - GT area for the area ranges is the GT's `area` field; a detection's area is `w · h`
//!   (pycocotools `loadRes`); both bounds of a range are inclusive;
//! - crowd GTs are ignored GTs that can match many detections, and their IoU divides the
//!   intersection by the detection's area (`maskUtils.iou` with `iscrowd`);
//! - matching is greedy per IoU threshold, GTs ordered so ignored ones come last, a detection
//!   takes the unmatched GT of highest IoU ≥ the threshold, and stops at the first ignored GT
//!   once it holds a regular one;
//! - precision is made monotone right to left and read at the 101 recall thresholds by
//!   `searchsorted(side='left')`; thresholds past the last recall reached read 0;
//! - a category without any non-ignored GT in an area range is -1 there and left out of the
//!   means; a mean over nothing is -1.
//!
//! One representational difference that changes no number for ids ≥ 1: pycocotools records a
//! match as the matched annotation's `id` and tests it against 0, so a GT annotation with id 0
//! would look unmatched there; here matches are booleans.
//!
//! Why one file (about 590 lines of code, then its unit tests): it follows pycocotools' `COCOeval`
//! method by method (`computeIoU`, `evaluateImg`, `accumulate`, `summarize`), which is easiest to
//! check against the original when read in one place.

use anyhow::{bail, Result};
use std::collections::{BTreeMap, BTreeSet};

/// One ground-truth box (a COCO annotation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CocoGt {
    /// Image id (must be one of the evaluated images).
    pub image_id: u64,
    /// Category id; annotations of a category outside the evaluated ones are dropped, as
    /// pycocotools `_prepare` does.
    pub category_id: u64,
    /// `[x, y, w, h]` in pixels.
    pub bbox: [f64; 4],
    /// The annotation's `area` field in pixels² (selects the area range; not recomputed).
    pub area: f64,
    /// Crowd region (`iscrowd: 1`): ignored, may match several detections.
    pub iscrowd: bool,
}

/// One detection (a COCO results entry).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CocoDt {
    /// Image id (must be one of the evaluated images, as pycocotools `loadRes` asserts).
    pub image_id: u64,
    /// Category id; detections of a category outside the evaluated ones are dropped.
    pub category_id: u64,
    /// `[x, y, w, h]` in pixels.
    pub bbox: [f64; 4],
    /// Confidence.
    pub score: f64,
}

/// The evaluation parameters (pycocotools `Params` for `iouType='bbox'`).
#[derive(Debug, Clone, PartialEq)]
pub struct CocoParams {
    /// IoU thresholds, `np.linspace(.5, .95, 10)` bit for bit.
    pub iou_thrs: Vec<f64>,
    /// Recall thresholds, `np.linspace(0, 1, 101)` bit for bit.
    pub rec_thrs: Vec<f64>,
    /// Maximum detections per image and category, increasing; the last one also cuts
    /// the detections before matching.
    pub max_dets: Vec<usize>,
    /// Area ranges `[lo, hi]` in pixels² (inclusive), with their labels.
    pub area_rngs: Vec<([f64; 2], &'static str)>,
}

/// `np.linspace(start, stop, num)` (endpoint included) with numpy's arithmetic:
/// `i · ((stop − start) / (num − 1)) + start`, the last element set to `stop`.
fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    let step = (stop - start) / (num - 1) as f64;
    let mut v: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    if let Some(last) = v.last_mut() {
        *last = stop;
    }
    v
}

impl Default for CocoParams {
    fn default() -> Self {
        CocoParams {
            iou_thrs: linspace(0.5, 0.95, 10),
            rec_thrs: linspace(0.0, 1.0, 101),
            max_dets: vec![1, 10, 100],
            area_rngs: vec![
                ([0.0, 1e10], "all"),
                ([0.0, 1024.0], "small"),
                ([1024.0, 9216.0], "medium"),
                ([9216.0, 1e10], "large"),
            ],
        }
    }
}

/// The result of [`evaluate`]: pycocotools `eval['precision']`, `eval['recall']` and `stats`.
#[derive(Debug, Clone)]
pub struct CocoEval {
    /// The parameters used.
    pub params: CocoParams,
    /// The evaluated image ids, sorted.
    pub image_ids: Vec<u64>,
    /// The evaluated category ids, sorted (index `k` below).
    pub category_ids: Vec<u64>,
    /// Precision `[T][R][K][A][M]` flattened row-major (T IoU thresholds, R recall
    /// thresholds, K categories, A area ranges, M maxDets); -1 where a category has no
    /// non-ignored GT.
    pub precision: Vec<f64>,
    /// Recall `[T][K][A][M]` flattened row-major; -1 as for precision.
    pub recall: Vec<f64>,
    /// The 12 `summarize()` numbers: AP, AP50, AP75, AP small/medium/large (maxDets 100),
    /// AR at maxDets 1/10/100, AR small/medium/large (maxDets 100).
    pub stats: [f64; 12],
}

/// One image's GTs (input order), detections (by decreasing score, cut to `maxDets[-1]`) and
/// their IoU matrix `[D][G]` for one category (pycocotools `computeIoU`).
type PerImage<'a> = (Vec<&'a CocoGt>, Vec<&'a CocoDt>, Vec<Vec<f64>>);

/// Per (image, category) result of the matching (pycocotools `evaluateImg` at `maxDets[-1]`).
struct ImgEval {
    /// Scores of the kept detections, by decreasing score.
    scores: Vec<f64>,
    /// `[T][D]`: matched to a GT.
    matched: Vec<Vec<bool>>,
    /// `[T][D]`: ignored (matched to an ignored GT, or unmatched and outside the area range).
    ignored: Vec<Vec<bool>>,
    /// `[G]`: GT ignored (crowd or outside the area range).
    gt_ignored: Vec<bool>,
}

/// Evaluates detections `dts` against ground truth `gts` over `image_ids` and `category_ids`
/// (pycocotools `COCOeval(gt, gt.loadRes(dt), 'bbox')` with `params.imgIds` = every image of
/// the GT file and `params.catIds` = every category; both lists are sorted and deduplicated
/// here) with the default [`CocoParams`].
///
/// Errors: a detection on an image not in `image_ids` (pycocotools: "Results do not correspond
/// to current coco set"), or a non-finite box, area or score.
pub fn evaluate(
    image_ids: &[u64],
    category_ids: &[u64],
    gts: &[CocoGt],
    dts: &[CocoDt],
) -> Result<CocoEval> {
    evaluate_with(image_ids, category_ids, gts, dts, CocoParams::default())
}

/// [`evaluate`] with explicit parameters. `params.max_dets` must be non-empty and increasing,
/// `params.iou_thrs` and `params.area_rngs` non-empty.
pub fn evaluate_with(
    image_ids: &[u64],
    category_ids: &[u64],
    gts: &[CocoGt],
    dts: &[CocoDt],
    params: CocoParams,
) -> Result<CocoEval> {
    if params.max_dets.is_empty() || params.iou_thrs.is_empty() || params.area_rngs.is_empty() {
        bail!("COCO evaluation: empty maxDets, IoU thresholds or area ranges");
    }
    if params.max_dets.windows(2).any(|w| w[0] > w[1]) {
        bail!(
            "COCO evaluation: maxDets {:?} must be increasing",
            params.max_dets
        );
    }
    let imgs: Vec<u64> = image_ids
        .iter()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let cats: Vec<u64> = category_ids
        .iter()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let img_set: BTreeSet<u64> = imgs.iter().copied().collect();
    let cat_set: BTreeSet<u64> = cats.iter().copied().collect();
    for (n, g) in gts.iter().enumerate() {
        if !g.bbox.iter().all(|v| v.is_finite()) || !g.area.is_finite() {
            bail!(
                "COCO evaluation: ground truth {n} (image {}): bbox {:?} / area {} is not finite",
                g.image_id,
                g.bbox,
                g.area
            );
        }
    }
    for (n, d) in dts.iter().enumerate() {
        if !img_set.contains(&d.image_id) {
            bail!(
                "COCO evaluation: detection {n} has image_id {}, which is not an image of the \
                 ground truth (results do not correspond to the ground-truth set)",
                d.image_id
            );
        }
        if !d.bbox.iter().all(|v| v.is_finite()) || !d.score.is_finite() {
            bail!(
                "COCO evaluation: detection {n} (image {}): bbox {:?} / score {} is not finite",
                d.image_id,
                d.bbox,
                d.score
            );
        }
    }
    // `_prepare`: group by (image, category), in input order, dropping unknown ids.
    let mut g_by: BTreeMap<(u64, u64), Vec<&CocoGt>> = BTreeMap::new();
    for g in gts {
        if img_set.contains(&g.image_id) && cat_set.contains(&g.category_id) {
            g_by.entry((g.image_id, g.category_id)).or_default().push(g);
        }
    }
    let mut d_by: BTreeMap<(u64, u64), Vec<&CocoDt>> = BTreeMap::new();
    for d in dts {
        if cat_set.contains(&d.category_id) {
            d_by.entry((d.image_id, d.category_id)).or_default().push(d);
        }
    }
    let max_det = *params.max_dets.last().unwrap_or(&100);
    let (t_n, r_n, k_n, a_n, m_n) = (
        params.iou_thrs.len(),
        params.rec_thrs.len(),
        cats.len(),
        params.area_rngs.len(),
        params.max_dets.len(),
    );
    let mut precision = vec![-1.0; t_n * r_n * k_n * a_n * m_n];
    let mut recall = vec![-1.0; t_n * k_n * a_n * m_n];
    let empty_g: Vec<&CocoGt> = Vec::new();
    let empty_d: Vec<&CocoDt> = Vec::new();
    for (k, &cat) in cats.iter().enumerate() {
        // `computeIoU` per image: detections by decreasing score (stable), cut to max_det.
        let per_image: Vec<PerImage> = imgs
            .iter()
            .map(|&img| {
                let g = g_by.get(&(img, cat)).unwrap_or(&empty_g).clone();
                let mut d = d_by.get(&(img, cat)).unwrap_or(&empty_d).clone();
                d.sort_by(|a, b| b.score.total_cmp(&a.score));
                d.truncate(max_det);
                let ious = d
                    .iter()
                    .map(|dd| {
                        g.iter()
                            .map(|gg| crate::boxes::coco_iou(&dd.bbox, &gg.bbox, gg.iscrowd))
                            .collect()
                    })
                    .collect();
                (g, d, ious)
            })
            .collect();
        for (a, (rng, _)) in params.area_rngs.iter().enumerate() {
            let evals: Vec<ImgEval> = per_image
                .iter()
                .filter_map(|(g, d, ious)| evaluate_img(g, d, ious, *rng, &params.iou_thrs))
                .collect();
            for (m, &md) in params.max_dets.iter().enumerate() {
                let rec = accumulate_one(&evals, md, &params, |t, r, p| {
                    let at = (((t * r_n + r) * k_n + k) * a_n + a) * m_n + m;
                    precision[at] = p;
                });
                if let Some(rec) = rec {
                    for (t, v) in rec.into_iter().enumerate() {
                        recall[((t * k_n + k) * a_n + a) * m_n + m] = v;
                    }
                }
            }
        }
    }
    let mut ev = CocoEval {
        params,
        image_ids: imgs,
        category_ids: cats,
        precision,
        recall,
        stats: [-1.0; 12],
    };
    ev.stats = ev.summarize_stats();
    Ok(ev)
}

/// pycocotools `evaluateImg` for one (image, category) and area range at `maxDets[-1]`:
/// `g` in input order, `d` already sorted and cut, `ious[d][g]`. `None` when both are empty.
fn evaluate_img(
    g: &[&CocoGt],
    d: &[&CocoDt],
    ious: &[Vec<f64>],
    rng: [f64; 2],
    iou_thrs: &[f64],
) -> Option<ImgEval> {
    if g.is_empty() && d.is_empty() {
        return None;
    }
    let outside = |area: f64| area < rng[0] || area > rng[1];
    let g_ign: Vec<bool> = g.iter().map(|x| x.iscrowd || outside(x.area)).collect();
    // Regular GTs first, then ignored ones, each in input order (stable argsort of 0/1).
    let order: Vec<usize> = (0..g.len())
        .filter(|&i| !g_ign[i])
        .chain((0..g.len()).filter(|&i| g_ign[i]))
        .collect();
    let gt_ignored: Vec<bool> = order.iter().map(|&i| g_ign[i]).collect();
    let crowd: Vec<bool> = order.iter().map(|&i| g[i].iscrowd).collect();
    let t_n = iou_thrs.len();
    let mut matched = vec![vec![false; d.len()]; t_n];
    let mut ignored = vec![vec![false; d.len()]; t_n];
    if !g.is_empty() && !d.is_empty() {
        for (t, &thr) in iou_thrs.iter().enumerate() {
            let mut gt_taken = vec![false; g.len()];
            for di in 0..d.len() {
                let mut best = thr.min(1.0 - 1e-10);
                let mut m: Option<usize> = None;
                for (gi, &go) in order.iter().enumerate() {
                    if gt_taken[gi] && !crowd[gi] {
                        continue;
                    }
                    if let Some(mi) = m {
                        if !gt_ignored[mi] && gt_ignored[gi] {
                            break;
                        }
                    }
                    let iou = ious[di][go];
                    if iou < best {
                        continue;
                    }
                    best = iou;
                    m = Some(gi);
                }
                if let Some(mi) = m {
                    ignored[t][di] = gt_ignored[mi];
                    matched[t][di] = true;
                    gt_taken[mi] = true;
                }
            }
        }
    }
    // Unmatched detections outside the area range are ignored.
    for (di, dd) in d.iter().enumerate() {
        if outside(dd.bbox[2] * dd.bbox[3]) {
            for t in 0..t_n {
                if !matched[t][di] {
                    ignored[t][di] = true;
                }
            }
        }
    }
    Some(ImgEval {
        scores: d.iter().map(|x| x.score).collect(),
        matched,
        ignored,
        gt_ignored,
    })
}

/// pycocotools `accumulate` for one category, area range and `max_det`: calls `put(t, r, p)`
/// for every precision value and returns the recall per IoU threshold, or `None` (values stay
/// -1) when there is no image result or no non-ignored GT.
fn accumulate_one(
    evals: &[ImgEval],
    max_det: usize,
    params: &CocoParams,
    mut put: impl FnMut(usize, usize, f64),
) -> Option<Vec<f64>> {
    if evals.is_empty() {
        return None;
    }
    let npig = evals
        .iter()
        .flat_map(|e| e.gt_ignored.iter())
        .filter(|&&x| !x)
        .count();
    if npig == 0 {
        return None;
    }
    // Detections of all images (image order, each cut to max_det), by decreasing score, stable.
    let mut all: Vec<(usize, usize)> = evals
        .iter()
        .enumerate()
        .flat_map(|(e, ev)| (0..ev.scores.len().min(max_det)).map(move |d| (e, d)))
        .collect();
    all.sort_by(|&(e1, d1), &(e2, d2)| evals[e2].scores[d2].total_cmp(&evals[e1].scores[d1]));
    let mut rec = Vec::with_capacity(params.iou_thrs.len());
    for t in 0..params.iou_thrs.len() {
        let (mut tp, mut fp) = (0usize, 0usize);
        let mut rc = Vec::with_capacity(all.len());
        let mut pr = Vec::with_capacity(all.len());
        for &(e, d) in &all {
            let ev = &evals[e];
            if !ev.ignored[t][d] {
                if ev.matched[t][d] {
                    tp += 1;
                } else {
                    fp += 1;
                }
            }
            let (tpf, fpf) = (tp as f64, fp as f64);
            rc.push(tpf / npig as f64);
            pr.push(tpf / (fpf + tpf + f64::EPSILON));
        }
        rec.push(rc.last().copied().unwrap_or(0.0));
        for i in (1..pr.len()).rev() {
            if pr[i] > pr[i - 1] {
                pr[i - 1] = pr[i];
            }
        }
        // searchsorted(rc, recThrs, side='left'); values past the end stay 0.
        for (r, &thr) in params.rec_thrs.iter().enumerate() {
            let i = rc.partition_point(|&x| x < thr);
            put(t, r, pr.get(i).copied().unwrap_or(0.0));
        }
    }
    Some(rec)
}

impl CocoEval {
    fn index_of_area(&self, label: &str) -> Option<usize> {
        self.params.area_rngs.iter().position(|(_, l)| *l == label)
    }

    fn index_of_max_det(&self, md: usize) -> Option<usize> {
        self.params.max_dets.iter().position(|&m| m == md)
    }

    /// pycocotools `_summarize`: the mean of the precision (`ap`) or recall values > -1 at
    /// IoU threshold `iou` (exact match, as `np.where(iouThr == p.iouThrs)`; all thresholds
    /// when `None`), area range `area` and `max_dets`; -1 when there is none.
    pub fn summarize_one(&self, ap: bool, iou: Option<f64>, area: &str, max_dets: usize) -> f64 {
        let (Some(a), Some(m)) = (self.index_of_area(area), self.index_of_max_det(max_dets)) else {
            return -1.0;
        };
        let p = &self.params;
        let (r_n, k_n, a_n, m_n) = (
            p.rec_thrs.len(),
            self.category_ids.len(),
            p.area_rngs.len(),
            p.max_dets.len(),
        );
        let (mut sum, mut n) = (0.0, 0usize);
        for (t, &thr) in p.iou_thrs.iter().enumerate() {
            if iou.is_some_and(|x| x != thr) {
                continue;
            }
            for k in 0..k_n {
                let vals: Box<dyn Iterator<Item = f64>> = if ap {
                    Box::new((0..r_n).map(move |r| {
                        self.precision[(((t * r_n + r) * k_n + k) * a_n + a) * m_n + m]
                    }))
                } else {
                    Box::new(std::iter::once(
                        self.recall[((t * k_n + k) * a_n + a) * m_n + m],
                    ))
                };
                for v in vals.filter(|&v| v > -1.0) {
                    sum += v;
                    n += 1;
                }
            }
        }
        if n == 0 {
            -1.0
        } else {
            sum / n as f64
        }
    }

    /// The 12 `stats` of pycocotools `summarizeDets`.
    fn summarize_stats(&self) -> [f64; 12] {
        let md = *self.params.max_dets.last().unwrap_or(&100);
        let m0 = self.params.max_dets.first().copied().unwrap_or(1);
        let m1 = self.params.max_dets.get(1).copied().unwrap_or(md);
        [
            self.summarize_one(true, None, "all", md),
            self.summarize_one(true, Some(0.5), "all", md),
            self.summarize_one(true, Some(0.75), "all", md),
            self.summarize_one(true, None, "small", md),
            self.summarize_one(true, None, "medium", md),
            self.summarize_one(true, None, "large", md),
            self.summarize_one(false, None, "all", m0),
            self.summarize_one(false, None, "all", m1),
            self.summarize_one(false, None, "all", md),
            self.summarize_one(false, None, "small", md),
            self.summarize_one(false, None, "medium", md),
            self.summarize_one(false, None, "large", md),
        ]
    }

    /// AP of category index `k` (into [`CocoEval::category_ids`]) at area `all` and the last
    /// maxDets: the mean of its precision values > -1 over every IoU threshold (`iou = None`)
    /// or one (`Some(0.5)` for AP50), as scripts read `eval['precision'][:, :, k, 0, -1]`;
    /// -1 when the category has no GT.
    pub fn class_ap(&self, k: usize, iou: Option<f64>) -> f64 {
        let p = &self.params;
        let (r_n, k_n, a_n, m_n) = (
            p.rec_thrs.len(),
            self.category_ids.len(),
            p.area_rngs.len(),
            p.max_dets.len(),
        );
        if k >= k_n {
            return -1.0;
        }
        let m = m_n - 1;
        let (mut sum, mut n) = (0.0, 0usize);
        for (t, &thr) in p.iou_thrs.iter().enumerate() {
            if iou.is_some_and(|x| x != thr) {
                continue;
            }
            for r in 0..r_n {
                let v = self.precision[(((t * r_n + r) * k_n + k) * a_n) * m_n + m];
                if v > -1.0 {
                    sum += v;
                    n += 1;
                }
            }
        }
        if n == 0 {
            -1.0
        } else {
            sum / n as f64
        }
    }

    /// The 12 lines pycocotools `summarize()` prints, e.g.
    /// ` Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ] = 0.196`.
    pub fn summary_lines(&self) -> Vec<String> {
        let p = &self.params;
        let md = *p.max_dets.last().unwrap_or(&100);
        let m0 = p.max_dets.first().copied().unwrap_or(1);
        let m1 = p.max_dets.get(1).copied().unwrap_or(md);
        let all_iou = format!(
            "{:0.2}:{:0.2}",
            p.iou_thrs.first().copied().unwrap_or(0.5),
            p.iou_thrs.last().copied().unwrap_or(0.95)
        );
        let rows: [(bool, Option<f64>, &str, usize); 12] = [
            (true, None, "all", md),
            (true, Some(0.5), "all", md),
            (true, Some(0.75), "all", md),
            (true, None, "small", md),
            (true, None, "medium", md),
            (true, None, "large", md),
            (false, None, "all", m0),
            (false, None, "all", m1),
            (false, None, "all", md),
            (false, None, "small", md),
            (false, None, "medium", md),
            (false, None, "large", md),
        ];
        rows.iter()
            .zip(self.stats)
            .map(|(&(ap, iou, area, m), v)| {
                let (title, ty) = if ap {
                    ("Average Precision", "(AP)")
                } else {
                    ("Average Recall", "(AR)")
                };
                let iou_s = iou.map_or(all_iou.clone(), |x| format!("{x:0.2}"));
                format!(" {title:<18} {ty} @[ IoU={iou_s:<9} | area={area:>6} | maxDets={m:>3} ] = {v:0.3}")
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_as_numpy() {
        let p = CocoParams::default();
        assert_eq!(p.iou_thrs.len(), 10);
        assert_eq!(p.iou_thrs[0], 0.5);
        // `np.where(0.75 == p.iouThrs)` finds index 5 in pycocotools.
        assert_eq!(p.iou_thrs[5], 0.75);
        assert_eq!(p.iou_thrs[9], 0.95);
        assert_eq!(p.rec_thrs.len(), 101);
        assert_eq!(p.rec_thrs[100], 1.0);
        assert_eq!(p.rec_thrs[1], 0.01);
        assert_eq!(p.rec_thrs[50], 0.5);
    }

    #[test]
    fn crowd_iou_uses_detection_area() {
        let g = [0.0, 0.0, 10.0, 10.0];
        let d = [5.0, 0.0, 10.0, 10.0];
        assert_eq!(crate::boxes::coco_iou(&d, &g, false), 50.0 / 150.0);
        assert_eq!(crate::boxes::coco_iou(&d, &g, true), 0.5);
        assert_eq!(
            crate::boxes::coco_iou(&[20.0, 0.0, 1.0, 1.0], &g, false),
            0.0
        );
    }
}
