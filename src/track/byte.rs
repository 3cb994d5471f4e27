//! ByteTrack (Zhang et al., "ByteTrack: Multi-Object Tracking by Associating Every Detection Box",
//! ECCV 2022), as the authors' `BYTETracker.update` in `yolox/tracker/byte_tracker.py`
//! (ifzhang/ByteTrack), with the thresholds named as Ultralytics names them.
//!
//! Per frame: the Kalman filter predicts every tracked and lost track; the high-score
//! detections (`score > track_high_thresh`) are matched to them by IoU distance (fused with the
//! detection score unless `fuse_score` is off), limit `match_thresh`; the low-score detections
//! (`track_low_thresh < score < track_high_thresh`) are matched to the still unmatched tracks that
//! were tracked (limit 0.5, no score fusion); those left unmatched become lost; the unconfirmed
//! tracks (born on the previous frame) are matched to the remaining high-score detections (limit
//! 0.7) or removed; a remaining detection with `score >= new_track_thresh` starts a track
//! (confirmed at once only on the stream's first frame, else on its second match); a lost track
//! is removed after `max_time_lost = int(frame_rate / 30 · track_buffer)` frames; finally a
//! tracked and a lost track overlapping with IoU > 0.85 keep only the older one. The IoU is the
//! authors' (`cython_bbox.bbox_overlaps`: widths and heights counted as `x2 − x1 + 1` pixels).
//!
//! Two details of the authors' code are kept because they decide IDs: a lost track removed on
//! frame t can still be found again on frame t + 1 (it leaves the lost list one frame late; after
//! a frame gap it is gone), and a track that was once removed and found again disappears at once
//! if it is lost again.
//!
//! Frame gaps (`--vid-stride`, a stream that dropped frames or reconnected): `update` takes the
//! source's frame index; the filter predicts as many one-frame steps as frames passed, and the
//! lost-track buffer counts source frames. With consecutive frames this is the authors' tracker.

use super::assign::linear_assignment;
use super::kalman::{self, Cov, Mean};
use crate::detect::detector::Detection;

/// The tracker's settings (Ultralytics' `bytetrack.yaml` names; the authors' defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrackerConfig {
    /// Detections with `score > track_high_thresh` are associated first (the authors'
    /// `track_thresh`, 0.5).
    pub track_high_thresh: f32,
    /// Detections with `track_low_thresh < score < track_high_thresh` are associated second,
    /// only with tracks that were tracked on the previous frame (0.1; the authors fix it).
    pub track_low_thresh: f32,
    /// A detection left unmatched starts a track when `score >= new_track_thresh` (the
    /// authors' `track_thresh + 0.1`, 0.6).
    pub new_track_thresh: f32,
    /// Frames a lost track is kept at 30 fps (30); scaled by the frame rate.
    pub track_buffer: u32,
    /// The first association's cost limit: a pair is matched only if its distance
    /// (`1 − IoU`, or `1 − IoU·score` with `fuse_score`) is below it (0.8).
    pub match_thresh: f32,
    /// Multiply the IoU by the detection score in the first association and for the unconfirmed
    /// tracks (the authors' default, off only with their `--mot20`; Ultralytics' default too).
    pub fuse_score: bool,
    /// The source's frame rate in frames per second (30): the buffer is
    /// `int(frame_rate / 30 · track_buffer)` frames.
    pub frame_rate: f64,
}

impl Default for TrackerConfig {
    fn default() -> Self {
        Self {
            track_high_thresh: 0.5,
            track_low_thresh: 0.1,
            new_track_thresh: 0.6,
            track_buffer: 30,
            match_thresh: 0.8,
            fuse_score: true,
            frame_rate: 30.0,
        }
    }
}

impl TrackerConfig {
    /// Frames a lost track is kept: `int(frame_rate / 30 · track_buffer)` (the authors'
    /// `buffer_size`).
    pub fn max_time_lost(&self) -> u64 {
        (self.frame_rate / 30.0 * self.track_buffer as f64) as u64
    }

