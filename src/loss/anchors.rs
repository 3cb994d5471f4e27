//! Anchor points of the anchor-free head (official `utils/tal/anchor_generator.py make_anchors`).

use anyhow::{bail, Result};

/// Anchor points of all head levels, in the official order: level by level (P3, P4, P5),
/// row-major within a level (y outer, x inner).
#[derive(Debug, Clone, PartialEq)]
pub struct Anchors {
    /// Anchor centres in **grid units** of their level: `(x + 0.5, y + 0.5)`. Length A.
    pub points: Vec<[f32; 2]>,
    /// Stride (pixels per grid cell) of each anchor. Length A.
    pub strides: Vec<f32>,
}

impl Anchors {
    /// Anchors for levels of grid size `(h, w)` with the given strides
    /// (`make_anchors(feats, strides, grid_cell_offset=0.5)`).
    ///
    /// Errors: `level_hw` and `strides` of different lengths, or a zero stride.
    pub fn new(level_hw: &[(usize, usize)], strides: &[u32]) -> Result<Anchors> {
        if level_hw.len() != strides.len() {
            bail!(
                "anchors: {} head levels but {} strides; pass one stride per level (e.g. [8, 16, 32])",
                level_hw.len(),
                strides.len()
            );
        }
        let total: usize = level_hw.iter().map(|&(h, w)| h * w).sum();
        let mut points = Vec::with_capacity(total);
        let mut out_strides = Vec::with_capacity(total);
        for (&(h, w), &s) in level_hw.iter().zip(strides) {
            if s == 0 {
                bail!(
                    "anchors: stride 0 is invalid; strides are pixels per cell, e.g. [8, 16, 32]"
                );
            }
            for y in 0..h {
                for x in 0..w {
                    points.push([x as f32 + 0.5, y as f32 + 0.5]);
                    out_strides.push(s as f32);
                }
            }
        }
        Ok(Anchors {
            points,
            strides: out_strides,
        })
    }

    /// Number of anchors A.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// True when there are no anchors.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Anchor centres in pixels (`points * stride`), as the assigner wants them.
    pub fn points_px(&self) -> Vec<[f32; 2]> {
        self.points
            .iter()
            .zip(&self.strides)
            .map(|(p, &s)| [p[0] * s, p[1] * s])
            .collect()
    }
}
