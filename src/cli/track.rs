//! `yolo9 track`: the arguments (the sources and flags of `yolo9 detect`, the tracker's settings
//! under Ultralytics' names) and one call of the library's tracking job
//! ([`crate::track::job::run`], which documents the outputs).
use crate::cli::detect::{prepare, DetectArgs};
use crate::track::byte::TrackerConfig;
use crate::track::job::TrackOptions;
use anyhow::Result;
use clap::Args;

/// `yolo9 track`'s default --conf: the tracker's default low threshold.
const DETECT_CONF: &str = "0.1";

/// Arguments of `yolo9 track`.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("project", |a| a.default_value("runs/track")))]
// ByteTrack associates low-score detections a second time: they must reach the tracker
// (Ultralytics' `track` lowers conf to 0.1 the same way).
#[command(mut_arg("conf", |a| a.default_value(DETECT_CONF)))]
pub struct TrackArgs {
    /// The sources and every option of `yolo9 detect`.
    #[command(flatten)]
    pub detect: DetectArgs,
    /// The tracker's settings.
    #[command(flatten)]
    pub tracker: TrackerArgs,
    /// Centres drawn as a trail behind each box (0: none).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=10000))]
    pub trail: u32,
    /// Frame rate of image sequences and live streams (videos use their own): the track buffer
    /// is in frames at 30 fps, scaled by it; a stream's reconnection time becomes frames at it.
    #[arg(long, default_value_t = 30.0, value_parser = positive_fps)]
    pub fps: f64,
}

fn positive_fps(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 10000.0 => Ok(v),
        _ => Err(format!("{s}: a frame rate in 0..=10000 frames per second")),
    }
}

/// ByteTrack's settings ([`TrackerConfig`]; Ultralytics' `bytetrack.yaml` names, the authors'
/// defaults): a tracker file, then the flags given over it.
#[derive(Debug, Clone, Args)]
pub struct TrackerArgs {
    /// A tracker file with Ultralytics' bytetrack.yaml keys (tracker_type: bytetrack,
    /// track_high_thresh, track_low_thresh, new_track_thresh, track_buffer, match_thresh,
    /// fuse_score); the flags below override its values.
    #[arg(long, value_name = "FILE")]
    pub tracker: Option<std::path::PathBuf>,
    /// Detections above this score are associated first [default: 0.5].
    #[arg(long = "track-high-thresh", value_parser = crate::parse::unit_f32)]
    pub track_high_thresh: Option<f32>,
    /// Detections between this and --track-high-thresh are associated second (with tracks
    /// tracked on the previous frame only) [default: 0.1]. Detections below --conf never reach
    /// the tracker: track's --conf defaults to 0.1 for this reason.
    #[arg(long = "track-low-thresh", value_parser = crate::parse::unit_f32)]
    pub track_low_thresh: Option<f32>,
    /// An unmatched detection at or above this score starts a track [default: 0.6].
    #[arg(long = "new-track-thresh", value_parser = crate::parse::unit_f32)]
    pub new_track_thresh: Option<f32>,
    /// Frames a lost track is kept, at 30 fps (scaled by the source's frame rate) [default: 30].
    #[arg(long = "track-buffer", value_parser = clap::value_parser!(u32).range(0..=100000))]
    pub track_buffer: Option<u32>,
    /// Largest matching distance (1 − IoU·score) of the first association [default: 0.8].
    #[arg(long = "match-thresh", value_parser = crate::parse::unit_f32)]
    pub match_thresh: Option<f32>,
    /// Weigh the IoU by the detection score (true, false) [default: true].
    #[arg(long = "fuse-score", action = clap::ArgAction::Set)]
    pub fuse_score: Option<bool>,
}

impl TrackerArgs {
    /// The tracker's settings at `frame_rate`: the defaults, the tracker file's values over them,
    /// the flags given over those (checked: [`TrackerConfig::validate`]).
    pub fn config(&self, frame_rate: f64) -> Result<TrackerConfig> {
        let base = TrackerConfig {
            frame_rate,
            ..TrackerConfig::default()
        };
        let f = match &self.tracker {
            Some(p) => crate::track::tracker_file::load(p, base)?,
            None => base,
        };
        let c = TrackerConfig {
            track_high_thresh: self.track_high_thresh.unwrap_or(f.track_high_thresh),
            track_low_thresh: self.track_low_thresh.unwrap_or(f.track_low_thresh),
            new_track_thresh: self.new_track_thresh.unwrap_or(f.new_track_thresh),
            track_buffer: self.track_buffer.unwrap_or(f.track_buffer),
            match_thresh: self.match_thresh.unwrap_or(f.match_thresh),
            fuse_score: self.fuse_score.unwrap_or(f.fuse_score),
            frame_rate,
        };
        c.validate()?;
        Ok(c)
    }
}

impl TrackArgs {
    /// The tracking stage's settings these arguments give. Errors: invalid tracker settings.
    pub fn options(&self) -> Result<TrackOptions> {
        Ok(TrackOptions {
            tracker: self.tracker.config(self.fps)?,
            trail: self.trail,
            fps: self.fps,
        })
    }
}

/// Runs `yolo9 track`.
pub fn run(args: TrackArgs) -> Result<()> {
    // Settings are checked before the model loads.
    let track = args.options()?;
    let p = prepare(&args.detect)?;
    crate::track::job::run(
        &p.detector,
        &args.detect.job,
        &track,
        &p.files,
        &p.skipped,
        &p.streams,
        &p.cancel,
    )
}