    /// Checks the values: thresholds finite in 0..=1, `track_low_thresh <= track_high_thresh`,
    /// a finite frame rate > 0. The error names the setting as the command line does.
    pub fn validate(&self) -> Result<(), TrackError> {
        for (name, v) in [
            ("--track-high-thresh", self.track_high_thresh),
            ("--track-low-thresh", self.track_low_thresh),
            ("--new-track-thresh", self.new_track_thresh),
            ("--match-thresh", self.match_thresh),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(TrackError::Config(format!(
                    "{name} {v}: must be between 0 and 1"
                )));
            }
        }
        if self.track_low_thresh > self.track_high_thresh {
            return Err(TrackError::Config(format!(
                "--track-low-thresh {} is above --track-high-thresh {}: the low-score band would \
                 be empty",
                self.track_low_thresh, self.track_high_thresh
            )));
        }
        if !(self.frame_rate.is_finite() && self.frame_rate > 0.0) {
            return Err(TrackError::Config(format!(
                "frame rate {}: must be a positive number of frames per second",
                self.frame_rate
            )));
        }
        Ok(())
    }
}

/// What the tracker refuses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TrackError {
    /// A setting out of range ([`TrackerConfig::validate`]).
    #[error("tracker settings: {0}")]
    Config(String),
    /// `update` was given a frame index not after the previous one.
    #[error("frame {frame} does not come after frame {last}: frame indices must increase (start a new tracker for a new sequence)")]
    FrameOrder {
        /// The index given.
        frame: u64,
        /// The previous update's index.
        last: u64,
    },
    /// A detection with a non-finite box or score.
    #[error("detection {index} of frame {frame}: box {bbox:?} score {score} is not finite")]
    NotFinite {
        /// The frame index given to `update`.
        frame: u64,
        /// The detection's position in the slice.
        index: usize,
        /// Its box.
        bbox: [f32; 4],
        /// Its score.
        score: f32,
    },
}

/// A confirmed track on the current frame, as [`ByteTracker::update`] returns it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Track {
    /// The track's ID: 1, 2, ... in the order tracks started (IDs of tracks that were never
    /// confirmed are skipped, as the authors' counter does).
    pub id: u64,
    /// The filtered box `[x1, y1, x2, y2]` in the detections' pixels (the Kalman state after this
    /// frame's update, the authors' `tlbr`), not clipped.
    pub bbox: [f32; 4],
    /// The score of the detection matched on this frame.
    pub score: f32,
    /// The class of the detection matched on this frame.
    pub class_id: usize,
    /// The index of that detection in the slice given to `update`.
    pub detection: usize,
    /// The frame index the track started on.
    pub start_frame: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Tracked,
    Lost,
    Removed,
}

#[derive(Debug, Clone)]
struct STrack {
    id: u64,
    mean: Mean,
    cov: Cov,
    state: State,
    activated: bool,
    score: f64,
    class_id: usize,
    detection: usize,
    /// The frame of the last update (`frame_id`, whose `end_frame` it also is).
    frame: u64,
    start_frame: u64,
    /// Once in the authors' global `removed_stracks` (decides `sub_stracks(lost, removed)`).
    ever_removed: bool,
    /// The frame a lost track was removed on (it stays matchable on the next frame only).
    removed_at: u64,
}

impl STrack {
    fn tlbr(&self) -> [f64; 4] {
        let m = &self.mean;
        let w = m[2] * m[3];
        let h = m[3];
        let x1 = m[0] - w / 2.0;
        let y1 = m[1] - h / 2.0;
        [x1, y1, x1 + w, y1 + h]
    }

    /// `update` (matched while tracked) and `re_activate` (found again while lost): the filter
    /// update with the detection.
    fn take(&mut self, d: &Det, frame: u64) {
        kalman::update(&mut self.mean, &mut self.cov, d.xyah());
        self.state = State::Tracked;
        self.activated = true;
        self.frame = frame;
        self.score = d.score;
        self.class_id = d.class_id;
        self.detection = d.index;
    }
}

/// A detection as the tracker sees it (the authors' detection `STrack` before activation).
#[derive(Debug, Clone, Copy)]
struct Det {
    tlbr: [f64; 4],
    score: f64,
    class_id: usize,
    index: usize,
}

impl Det {
    fn xyah(&self) -> [f64; 4] {
        let [x1, y1, x2, y2] = self.tlbr;
        let (w, h) = (x2 - x1, y2 - y1);
        [x1 + w / 2.0, y1 + h / 2.0, w / h, h]
    }
}

/// The IoU of `cython_bbox.bbox_overlaps` (the authors' `matching.ious`): sides count one more
/// pixel (`x2 − x1 + 1`); no overlap unless the +1 widths and heights are positive.
pub fn iou_plus1(a: &[f64; 4], b: &[f64; 4]) -> f64 {
    let iw = a[2].min(b[2]) - a[0].max(b[0]) + 1.0;
    if iw <= 0.0 {
        return 0.0;
    }
    let ih = a[3].min(b[3]) - a[1].max(b[1]) + 1.0;
    if ih <= 0.0 {
        return 0.0;
    }
    let ua = (a[2] - a[0] + 1.0) * (a[3] - a[1] + 1.0) + (b[2] - b[0] + 1.0) * (b[3] - b[1] + 1.0)
        - iw * ih;
    if ua > 0.0 {
        iw * ih / ua
    } else {
        0.0
    }
}

