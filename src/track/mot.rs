//! MOT metrics of tracks against ground truth: CLEAR MOT (MOTA, ID switches; Bernardin &
//! Stiefelhagen 2008) and the identity metrics IDF1/IDP/IDR (Ristani et al. 2016), with the
//! conventions of py-motmetrics' `MOTAccumulator` and `iou_matrix(max_iou=0.5)`.
//!
//! Per frame: a ground-truth object and a hypothesis can match when their IoU (plain, no +1) is
//! at least `min_iou` (0.5). Pairs matched on the previous frame are kept while still allowed;
//! the rest are matched by the assignment with the most pairs, then the least total `1 − IoU`.
//! A match of an object to another hypothesis than the one it was last matched to is an ID
//! switch. Unmatched objects are misses, unmatched hypotheses false positives.
//! `MOTA = 1 − (misses + false positives + switches) / objects`.
//!
//! IDF1: the one-to-one assignment of whole ground-truth trajectories to whole hypothesis
//! trajectories that maximises the frames where the pair is allowed (IDTP);
//! `IDF1 = 2·IDTP / (objects + hypotheses)`, `IDP = IDTP / hypotheses`, `IDR = IDTP / objects`
//! (counts of boxes over all frames).

use super::assign::linear_assignment;
use pathfinding::kuhn_munkres::kuhn_munkres;
use pathfinding::matrix::Matrix;
use std::collections::HashMap;

/// The summary of an [`Accumulator`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MotSummary {
    /// Frames given.
    pub frames: u64,
    /// Ground-truth boxes over all frames.
    pub objects: u64,
    /// Hypothesis (track) boxes over all frames.
    pub hypotheses: u64,
    /// Matched pairs, ID switches included (motmetrics' `num_matches + num_switches`).
    pub matches: u64,
    /// Ground-truth boxes left unmatched.
    pub misses: u64,
    /// Hypothesis boxes left unmatched.
    pub false_positives: u64,
    /// ID switches.
    pub id_switches: u64,
    /// `1 − (misses + false_positives + id_switches) / objects` (NaN without objects).
    pub mota: f64,
    /// Boxes of the identity assignment's pairs that match (IDTP).
    pub idtp: u64,
    /// `2·IDTP / (objects + hypotheses)` (NaN when both are 0).
    pub idf1: f64,
    /// `IDTP / hypotheses`.
    pub idp: f64,
    /// `IDTP / objects`.
    pub idr: f64,
}

/// Accumulates frames of ground truth and hypotheses (`(id, [x1, y1, x2, y2])`, any common
/// unit) and computes [`MotSummary`].
#[derive(Debug, Clone)]
pub struct Accumulator {
    min_iou: f64,
    /// Object → hypothesis matched on the previous frame.
    prev: HashMap<u64, u64>,
    /// Object → hypothesis it was last matched to (any earlier frame).
    last: HashMap<u64, u64>,
    /// (object, hypothesis) → frames where their IoU allowed a match.
    pairs: HashMap<(u64, u64), u64>,
    s: MotSummary,
}

impl Default for Accumulator {
    fn default() -> Self {
        Self::new(0.5)
    }
}

impl Accumulator {
    /// An empty accumulator; a pair can match when `IoU >= min_iou`.
    pub fn new(min_iou: f64) -> Self {
        Self {
            min_iou,
            prev: HashMap::new(),
            last: HashMap::new(),
            pairs: HashMap::new(),
            s: MotSummary::default(),
        }
    }

    /// Adds one frame: `gt` and `hyp` as `(id, box)`; IDs unique within each side of a frame.
    pub fn update(&mut self, gt: &[(u64, [f32; 4])], hyp: &[(u64, [f32; 4])]) {
        let s = &mut self.s;
        s.frames += 1;
        s.objects += gt.len() as u64;
        s.hypotheses += hyp.len() as u64;
        let ok: Vec<Vec<Option<f64>>> = gt
            .iter()
            .map(|(_, g)| {
                hyp.iter()
                    .map(|(_, h)| {
                        let v = crate::boxes::iou_f64(g, h);
                        (v >= self.min_iou).then_some(1.0 - v)
                    })
                    .collect()
            })
            .collect();
        for (i, (o, _)) in gt.iter().enumerate() {
            for (j, (h, _)) in hyp.iter().enumerate() {
                if ok[i][j].is_some() {
                    *self.pairs.entry((*o, *h)).or_default() += 1;
                }
            }
        }
        let mut gt_used = vec![false; gt.len()];
        let mut hyp_used = vec![false; hyp.len()];
        let mut matched: Vec<(usize, usize)> = Vec::new();
        // 1. Keep the previous frame's pairs that are still allowed.
        for (i, (o, _)) in gt.iter().enumerate() {
            if let Some(&hp) = self.prev.get(o) {
                if let Some(j) = hyp.iter().position(|(h, _)| *h == hp) {
                    if ok[i][j].is_some() && !hyp_used[j] {
                        gt_used[i] = true;
                        hyp_used[j] = true;
                        matched.push((i, j));
                    }
                }
            }
        }
        // 2. The rest: most pairs, then least total distance.
        let rows: Vec<usize> = (0..gt.len()).filter(|&i| !gt_used[i]).collect();
        let cols: Vec<usize> = (0..hyp.len()).filter(|&j| !hyp_used[j]).collect();
        let mut cost = Vec::with_capacity(rows.len() * cols.len());
        for &i in &rows {
            for &j in &cols {
                cost.push(ok[i][j].unwrap_or(f64::NAN));
            }
        }
        // With weights (n + 1) − d, d in 0..=1, one more pair always outweighs any distances.
        let n = rows.len().min(cols.len()) as f64;
        let mut switches = Vec::new();
        for (a, b) in linear_assignment(&cost, rows.len(), cols.len(), n + 1.0) {
            let (i, j) = (rows[a], cols[b]);
            if self.last.get(&gt[i].0).is_some_and(|&h| h != hyp[j].0) {
                switches.push(i);
            }
            gt_used[i] = true;
            hyp_used[j] = true;
            matched.push((i, j));
        }
        let s = &mut self.s;
        s.id_switches += switches.len() as u64;
        s.matches += matched.len() as u64;
        s.misses += gt_used.iter().filter(|u| !**u).count() as u64;
        s.false_positives += hyp_used.iter().filter(|u| !**u).count() as u64;
        self.prev.clear();
        for (i, j) in matched {
            self.prev.insert(gt[i].0, hyp[j].0);
            self.last.insert(gt[i].0, hyp[j].0);
        }
    }

