//! Re-measures the per-pixel constants of `yolo9::internals::footprint` on the CPU (yolov9-s, process RSS
//! peak) and asserts they are floors: every measured point needs at least the stated bytes per
//! pixel, so the up-front size check never refuses a size that fits. Slow (about 4 minutes on 2
//! cores) and sensitive to other load, hence ignored by default:
//! `cargo test --test memory footprint_floor -- --ignored --nocapture`.
//! Measured 2026-12-02 (2 cores, 23 GiB): inference 229, 306, 168, 196 B/px at 320, 640, 1280,
//! 1920 (again: 228, 196, 196, 196); training 2545 and 2638 B/px/image at 256 and 512 (again:
//! 2638, 2543).
use candle_core::{Device, Tensor};
use yolo9::internals::footprint::{INFER_BYTES_PER_PIXEL, TRAIN_BYTES_PER_PIXEL};
use yolo9::internals::memory::MemoryProbe;

/// One test (the RSS is the process's: two tests running at once would disturb each other).
#[test]
#[ignore = "slow measurement; run with --ignored"]
fn the_stated_bytes_per_pixel_are_floors_of_the_measured_need() {
    let _alone = crate::alone();
    inference_needs_at_least_the_stated_bytes_per_pixel();
    a_training_step_needs_at_least_the_stated_bytes_per_pixel_per_image();
}

fn inference_needs_at_least_the_stated_bytes_per_pixel() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/weights/yolov9-s-bccd.safetensors"
    );
    let w = yolo9::model::weights::Weights::load(path).unwrap();
    let dev = Device::Cpu;
    let m = yolo9::internals::model::yolov9::YoloV9::load(&w, &dev).unwrap();
    let probe = MemoryProbe::new(&dev).unwrap();
    for s in [320usize, 640, 1280, 1920] {
        probe.release_cached();
        let before = probe.current_bytes();
        probe.reset_peak();
        let x = Tensor::rand(0f32, 1f32, (1, 3, s, s), &dev).unwrap();
        let y = m.forward(&x).unwrap();
        let _ = y.sum_all().unwrap().to_vec0::<f32>().unwrap();
        let per_px = probe.peak_bytes().saturating_sub(before) as f64 / (s * s) as f64;
        println!("inference --img {s}: {per_px:.1} bytes per pixel");
        assert!(per_px >= INFER_BYTES_PER_PIXEL as f64, "{s}: {per_px}");
    }
}

fn a_training_step_needs_at_least_the_stated_bytes_per_pixel_per_image() {
    let arch = yolo9::model::Arch::from_cfg("yolov9-s").unwrap();
    let dev = Device::Cpu;
    let probe = MemoryProbe::new(&dev).unwrap();
    for img in [256u32, 512] {
        let req = yolo9::internals::train::budget::BudgetRequest {
            nc: 3,
            img,
            targets_per_image: 100,
            max_batch: 4,
            budget: 200 << 30,
            seed: 0,
            amp: false,
            arch: arch.clone(),
            graphs: false,
            fixed_batch: true,
        };
        let d = yolo9::internals::train::budget::plan(&req, &dev, &probe).unwrap();
        let per_px = d.fit.per_image / (img as f64 * img as f64);
        println!(
            "training --img {img}: {}; {per_px:.1} B/px/image",
            d.describe()
        );
        assert!(per_px >= TRAIN_BYTES_PER_PIXEL as f64, "{img}: {per_px}");
    }
}