/// The IoU distance matrix `1 − IoU` (rows: tracks, columns: detections), fused with the
/// detection scores when `fuse` (`1 − IoU·score`, the authors' `fuse_score`).
fn iou_cost(arena: &[STrack], tracks: &[usize], dets: &[Det], fuse: bool) -> Vec<f64> {
    let mut c = Vec::with_capacity(tracks.len() * dets.len());
    for &t in tracks {
        let a = arena[t].tlbr();
        for d in dets {
            let iou = iou_plus1(&a, &d.tlbr);
            c.push(if fuse { 1.0 - iou * d.score } else { 1.0 - iou });
        }
    }
    c
}

/// Splits `0..n` into the matched indices of `side` (0 rows, 1 columns) and the rest, ascending.
fn unmatched(n: usize, matches: &[(usize, usize)], cols: bool) -> Vec<usize> {
    let mut used = vec![false; n];
    for &(r, c) in matches {
        used[if cols { c } else { r }] = true;
    }
    (0..n).filter(|&i| !used[i]).collect()
}

/// One stream's ByteTrack state: a plain value (`Send`, no I/O, no globals); IDs count from 1
/// per tracker.
#[derive(Debug, Clone)]
pub struct ByteTracker {
    config: TrackerConfig,
    tracked: Vec<STrack>,
    lost: Vec<STrack>,
    last_frame: Option<u64>,
    next_id: u64,
}

impl ByteTracker {
    /// A tracker with `config` ([`TrackerConfig::validate`]d).
    pub fn new(config: TrackerConfig) -> Result<Self, TrackError> {
        config.validate()?;
        Ok(Self {
            config,
            tracked: Vec::new(),
            lost: Vec::new(),
            last_frame: None,
            next_id: 0,
        })
    }

    /// The settings.
    pub fn config(&self) -> &TrackerConfig {
        &self.config
    }

    /// The frame index of the last update, if any.
    pub fn last_frame(&self) -> Option<u64> {
        self.last_frame
    }

    /// Tracks currently kept as lost (waiting to be found again within the buffer).
    pub fn lost_count(&self) -> usize {
        self.lost.len()
    }

