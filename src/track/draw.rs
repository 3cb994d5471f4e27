//! What tracking writes and draws per frame: the MOTChallenge line, the annotated frame (each
//! box labelled with its track ID, a colour per ID, a trail of its recent centres) and the count
//! of tracks per class.

use super::byte::Track;
use super::trail::Trails;
use crate::detect::detector::Detection;
use crate::detect::draw::{class_color, draw_detections, DrawOptions};
use std::collections::{BTreeMap, BTreeSet};

/// One MOTChallenge result line `frame,id,x,y,w,h,conf,-1,-1,-1` (top-left corner and size in
/// pixels, two decimals; the MOT16/17 results format), without the newline.
pub fn mot_line(frame: u64, t: &Track) -> String {
    let [x1, y1, x2, y2] = t.bbox;
    format!(
        "{frame},{},{:.2},{:.2},{:.2},{:.2},{:.4},-1,-1,-1",
        t.id,
        x1,
        y1,
        x2 - x1,
        y2 - y1,
        t.score
    )
}

/// The box of `t` clipped to a `w x h` image (the tracker's filtered box may reach past an edge).
pub fn clipped(t: &Track, (w, h): (u32, u32)) -> [f32; 4] {
    let (w, h) = (w as f32, h as f32);
    [
        t.bbox[0].clamp(0.0, w),
        t.bbox[1].clamp(0.0, h),
        t.bbox[2].clamp(0.0, w),
        t.bbox[3].clamp(0.0, h),
    ]
}

/// Draws `tracks` on `canvas` (its pixels are the boxes' pixels): the box and the label
/// `#ID class score` in the colour of the ID (the detection drawing of
/// [`crate::detect::draw`]), the mask of the detection it matched (`dets[t.detection]`, from a
/// segmentation model) in that colour, and the ID's trail from `trails` as a polyline.
///
/// Errors: the embedded font cannot be read.
pub fn draw_tracks(
    canvas: &mut image::RgbImage,
    tracks: &[Track],
    dets: &[Detection],
    trails: &Trails,
    names: &[String],
    opts: &DrawOptions,
) -> anyhow::Result<()> {
    let size = canvas.dimensions();
    for t in tracks {
        let pts = trails.get(t.id);
        let color = class_color(t.id as usize);
        for w in pts.windows(2) {
            for d in [-1.0f32, 0.0, 1.0] {
                imageproc::drawing::draw_line_segment_mut(
                    canvas,
                    (w[0].0 + d, w[0].1),
                    (w[1].0 + d, w[1].1),
                    color,
                );
                imageproc::drawing::draw_line_segment_mut(
                    canvas,
                    (w[0].0, w[0].1 + d),
                    (w[1].0, w[1].1 + d),
                    color,
                );
            }
        }
    }
    let as_dets: Vec<Detection> = tracks
        .iter()
        .map(|t| Detection {
            // The colour follows the ID.
            class_id: t.id as usize,
            class_name: format!(
                "#{} {}",
                t.id,
                names.get(t.class_id).map(String::as_str).unwrap_or("?")
            ),
            confidence: t.score,
            bbox: clipped(t, size),
            mask: dets.get(t.detection).and_then(|d| d.mask.clone()),
        })
        .collect();
    draw_detections(canvas, &as_dets, 1.0, opts)
}

/// The distinct track IDs seen per class, for the end-of-run counts.
#[derive(Debug, Clone, Default)]
pub struct ClassCounts(BTreeMap<usize, BTreeSet<u64>>);

impl ClassCounts {
    /// Adds this frame's tracks (an ID counts in the class of each frame it was seen with).
    pub fn add(&mut self, tracks: &[Track]) {
        for t in tracks {
            self.0.entry(t.class_id).or_default().insert(t.id);
        }
    }

    /// Distinct IDs over all classes.
    pub fn total(&self) -> usize {
        self.0.values().flatten().collect::<BTreeSet<_>>().len()
    }

    /// `(class_id, tracks)`, by class.
    pub fn per_class(&self) -> Vec<(usize, usize)> {
        self.0.iter().map(|(c, ids)| (*c, ids.len())).collect()
    }

    /// `12 tracks: 9 RBC, 2 WBC, 1 Platelets` (classes by index; unknown indices as numbers).
    pub fn summary(&self, names: &[String]) -> String {
        let n = self.total();
        let per: Vec<String> = self
            .per_class()
            .into_iter()
            .map(|(c, k)| {
                let name = names.get(c).cloned().unwrap_or_else(|| c.to_string());
                format!("{k} {name}")
            })
            .collect();
        let noun = if n == 1 { "track" } else { "tracks" };
        if per.is_empty() {
            format!("{n} {noun}")
        } else {
            format!("{n} {noun}: {}", per.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: u64, class_id: usize) -> Track {
        Track {
            id,
            bbox: [10.0, 20.5, 40.25, 80.0],
            score: 0.875,
            class_id,
            detection: 0,
            start_frame: 1,
        }
    }

    #[test]
    fn mot_line_is_top_left_and_size() {
        assert_eq!(
            mot_line(7, &t(3, 0)),
            "7,3,10.00,20.50,30.25,59.50,0.8750,-1,-1,-1"
        );
    }

    #[test]
    fn counts_distinct_ids_per_class() {
        let mut c = ClassCounts::default();
        c.add(&[t(1, 0), t(2, 0), t(3, 1)]);
        c.add(&[t(1, 0), t(4, 2)]);
        let names = vec!["RBC".to_string(), "WBC".to_string()];
        assert_eq!(c.summary(&names), "4 tracks: 2 RBC, 1 WBC, 1 2");
        assert_eq!(c.per_class(), vec![(0, 2), (1, 1), (2, 1)]);
    }
}
