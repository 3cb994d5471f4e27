//! Multi-object tracking: IDs that follow objects across the frames of a video or stream.
//!
//! - [`byte`]: ByteTrack ([`byte::ByteTracker`], one per stream: `update(&detections, frame)`
//!   returns the confirmed tracks), as the authors' code, with the Ultralytics option names.
//! - [`kalman`]: its constant-velocity Kalman filter on `(cx, cy, aspect, height)`.
//! - [`assign`]: the linear assignment with a cost limit (Kuhn–Munkres of `pathfinding`).
//! - [`clock`]: the tracker's frame index of a live stream's frames, outages included.
//! - [`mot`]: MOT metrics (MOTA, ID switches, IDF1) of tracks against ground truth.
//! - [`tracker_file`]: `--tracker bytetrack.yaml` (Ultralytics' keys).
//! - [`trail`]: the recent centres of each track, for drawing trails.
//! - [`draw`]: the MOTChallenge line, the annotated frame with IDs and trails, counts per class.

pub(crate) mod assign;
pub mod byte;
pub(crate) mod clock;
#[cfg(feature = "media")]
pub mod draw;
#[cfg(feature = "media")]
pub mod job;
pub(crate) mod kalman;
pub mod mot;
pub mod tracker_file;
pub(crate) mod trail;
