//! The recent centres of each track, for drawing a short trail behind its box.

use super::byte::Track;
use std::collections::{HashMap, VecDeque};

/// Per track ID the box centres (pixels) of its last `len` frames seen; a track not seen for
/// `len` updates is forgotten, so memory stays bounded by the tracks on screen.
#[derive(Debug, Clone)]
pub struct Trails {
    len: usize,
    tick: u64,
    points: HashMap<u64, (u64, VecDeque<(f32, f32)>)>,
}

impl Trails {
    /// Trails of at most `len` points (at least 1).
    pub fn new(len: usize) -> Self {
        Self {
            len: len.max(1),
            tick: 0,
            points: HashMap::new(),
        }
    }

    /// Adds this frame's tracks and returns nothing; read with [`Trails::get`].
    pub fn push(&mut self, tracks: &[Track]) {
        self.tick += 1;
        for t in tracks {
            let c = ((t.bbox[0] + t.bbox[2]) / 2.0, (t.bbox[1] + t.bbox[3]) / 2.0);
            let e = self.points.entry(t.id).or_default();
            e.0 = self.tick;
            e.1.push_back(c);
            while e.1.len() > self.len {
                e.1.pop_front();
            }
        }
        let (tick, len) = (self.tick, self.len as u64);
        self.points.retain(|_, (seen, _)| tick - *seen < len);
    }

    /// The centres of track `id`, oldest first (empty if unknown).
    pub fn get(&self, id: u64) -> Vec<(f32, f32)> {
        self.points
            .get(&id)
            .map(|(_, p)| p.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Number of tracks remembered.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// Whether no track is remembered.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: u64, x: f32) -> Track {
        Track {
            id,
            bbox: [x, 0.0, x + 2.0, 2.0],
            score: 0.9,
            class_id: 0,
            detection: 0,
            start_frame: 1,
        }
    }

    #[test]
    fn keeps_the_last_points_and_forgets_old_tracks() {
        let mut tr = Trails::new(3);
        for k in 0..5 {
            tr.push(&[t(1, k as f32)]);
        }
        assert_eq!(tr.get(1), vec![(3.0, 1.0), (4.0, 1.0), (5.0, 1.0)]);
        tr.push(&[t(2, 0.0)]);
        tr.push(&[]);
        assert_eq!(tr.len(), 2);
        tr.push(&[]);
        // Track 1 was last seen 3 updates ago.
        assert!(tr.get(1).is_empty());
        assert_eq!(tr.get(2), vec![(1.0, 1.0)]);
    }
}