    /// One frame: `detections` (boxes `[x1, y1, x2, y2]` in pixels, `confidence` the score,
    /// `class_id`; other fields unused) seen on frame `frame` of the source (any increasing
    /// numbering; a gap of k frames since the last update predicts k filter steps). Returns the
    /// confirmed tracks of this frame, each matched to one of `detections` (in the authors'
    /// order of `tracked_stracks`). Detections with a zero or negative width or height are
    /// ignored. Errors: a frame index not after the previous one, a non-finite box or score.
    pub fn update(
        &mut self,
        detections: &[Detection],
        frame: u64,
    ) -> Result<Vec<Track>, TrackError> {
        let gap = match self.last_frame {
            Some(last) if frame <= last => return Err(TrackError::FrameOrder { frame, last }),
            Some(last) => frame - last,
            None => 1,
        };
        let first = self.last_frame.is_none();
        let cfg = self.config;
        let (high, low) = split_by_score(detections, frame, &cfg)?;
        self.last_frame = Some(frame);

        // A lost track removed on the previous update is matchable one frame later only (the
        // authors' list order gives it that frame); after a gap it is gone.
        self.lost
            .retain(|t| t.state != State::Removed || frame - t.removed_at <= 1);
        let nt = self.tracked.len();
        let mut arena: Vec<STrack> = self.tracked.drain(..).chain(self.lost.drain(..)).collect();
        let tracked_old: Vec<usize> = (0..nt).collect();
        let lost_old: Vec<usize> = (nt..arena.len()).collect();
        let (unconfirmed, mut pool): (Vec<usize>, Vec<usize>) =
            tracked_old.iter().partition(|&&t| !arena[t].activated);
        pool.extend(&lost_old);

        let mut ch = Changes::default();

        // Step 2: predict, then the high-score detections against tracked and lost tracks.
        for &t in &pool {
            let s = &mut arena[t];
            if s.state != State::Tracked {
                s.mean[7] = 0.0;
            }
            for _ in 0..gap {
                kalman::predict(&mut s.mean, &mut s.cov);
            }
        }
        let cost = iou_cost(&arena, &pool, &high, cfg.fuse_score);
        let m = linear_assignment(&cost, pool.len(), high.len(), cfg.match_thresh as f64);
        ch.take_matches(&mut arena, &pool, &high, &m, frame);
        let u_track = unmatched(pool.len(), &m, false);
        let u_det = unmatched(high.len(), &m, true);

        // Step 3: the low-score detections against the unmatched tracks that were tracked.
        let r_tracked: Vec<usize> = u_track
            .iter()
            .map(|&i| pool[i])
            .filter(|&t| arena[t].state == State::Tracked)
            .collect();
        let cost = iou_cost(&arena, &r_tracked, &low, false);
        let m = linear_assignment(&cost, r_tracked.len(), low.len(), 0.5);
        ch.take_matches(&mut arena, &r_tracked, &low, &m, frame);
        for i in unmatched(r_tracked.len(), &m, false) {
            let t = r_tracked[i];
            if arena[t].state != State::Lost {
                arena[t].state = State::Lost;
                ch.lost_now.push(t);
            }
        }

        // Unconfirmed tracks (one frame old) against the remaining high-score detections.
        let rest: Vec<Det> = u_det.iter().map(|&j| high[j]).collect();
        let cost = iou_cost(&arena, &unconfirmed, &rest, cfg.fuse_score);
        let m = linear_assignment(&cost, unconfirmed.len(), rest.len(), 0.7);
        for &(i, j) in &m {
            let t = unconfirmed[i];
            arena[t].take(&rest[j], frame);
            ch.activated.push(t);
        }
        for i in unmatched(unconfirmed.len(), &m, false) {
            let t = unconfirmed[i];
            arena[t].state = State::Removed;
            ch.removed_now.push(t);
        }

        // Step 4: new tracks.
        let new = unmatched(rest.len(), &m, true);
        self.start_tracks(
            &mut arena,
            new.iter().map(|&j| &rest[j]),
            first,
            frame,
            &mut ch,
        );

        // Step 5: lost tracks past the buffer.
        let max_lost = cfg.max_time_lost();
        for &t in &lost_old {
            if frame - arena[t].frame > max_lost {
                if arena[t].state != State::Removed {
                    arena[t].removed_at = frame;
                }
                arena[t].state = State::Removed;
                ch.removed_now.push(t);
            }
        }

        let (tracked, lost) = combine(&mut arena, &tracked_old, &lost_old, ch);
        let (tracked, lost) = remove_duplicates(&arena, tracked, lost);

        let out = tracked
            .iter()
            .map(|&t| &arena[t])
            .filter(|s| s.activated)
            .map(|s| Track {
                id: s.id,
                bbox: s.tlbr().map(|v| v as f32),
                score: s.score as f32,
                class_id: s.class_id,
                detection: s.detection,
                start_frame: s.start_frame,
            })
            .collect();
        let mut slots: Vec<Option<STrack>> = arena.into_iter().map(Some).collect();
        self.tracked = tracked.iter().filter_map(|&t| slots[t].take()).collect();
        self.lost = lost.iter().filter_map(|&t| slots[t].take()).collect();
        Ok(out)
    }

    /// Step 4 of [`ByteTracker::update`]: a new track (with the next ID) for each of `dets`
    /// scoring at least `new_track_thresh`, confirmed at once on the first frame only.
    fn start_tracks<'d>(
        &mut self,
        arena: &mut Vec<STrack>,
        dets: impl Iterator<Item = &'d Det>,
        first: bool,
        frame: u64,
        ch: &mut Changes,
    ) {
        for d in dets {
            if d.score < self.config.new_track_thresh as f64 {
                continue;
            }
            self.next_id += 1;
            let (mean, cov) = kalman::initiate(d.xyah());
            arena.push(STrack {
                id: self.next_id,
                mean,
                cov,
                state: State::Tracked,
                activated: first,
                score: d.score,
                class_id: d.class_id,
                detection: d.index,
                frame,
                start_frame: frame,
                ever_removed: false,
                removed_at: 0,
            });
            ch.activated.push(arena.len() - 1);
        }
    }
}

