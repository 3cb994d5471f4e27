//! The detection confusion matrix (official `utils/metrics.py ConfusionMatrix`, as `val_dual.py`
//! fills it): `(nc + 1) x (nc + 1)` counts, rows the predicted class, columns the true class, the
//! last row and column "background".
//!
//! Per image, detections with confidence `> conf` (0.25) are matched to labels with IoU `> iou`
//! (0.45): candidate pairs are sorted by IoU, descending, and each detection and each label keeps
//! its best pair (the official double `np.unique` pass). A label with exactly one match counts
//! at `[predicted class, true class]`, else at `[background, true class]` (missed); an unmatched
//! detection counts at `[predicted class, background]`.

use crate::boxes::box_iou;

/// Confusion matrix counts of a validation run.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfusionMatrix {
    /// Number of classes (the matrix is `nc + 1` square).
    pub nc: usize,
    /// Confidence above which a detection counts (official 0.25).
    pub conf: f32,
    /// IoU above which a detection and a label match (official 0.45).
    pub iou: f32,
    /// `matrix[predicted][true]`, row-major `(nc + 1) x (nc + 1)`.
    pub matrix: Vec<Vec<f64>>,
}

impl ConfusionMatrix {
    /// An empty matrix for `nc` classes at the official thresholds (conf 0.25, IoU 0.45).
    pub fn new(nc: usize) -> Self {
        ConfusionMatrix {
            nc,
            conf: 0.25,
            iou: 0.45,
            matrix: vec![vec![0.0; nc + 1]; nc + 1],
        }
    }

    /// Adds one image: `detections` rows `[x1, y1, x2, y2, conf, cls]`, `labels` rows
    /// `[cls, x1, y1, x2, y2]`, in the same pixel space. Classes at or above `nc` are ignored.
    pub fn process_batch(&mut self, detections: &[[f32; 6]], labels: &[[f32; 5]]) {
        let nc = self.nc;
        let dets: Vec<&[f32; 6]> = detections.iter().filter(|d| d[4] > self.conf).collect();
        let gt: Vec<usize> = labels.iter().map(|l| l[0] as usize).collect();
        let dc: Vec<usize> = dets.iter().map(|d| d[5] as usize).collect();
        // Candidate pairs (label, detection, IoU) in row-major order, as torch.where gives them.
        let mut m: Vec<(usize, usize, f32)> = Vec::new();
        for (i, l) in labels.iter().enumerate() {
            let lb = [l[1], l[2], l[3], l[4]];
            for (j, d) in dets.iter().enumerate() {
                let v = box_iou(&lb, &[d[0], d[1], d[2], d[3]]);
                if v > self.iou {
                    m.push((i, j, v));
                }
            }
        }
        if m.len() > 1 {
            // Descending IoU (the official argsort()[::-1]: an ascending sort, reversed), then the
            // first pair of each detection, then of each label, in IoU order.
            let desc = |m: &mut Vec<(usize, usize, f32)>| {
                m.sort_by(|a, b| a.2.total_cmp(&b.2));
                m.reverse();
            };
            desc(&mut m);
            let mut seen = std::collections::HashSet::new();
            m.retain(|p| seen.insert(p.1));
            desc(&mut m);
            let mut seen = std::collections::HashSet::new();
            m.retain(|p| seen.insert(p.0));
        }
        let mut add = |r: usize, c: usize| {
            if r <= nc && c <= nc {
                self.matrix[r][c] += 1.0;
            }
        };
        for (i, &g) in gt.iter().enumerate() {
            let hits: Vec<&(usize, usize, f32)> = m.iter().filter(|p| p.0 == i).collect();
            if hits.len() == 1 {
                add(dc[hits[0].1], g);
            } else {
                add(nc, g);
            }
        }
        if !m.is_empty() {
            for (j, &c) in dc.iter().enumerate() {
                if !m.iter().any(|p| p.1 == j) {
                    add(c, nc);
                }
            }
        }
    }

    /// The matrix with each column divided by its sum (`+ 1e-9`), as the official plot
    /// (`normalize=True`): column `c` shows where the labels of class `c` went.
    pub fn normalized(&self) -> Vec<Vec<f64>> {
        let n = self.nc + 1;
        let sums: Vec<f64> = (0..n)
            .map(|c| (0..n).map(|r| self.matrix[r][c]).sum::<f64>() + 1e-9)
            .collect();
        (0..n)
            .map(|r| (0..n).map(|c| self.matrix[r][c] / sums[c]).collect())
            .collect()
    }
}
