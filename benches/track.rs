//! ByteTrack update time per frame (`yolo9::track::byte::ByteTracker`), with the detector's own
//! time per frame beside it:
//! `cargo bench --bench track -- [--dets 100] [--frames 2000] [--weights W] [--image IMG]
//! [--img 640] [--det-iters 5]`.
//!
//! The tracker runs on one core (it is single-threaded): `--dets` objects moving at constant
//! velocities with box noise, a few detections missing or low-score each frame and a few
//! false positives, for `--frames` frames after a 50-frame warm-up; prints the mean and the
//! 99th percentile of `update`. Then the detector (the built-in BCCD weights unless
//! `--weights`) on `--image` at `--img`, one thread and all threads, median of `--det-iters`
//! (decode of the JPEG excluded: the same frame as an RGB image each time, as a video gives).
//! One line each: `track dets=100 frames=2000 mean_ms=.. p99_ms=..`, `detect threads=T
//! img=640 ms=..`.

use anyhow::{Context, Result};
use candle_core::Device;
use std::path::PathBuf;
use std::time::Instant;
use yolo9::track::byte::{ByteTracker, TrackerConfig};
use yolo9::{Detection, Detector, DetectorConfig};

/// A small deterministic generator (xorshift64*), so the bench needs no seed crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32) / (1u64 << 24) as f32
    }
}

fn main() -> Result<()> {
    let mut n_dets = 100usize;
    let mut frames = 2000usize;
    let mut weights: Option<PathBuf> = None;
    let mut image = PathBuf::from("examples/images/BloodImage_00007.jpg");
    let mut img = 640u32;
    let mut det_iters = 5usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--dets" => n_dets = val()?.parse()?,
            "--frames" => frames = val()?.parse()?,
            "--weights" => weights = Some(val()?.into()),
            "--image" => image = val()?.into(),
            "--img" => img = val()?.parse()?,
            "--det-iters" => det_iters = val()?.parse()?,
            _ => {}
        }
    }

    // Objects on a 1920x1080 frame, 30x60 px, 1-4 px per frame, bouncing off the edges.
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut objs: Vec<[f32; 4]> = (0..n_dets)
        .map(|_| {
            [
                rng.next() * 1880.0,
                rng.next() * 1000.0,
                (rng.next() - 0.5) * 8.0,
                (rng.next() - 0.5) * 8.0,
            ]
        })
        .collect();
    let mut tracker = ByteTracker::new(TrackerConfig::default())?;
    let mut times = Vec::with_capacity(frames);
    let mut tracked = 0usize;
    for f in 0..frames + 50 {
        let mut dets = Vec::with_capacity(n_dets + 3);
        for o in objs.iter_mut() {
            o[0] += o[2];
            o[1] += o[3];
            if !(0.0..1890.0).contains(&o[0]) {
                o[2] = -o[2];
            }
            if !(0.0..1020.0).contains(&o[1]) {
                o[3] = -o[3];
            }
            let r = rng.next();
            if r < 0.03 {
                continue;
            }
            let score = if r < 0.08 {
                0.3
            } else {
                0.7 + 0.25 * rng.next()
            };
            let (x, y) = (o[0] + (rng.next() - 0.5), o[1] + (rng.next() - 0.5));
            dets.push(Detection {
                class_id: 0,
                class_name: String::new(),
                confidence: score,
                bbox: [x, y, x + 30.0, y + 60.0],
                mask: None,
            });
        }
        for _ in 0..3 {
            let (x, y) = (rng.next() * 1880.0, rng.next() * 1000.0);
            dets.push(Detection {
                class_id: 1,
                class_name: String::new(),
                confidence: 0.2 + 0.5 * rng.next(),
                bbox: [x, y, x + 25.0, y + 25.0],
                mask: None,
            });
        }
        let t0 = Instant::now();
        let out = tracker.update(&dets, f as u64 + 1)?;
        let dt = t0.elapsed().as_secs_f64() * 1e3;
        if f >= 50 {
            times.push(dt);
            tracked += out.len();
        }
    }
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    times.sort_by(|a, b| a.total_cmp(b));
    let p99 = times[(times.len() * 99 / 100).min(times.len() - 1)];
    println!(
        "track dets={n_dets} frames={frames} mean_ms={mean:.4} p99_ms={p99:.4} tracks_per_frame={:.1}",
        tracked as f64 / frames as f64
    );

    let w = match &weights {
        Some(p) => yolo9::Weights::load(p)?,
        None => yolo9::Weights::builtin()?,
    };
    let rgb = image::open(&image)
        .with_context(|| format!("{}", image.display()))?
        .to_rgb8();
    for threads in [1usize, 0] {
        let config = DetectorConfig {
            img_size: img,
            threads,
            ..DetectorConfig::default()
        };
        let det = Detector::with_weights(&w, Device::Cpu, config)?;
        det.detect_rgb(&rgb)?;
        let mut t = Vec::new();
        for _ in 0..det_iters {
            let t0 = Instant::now();
            det.detect_rgb(&rgb)?;
            t.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        t.sort_by(|a, b| a.total_cmp(b));
        let label = if threads == 0 {
            format!("all({})", yolo9::internals::model::cpu::default_threads())
        } else {
            threads.to_string()
        };
        println!("detect threads={label} img={img} ms={:.1}", t[t.len() / 2]);
    }
    Ok(())
}