    /// The metrics so far.
    pub fn summary(&self) -> MotSummary {
        let mut s = self.s;
        s.mota = 1.0 - (s.misses + s.false_positives + s.id_switches) as f64 / s.objects as f64;
        // The identity assignment over whole trajectories.
        let mut gts: Vec<u64> = self.pairs.keys().map(|k| k.0).collect();
        let mut hyps: Vec<u64> = self.pairs.keys().map(|k| k.1).collect();
        gts.sort_unstable();
        gts.dedup();
        hyps.sort_unstable();
        hyps.dedup();
        let n = gts.len().max(hyps.len());
        if n > 0 {
            let m = Matrix::from_fn(n, n, |(r, c)| match (gts.get(r), hyps.get(c)) {
                (Some(g), Some(h)) => self.pairs.get(&(*g, *h)).copied().unwrap_or(0) as i64,
                _ => 0,
            });
            s.idtp = kuhn_munkres(&m).0 as u64;
        }
        let (o, h, tp) = (s.objects as f64, s.hypotheses as f64, s.idtp as f64);
        s.idf1 = 2.0 * tp / (o + h);
        s.idp = tp / h;
        s.idr = tp / o;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(x: f32) -> [f32; 4] {
        [x, 0.0, x + 10.0, 10.0]
    }

    #[test]
    fn perfect_tracks() {
        let mut acc = Accumulator::default();
        for f in 0..5 {
            let x = f as f32;
            acc.update(
                &[(1, b(x)), (2, b(50.0 + x))],
                &[(7, b(x)), (9, b(50.0 + x))],
            );
        }
        let s = acc.summary();
        assert_eq!(
            (s.matches, s.misses, s.false_positives, s.id_switches),
            (10, 0, 0, 0)
        );
        assert_eq!(s.mota, 1.0);
        assert_eq!(s.idf1, 1.0);
    }

    #[test]
    fn one_switch_by_hand() {
        // Object 1 is track 7 for 3 frames, then track 8 for 2 frames: 1 switch;
        // MOTA = 1 − 1/5; IDTP = 3 (1↔7) → IDF1 = 6 / 10.
        let mut acc = Accumulator::default();
        for f in 0..5 {
            let id = if f < 3 { 7 } else { 8 };
            acc.update(&[(1, b(0.0))], &[(id, b(1.0))]);
        }
        let s = acc.summary();
        assert_eq!(s.id_switches, 1);
        assert!((s.mota - 0.8).abs() < 1e-12);
        assert_eq!(s.idtp, 3);
        assert!((s.idf1 - 0.6).abs() < 1e-12);
    }

    #[test]
    fn misses_false_positives_and_iou_limit() {
        // IoU of b(0) and b(5) is 5/15 < 0.5: a miss and a false positive.
        let mut acc = Accumulator::default();
        acc.update(&[(1, b(0.0))], &[(1, b(5.0))]);
        acc.update(&[(1, b(0.0))], &[]);
        acc.update(&[], &[(1, b(0.0))]);
        let s = acc.summary();
        assert_eq!((s.matches, s.misses, s.false_positives), (0, 2, 2));
        assert!((s.mota - (1.0 - 4.0 / 2.0)).abs() < 1e-12);
        assert_eq!(s.idtp, 0);
        assert_eq!(s.idf1, 0.0);
    }

    #[test]
    fn previous_pairs_are_kept_over_a_closer_box() {
        // Frame 2: track 9 is closer to object 1 than track 7, but 7 still overlaps enough:
        // the pair 1↔7 is kept (no switch), 9 is a false positive.
        let mut acc = Accumulator::default();
        acc.update(&[(1, b(0.0))], &[(7, b(0.0))]);
        acc.update(&[(1, b(0.0))], &[(7, b(2.0)), (9, b(0.0))]);
        let s = acc.summary();
        assert_eq!((s.matches, s.false_positives, s.id_switches), (2, 1, 0));
        // Identity: 1↔7 on both frames (IoU 8/12 ≥ 0.5): IDTP 2 of 2 objects and 3 hypotheses.
        assert_eq!(s.idtp, 2);
        assert!((s.idf1 - 4.0 / 5.0).abs() < 1e-12);
    }

    #[test]
    fn identity_assignment_takes_the_longest_pairing() {
        // Object 1: track 5 on frames 0-1, track 6 on frames 2-5 → IDTP picks 1↔6 (4 frames).
        let mut acc = Accumulator::default();
        for f in 0..6 {
            let id = if f < 2 { 5 } else { 6 };
            acc.update(&[(1, b(0.0))], &[(id, b(0.0))]);
        }
        let s = acc.summary();
        assert_eq!(s.idtp, 4);
        assert_eq!(s.id_switches, 1);
        assert!((s.idr - 4.0 / 6.0).abs() < 1e-12);
    }
}
