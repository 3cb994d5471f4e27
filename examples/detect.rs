//! Embedding `yolo9::Detector` in a Rust program.
//!
//! ```text
//! cargo run --example detect -- weights/yolov9-s-bccd.safetensors image.jpg [more.jpg ...]
//! ```
//! Loads the weights once, then prints one line per detection: image, class, confidence and the
//! box in original pixels. Decoding goes through `yolo9::data::image::load_rgb8` so EXIF
//! orientation and colour modes are handled like `yolo9 detect`.
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::sync::Arc;

fn main() -> Result<()> {
    let mut args = std::env::args_os().skip(1).map(PathBuf::from);
    let weights = args
        .next()
        .context("usage: detect WEIGHTS IMAGE [IMAGE ...]")?;
    let images: Vec<PathBuf> = args.collect();
    if images.is_empty() {
        anyhow::bail!("usage: detect WEIGHTS IMAGE [IMAGE ...] (no image given)");
    }
    // One detector shared by threads: Detector is Send + Sync.
    let config = yolo9::DetectorConfig {
        conf: 0.25,
        iou: 0.45,
        img_size: 640,
        ..Default::default()
    };
    let detector = Arc::new(yolo9::Detector::new(
        &weights,
        candle_core::Device::Cpu,
        config,
    )?);
    let handles: Vec<_> = images
        .into_iter()
        .map(|path| {
            let det = Arc::clone(&detector);
            std::thread::spawn(move || -> Result<()> {
                let rgb = yolo9::data::image::load_rgb8(&path)?;
                let dets = det.detect(&image::DynamicImage::ImageRgb8(rgb))?;
                for d in dets {
                    println!(
                        "{}\t{}\t{:.3}\t[{:.1}, {:.1}, {:.1}, {:.1}]",
                        path.display(),
                        d.class_name,
                        d.confidence,
                        d.bbox[0],
                        d.bbox[1],
                        d.bbox[2],
                        d.bbox[3]
                    );
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        match h.join() {
            Ok(r) => r?,
            Err(_) => anyhow::bail!("a detection thread panicked"),
        }
    }
    Ok(())
}
