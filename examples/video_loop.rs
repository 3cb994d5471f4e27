//! Detection on every frame of a video, a webcam or a stream, in your own loop: what to copy
//! when `yolo9 detect VIDEO|0|rtsp://...` does more than you need. Frames are decoded by the
//! `ffmpeg` program (install FFmpeg); nothing else is needed.
//!
//! ```text
//! cargo run --release --example video_loop -- clip.mp4
//! cargo run --release --example video_loop -- rtsp://camera.local/stream1 weights/yolov9-s-bccd.safetensors
//! ```
//! A video file gives every frame in order ([`FrameReader`]); a webcam index or a stream URL
//! gives the newest frame each time ([`LiveReader`]: when detection is slower than the stream,
//! the frames in between are dropped, never queued) and is reopened when it breaks.
use anyhow::Result;
use yolo9::cancel::Cancel;
use yolo9::detect::stream::{LiveReader, StreamOptions, StreamSource};
use yolo9::detect::video::{probe, FrameReader};
use yolo9::Detector;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let source = args
        .next()
        .unwrap_or("examples/images/BloodImage_00007.jpg".into());
    let weights = args
        .next()
        .unwrap_or("weights/yolov9-s-bccd.safetensors".into());
    let device = yolo9::device::select(yolo9::device::DeviceSpec::Auto)?;
    let det = Detector::load(&weights, device)?;
    // What to do with one frame's detections: here, print them.
    let on_frame = |n: u64, img: &image::RgbImage| -> Result<()> {
        let dets = det.detect_rgb(img)?;
        let names: Vec<String> = dets
            .iter()
            .map(|d| format!("{} {:.2}", d.class_name, d.confidence))
            .collect();
        println!("frame {n}: {} boxes [{}]", dets.len(), names.join(", "));
        Ok(())
    };
    if let Some(stream) = StreamSource::parse(&source) {
        let mut reader = LiveReader::open(stream, StreamOptions::default())?;
        // Cancel::new(|| flag.load(..)) stops the loop from elsewhere (a signal, a UI button).
        while let Some(f) = reader.next(&Cancel::never())? {
            on_frame(f.frame, &f.image)?;
        }
        let s = reader.stats();
        println!(
            "{} frames read, {} detected, {} dropped",
            s.read, s.delivered, s.dropped
        );
    } else {
        let info = probe(source.as_ref())?;
        let mut reader = FrameReader::open(source.as_ref(), &info)?;
        let mut n = 0;
        while let Some(img) = reader.next_frame()? {
            n += 1;
            on_frame(n, &img)?;
        }
        if let Some(msg) = reader.finish() {
            eprintln!("ffmpeg: {msg}");
        }
    }
    Ok(())
}
