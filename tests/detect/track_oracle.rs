//! `yolo9::track::byte::ByteTracker` against the ByteTrack authors' tracker: the files in
//! `tests/detect/track_oracle/` hold designed detection sequences (crossings, occlusions,
//! low-score recoveries, births and deaths at 10 fps, random crowds with and without score
//! fusion) and the authors' `BYTETracker.update` output on each frame, made by
//! `benches/track_oracle.py` (its docstring has the command). Every frame: the same track IDs in
//! the same order, boxes within 1e-3 px, the same scores.
//!
//! Also the frame gaps of `update` (which the authors' code does not have): a gap of k frames
//! predicts k filter steps, so a constant-velocity object followed on every other frame keeps
//! its ID and lands where it is.
use std::path::PathBuf;

use yolo9::track::byte::{ByteTracker, TrackError, TrackerConfig};
use yolo9::Detection;

fn det(v: &[f64]) -> Detection {
    Detection {
        class_id: v[5] as usize,
        class_name: String::new(),
        confidence: v[4] as f32,
        bbox: [v[0] as f32, v[1] as f32, v[2] as f32, v[3] as f32],
        mask: None,
    }
}

fn oracle_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/detect/track_oracle");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    v
}

#[test]
fn same_ids_and_boxes_as_the_authors_tracker() {
    let files = oracle_files();
    assert_eq!(files.len(), 7, "{files:?}");
    for path in files {
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let c = &j["config"];
        let cfg = TrackerConfig {
            track_high_thresh: c["track_high_thresh"].as_f64().unwrap() as f32,
            track_low_thresh: c["track_low_thresh"].as_f64().unwrap() as f32,
            new_track_thresh: c["new_track_thresh"].as_f64().unwrap() as f32,
            track_buffer: c["track_buffer"].as_u64().unwrap() as u32,
            match_thresh: c["match_thresh"].as_f64().unwrap() as f32,
            fuse_score: c["fuse_score"].as_bool().unwrap(),
            frame_rate: c["frame_rate"].as_f64().unwrap(),
        };
        let mut tr = ByteTracker::new(cfg).unwrap();
        let (mut n_boxes, mut max_err) = (0usize, 0f64);
        for f in j["frames"].as_array().unwrap() {
            let frame = f["frame"].as_u64().unwrap();
            let dets: Vec<Detection> = f["dets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    let v: Vec<f64> = d
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap())
                        .collect();
                    det(&v)
                })
                .collect();
            let got = tr.update(&dets, frame).unwrap();
            let want = f["tracks"].as_array().unwrap();
            let got_ids: Vec<u64> = got.iter().map(|t| t.id).collect();
            let want_ids: Vec<u64> = want.iter().map(|t| t[0].as_u64().unwrap()).collect();
            assert_eq!(
                got_ids,
                want_ids,
                "{} frame {frame}: track IDs",
                path.display()
            );
            for (g, w) in got.iter().zip(want) {
                for k in 0..4 {
                    let e = (g.bbox[k] as f64 - w[k + 1].as_f64().unwrap()).abs();
                    max_err = max_err.max(e);
                    assert!(
                        e < 1e-3,
                        "{} frame {frame} track {}: box {:?} vs {w}",
                        path.display(),
                        g.id,
                        g.bbox
                    );
                }
                assert!((g.score as f64 - w[5].as_f64().unwrap()).abs() < 1e-6);
                // The track's detection is one of this frame's, with that score.
                assert_eq!(dets[g.detection].confidence, g.score);
                assert_eq!(dets[g.detection].class_id, g.class_id);
                n_boxes += 1;
            }
        }
        assert!(n_boxes > 100, "{}: {n_boxes} boxes", path.display());
        println!(
            "{}: {n_boxes} track boxes, max box error {max_err:.2e} px",
            path.display()
        );
    }
}

fn moving(x: f32) -> Detection {
    det(&[x as f64, 100.0, x as f64 + 20.0, 140.0, 0.9, 0.0])
}

#[test]
fn frame_gaps_predict_by_the_real_gap() {
    // An object moving 8 px per frame, seen on every frame for 10 frames, then on every 4th
    // frame (32 px apart, more than its 20 px width: without the k-step prediction the IoU with
    // the one-step prediction would be small). It keeps ID 1 and the filtered box follows it.
    let mut tr = ByteTracker::new(TrackerConfig::default()).unwrap();
    let mut frame = 1u64;
    while frame <= 40 {
        let x = 8.0 * frame as f32;
        let got = tr.update(&[moving(x)], frame).unwrap();
        if frame > 1 {
            assert_eq!(got.len(), 1, "frame {frame}");
            assert_eq!(got[0].id, 1, "frame {frame}");
            assert!(
                (got[0].bbox[0] - x).abs() < 2.0,
                "frame {frame}: {:?}",
                got[0].bbox
            );
        }
        frame += if frame < 10 { 1 } else { 4 };
    }
    // After 10 consecutive frames the object is seen 4 frames later (x + 32 px): with the real
    // index the 4-step prediction meets it (ID 1); the same box given as the next frame (the gap
    // hidden) is 24 px ahead of the one-step prediction, the track is lost and the box starts
    // an unconfirmed track (nothing confirmed on that frame).
    for (index, want) in [(14u64, Some(1u64)), (11, None)] {
        let mut tr = ByteTracker::new(TrackerConfig::default()).unwrap();
        for f in 1..=10u64 {
            tr.update(&[moving(8.0 * f as f32)], f).unwrap();
        }
        let got = tr.update(&[moving(8.0 * 14.0)], index).unwrap();
        assert_eq!(got.first().map(|t| t.id), want, "frame index {index}");
    }
}

