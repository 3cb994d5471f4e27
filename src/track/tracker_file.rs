//! The tracker file of `yolo9 track --tracker FILE`: ByteTrack's settings under Ultralytics'
//! `bytetrack.yaml` keys (`tracker_type: bytetrack`, `track_high_thresh`, `track_low_thresh`,
//! `new_track_thresh`, `track_buffer`, `match_thresh`, `fuse_score`). Missing keys keep the
//! authors' defaults ([`TrackerConfig::default`]); an unknown key, a wrong type or another
//! tracker type is refused with the file, the key and the value.

use crate::track::byte::{TrackError, TrackerConfig};
use std::path::Path;

/// The settings a tracker file's text gives, over `base` (keys absent from the text keep
/// `base`'s values); `origin` names the file in errors. Checked ([`TrackerConfig::validate`]).
///
/// Errors: [`TrackError::Config`] naming `origin` and the bad key or value: not YAML, an unknown
/// key, a `tracker_type` other than `bytetrack` (BoT-SORT is not implemented), a value out of
/// range.
///
/// ```
/// use yolo9::track::{byte::TrackerConfig, tracker_file::parse};
/// let c = parse("tracker_type: bytetrack\ntrack_buffer: 60\n", "t.yaml", TrackerConfig::default()).unwrap();
/// assert_eq!((c.track_buffer, c.track_low_thresh), (60, 0.1));
/// ```
pub fn parse(text: &str, origin: &str, base: TrackerConfig) -> Result<TrackerConfig, TrackError> {
    let bad = |m: String| TrackError::Config(format!("{origin}: {m}"));
    let keys = "keys: tracker_type, track_high_thresh, track_low_thresh, new_track_thresh, \
                track_buffer, match_thresh, fuse_score";
    let v: serde_yaml_ng::Value = if text.trim().is_empty() {
        serde_yaml_ng::Value::Mapping(Default::default())
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| bad(format!("not YAML: {e}")))?
    };
    // Another tracker's file is named as such before its own keys are refused.
    if let Some(t) = v.get("tracker_type") {
        if t.as_str().map(str::trim) != Some("bytetrack") {
            return Err(bad(format!(
                "tracker_type {}: only bytetrack is implemented (use a bytetrack.yaml)",
                serde_yaml_ng::to_string(t).unwrap_or_default().trim()
            )));
        }
    }
    let serde_yaml_ng::Value::Mapping(m) = v else {
        return Err(bad(format!("not a mapping of keys to values ({keys})")));
    };
    let mut c = base;
    for (k, val) in &m {
        let shown = || {
            serde_yaml_ng::to_string(val)
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        let Some(key) = k.as_str() else {
            return Err(bad(format!("key {}: not a name ({keys})", shown())));
        };
        let number = || -> Result<f32, TrackError> {
            val.as_f64()
                .map(|x| x as f32)
                .ok_or_else(|| bad(format!("{key}: {} is not a number", shown())))
        };
        match key {
            "tracker_type" => {}
            "track_high_thresh" => c.track_high_thresh = number()?,
            "track_low_thresh" => c.track_low_thresh = number()?,
            "new_track_thresh" => c.new_track_thresh = number()?,
            "match_thresh" => c.match_thresh = number()?,
            "track_buffer" => {
                c.track_buffer = val
                    .as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| bad(format!("{key}: {} is not a number of frames", shown())))?
            }
            "fuse_score" => {
                c.fuse_score = val
                    .as_bool()
                    .ok_or_else(|| bad(format!("{key}: {} is not true or false", shown())))?
            }
            other => return Err(bad(format!("unknown key {other} ({keys})"))),
        }
    }
    c.validate().map_err(|e| bad(e.to_string()))?;
    Ok(c)
}

/// [`parse`] of the file `path` (a regular file of at most 16 MiB, UTF-8).
///
/// Errors: [`TrackError::Config`] naming the file: unreadable, or as [`parse`].
pub fn load(path: &Path, base: TrackerConfig) -> Result<TrackerConfig, TrackError> {
    let origin = crate::text::path(&path).to_string();
    let text = crate::bounded::read_text_capped(path, crate::bounded::FileKind::Record)
        .map_err(|e| TrackError::Config(format!("{origin}: cannot read the tracker file: {e}")))?;
    parse(&text, &origin, base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ultralytics_file_and_refusals() {
        // Ultralytics' own bytetrack.yaml (its defaults differ from the authors').
        let text = "tracker_type: bytetrack\ntrack_high_thresh: 0.25\ntrack_low_thresh: 0.1\n\
                    new_track_thresh: 0.25\ntrack_buffer: 30\nmatch_thresh: 0.8\nfuse_score: True\n";
        let c = parse(text, "b.yaml", TrackerConfig::default()).unwrap();
        assert_eq!(
            (c.track_high_thresh, c.new_track_thresh, c.fuse_score),
            (0.25, 0.25, true)
        );
        let err = |t: &str| {
            parse(t, "b.yaml", TrackerConfig::default())
                .unwrap_err()
                .to_string()
        };
        let e = err("tracker_type: botsort\nproximity_thresh: 0.5\n");
        assert!(
            e.contains("b.yaml: tracker_type botsort: only bytetrack"),
            "{e}"
        );
        let e = err("track_bufer: 30\n");
        assert!(e.contains("unknown key track_bufer"), "{e}");
        let e = err("track_low_thresh: 0.7\n");
        assert!(e.contains("--track-low-thresh"), "{e}");
        let e = err("match_thresh: high\n");
        assert!(e.contains("match_thresh: high is not a number"), "{e}");
        let e = err("track_buffer: -3\n");
        assert!(
            e.contains("track_buffer: -3 is not a number of frames"),
            "{e}"
        );
        // Empty: the defaults.
        assert_eq!(
            parse("", "b.yaml", TrackerConfig::default()).unwrap(),
            TrackerConfig::default()
        );
    }
}