/// The checked `detections` of frame `frame` with a positive width and height, split into the
/// high-score ones (above `track_high_thresh`) and the low-score ones (above
/// `track_low_thresh`, below the high threshold). Errors: a non-finite box or score.
fn split_by_score(
    detections: &[Detection],
    frame: u64,
    cfg: &TrackerConfig,
) -> Result<(Vec<Det>, Vec<Det>), TrackError> {
    let (hi, lo) = (cfg.track_high_thresh as f64, cfg.track_low_thresh as f64);
    let mut high = Vec::new();
    let mut low = Vec::new();
    for (index, d) in detections.iter().enumerate() {
        if !(d.bbox.iter().all(|v| v.is_finite()) && d.confidence.is_finite()) {
            return Err(TrackError::NotFinite {
                frame,
                index,
                bbox: d.bbox,
                score: d.confidence,
            });
        }
        let b = d.bbox.map(|v| v as f64);
        if b[2] <= b[0] || b[3] <= b[1] {
            continue;
        }
        let det = Det {
            tlbr: b,
            score: d.confidence as f64,
            class_id: d.class_id,
            index,
        };
        if det.score > hi {
            high.push(det);
        } else if det.score > lo && det.score < hi {
            low.push(det);
        }
    }
    Ok((high, low))
}

/// The arena indices (see [`ByteTracker::update`]) a frame's matching changed, in the order the
/// authors' lists get them.
#[derive(Default)]
struct Changes {
    /// Matched while tracked, or started.
    activated: Vec<usize>,
    /// Matched while lost (found again).
    refound: Vec<usize>,
    /// Tracked before this frame, lost now.
    lost_now: Vec<usize>,
    /// Removed on this frame.
    removed_now: Vec<usize>,
}

impl Changes {
    /// Updates the tracks `rows[i]` with the detections `dets[j]` of the matches `(i, j)`, each
    /// counted as activated (it was tracked) or refound (it was lost).
    fn take_matches(
        &mut self,
        arena: &mut [STrack],
        rows: &[usize],
        dets: &[Det],
        matches: &[(usize, usize)],
        frame: u64,
    ) {
        for &(i, j) in matches {
            let t = rows[i];
            let was = arena[t].state;
            arena[t].take(&dets[j], frame);
            if was == State::Tracked {
                self.activated.push(t);
            } else {
                self.refound.push(t);
            }
        }
    }
}

/// The tracked and lost lists after a frame, as the authors combine them (joint / sub by track
/// ID) from the lists before it (`tracked_old`, `lost_old`) and the frame's changes `ch`; marks
/// the tracks removed now.
fn combine(
    arena: &mut [STrack],
    tracked_old: &[usize],
    lost_old: &[usize],
    ch: Changes,
) -> (Vec<usize>, Vec<usize>) {
    let mut tracked: Vec<usize> = tracked_old
        .iter()
        .copied()
        .filter(|&t| arena[t].state == State::Tracked)
        .collect();
    for t in ch.activated.into_iter().chain(ch.refound) {
        if !tracked.contains(&t) {
            tracked.push(t);
        }
    }
    let mut lost: Vec<usize> = lost_old
        .iter()
        .copied()
        .filter(|t| !tracked.contains(t))
        .collect();
    lost.extend(ch.lost_now);
    // `sub_stracks(lost, removed_stracks)` with the removed list as it was before this
    // frame: a track removed now leaves the lost list on the next frame.
    lost.retain(|&t| !arena[t].ever_removed);
    for &t in &ch.removed_now {
        arena[t].ever_removed = true;
    }
    (tracked, lost)
}

/// The authors' `remove_duplicate_stracks`: a tracked and a lost track with IoU distance < 0.15
/// keep the one tracked longer (the lost one on a tie); returns both lists without the others.
fn remove_duplicates(
    arena: &[STrack],
    tracked: Vec<usize>,
    lost: Vec<usize>,
) -> (Vec<usize>, Vec<usize>) {
    let mut drop_a = vec![false; tracked.len()];
    let mut drop_b = vec![false; lost.len()];
    for (p, &a) in tracked.iter().enumerate() {
        let ba = arena[a].tlbr();
        for (q, &b) in lost.iter().enumerate() {
            if 1.0 - iou_plus1(&ba, &arena[b].tlbr()) < 0.15 {
                let tp = arena[a].frame as i64 - arena[a].start_frame as i64;
                let tq = arena[b].frame as i64 - arena[b].start_frame as i64;
                if tp > tq {
                    drop_b[q] = true;
                } else {
                    drop_a[p] = true;
                }
            }
        }
    }
    let tracked: Vec<usize> = tracked
        .into_iter()
        .enumerate()
        .filter(|(p, _)| !drop_a[*p])
        .map(|(_, t)| t)
        .collect();
    let lost: Vec<usize> = lost
        .into_iter()
        .enumerate()
        .filter(|(q, _)| !drop_b[*q])
        .map(|(_, t)| t)
        .collect();
    (tracked, lost)
}