#[test]
fn lost_buffer_counts_source_frames() {
    // frame_rate 10 → buffer 10 frames. Seen on frames 1-3, then again at frame 3 + 13 (past
    // the buffer and the one late frame): a new ID. Seen again within the buffer: the same ID.
    let cfg = TrackerConfig {
        frame_rate: 10.0,
        ..TrackerConfig::default()
    };
    assert_eq!(cfg.max_time_lost(), 10);
    let still = det(&[100.0, 100.0, 140.0, 180.0, 0.9, 0.0]);
    let mut tr = ByteTracker::new(cfg).unwrap();
    for f in 1..=3 {
        assert_eq!(tr.update(std::slice::from_ref(&still), f).unwrap()[0].id, 1);
    }
    // Frames 4..=12 without the object (within the buffer), then back at 13.
    for f in 4..=12 {
        assert!(tr.update(&[], f).unwrap().is_empty());
    }
    assert_eq!(
        tr.update(std::slice::from_ref(&still), 13).unwrap()[0].id,
        1
    );
    // Lost from frame 14; the update of frame 28 (28 − 13 > 10) removes it. As the authors',
    // a track removed on frame t can still be found on frame t + 1 (it leaves the lost list
    // one frame late)...
    assert!(tr.update(&[], 14).unwrap().is_empty());
    let mut late = tr.clone();
    assert!(tr.update(&[], 28).unwrap().is_empty());
    assert_eq!(
        tr.update(std::slice::from_ref(&still), 29).unwrap()[0].id,
        1
    );
    // ...but not after a frame gap: at frame 31 it is gone, a new track starts (confirmed on
    // its second frame).
    assert!(late.update(&[], 28).unwrap().is_empty());
    assert!(late
        .update(std::slice::from_ref(&still), 31)
        .unwrap()
        .is_empty());
    assert_eq!(late.update(&[still], 32).unwrap()[0].id, 2);
}

#[test]
fn refuses_bad_input() {
    let mut tr = ByteTracker::new(TrackerConfig::default()).unwrap();
    tr.update(&[], 5).unwrap();
    assert_eq!(
        tr.update(&[], 5).unwrap_err(),
        TrackError::FrameOrder { frame: 5, last: 5 }
    );
    let bad = det(&[f64::NAN, 0.0, 1.0, 1.0, 0.9, 0.0]);
    let e = tr.update(&[bad], 6).unwrap_err().to_string();
    assert!(e.contains("detection 0 of frame 6"), "{e}");
    let cfg = TrackerConfig {
        track_low_thresh: 0.7,
        ..TrackerConfig::default()
    };
    let e = ByteTracker::new(cfg).unwrap_err().to_string();
    assert!(e.contains("--track-low-thresh 0.7"), "{e}");
    let cfg = TrackerConfig {
        match_thresh: 1.5,
        ..TrackerConfig::default()
    };
    assert!(ByteTracker::new(cfg).is_err());
    // Degenerate boxes are ignored, not tracked.
    let flat = det(&[10.0, 10.0, 10.0, 30.0, 0.9, 0.0]);
    assert!(tr.update(&[flat], 7).unwrap().is_empty());
}

#[test]
fn tracker_is_send() {
    fn is_send<T: Send + 'static>() {}
    is_send::<ByteTracker>();
}

#[test]
fn mot_metrics_match_motmetrics() {
    // tests/detect/track_mot_case.json: 3 objects over 12 frames (ID switches, a fragment whose
    // old ID comes back, misses, false positives, a box under the IoU limit) and
    // py-motmetrics' summary of it (benches/track_oracle.py --mot-case).
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/detect/track_mot_case.json");
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let boxes = |v: &serde_json::Value| -> Vec<(u64, [f32; 4])> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let r: Vec<f64> = r
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect();
                let (x, y, w, h) = (r[1] as f32, r[2] as f32, r[3] as f32, r[4] as f32);
                (r[0] as u64, [x, y, x + w, y + h])
            })
            .collect()
    };
    let mut acc = yolo9::track::mot::Accumulator::default();
    for f in j["frames"].as_array().unwrap() {
        acc.update(&boxes(&f["gt"]), &boxes(&f["hyp"]));
    }
    let s = acc.summary();
    let m = &j["motmetrics"];
    let v = |k: &str| m[k].as_f64().unwrap();
    assert_eq!(s.frames as f64, v("num_frames"));
    assert_eq!(s.objects as f64, v("num_objects"));
    assert_eq!(s.hypotheses as f64, v("num_predictions"));
    // motmetrics' `num_matches` leaves out the pairs that are switches.
    assert_eq!(s.matches as f64, v("num_matches") + v("num_switches"));
    assert_eq!(s.misses as f64, v("num_misses"));
    assert_eq!(s.false_positives as f64, v("num_false_positives"));
    assert_eq!(s.id_switches as f64, v("num_switches"));
    assert_eq!(s.idtp as f64, v("idtp"));
    for (got, k) in [
        (s.mota, "mota"),
        (s.idf1, "idf1"),
        (s.idp, "idp"),
        (s.idr, "idr"),
    ] {
        assert!((got - v(k)).abs() < 1e-12, "{k}: {got} vs {}", v(k));
    }
}
