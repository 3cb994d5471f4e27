//! `yolo9 detect --save-crop` (official `save_one_box(gain=1.02, pad=10)`): the crop geometry by
//! hand, clipping at the border, and the CLI's crops/<class>/<stem>.jpg files, one per detection.
use crate::common;

use image::{Rgb, RgbImage};
use yolo9::detect::draw::crop_box;

fn gradient(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| Rgb([x as u8, y as u8, (x + y) as u8]))
}

#[test]
fn crop_geometry_follows_save_one_box() {
    let img = gradient(100, 80);
    // Box 20 x 30 centred at (20, 35): 30.4 x 40.6 after the gain and pad, so x 4.8..35.2 and
    // y 14.7..55.3, truncated to 4..35 and 14..55.
    let c = crop_box(&img, [10.0, 20.0, 30.0, 50.0]).unwrap();
    assert_eq!(c.dimensions(), (31, 41));
    assert_eq!(*c.get_pixel(0, 0), Rgb([4, 14, 18]));
    assert_eq!(*c.get_pixel(30, 40), Rgb([34, 54, 88]));
    // Clipped at the top-left corner: -10.15..15.15 → 0..15.
    let c = crop_box(&img, [-5.0, -5.0, 10.0, 10.0]).unwrap();
    assert_eq!(c.dimensions(), (15, 15));
    assert_eq!(*c.get_pixel(0, 0), Rgb([0, 0, 0]));
    // Clipped at the bottom-right corner: 84.9..105.1 and 64.9..85.1 → 84..100 and 64..80.
    let c = crop_box(&img, [90.0, 70.0, 100.0, 80.0]).unwrap();
    assert_eq!(c.dimensions(), (16, 16));
    assert_eq!(*c.get_pixel(0, 0), Rgb([84, 64, 148]));
    assert_eq!(*c.get_pixel(15, 15), Rgb([99, 79, 178]));
    // Entirely outside: nothing.
    assert!(crop_box(&img, [200.0, 200.0, 210.0, 210.0]).is_none());
}

#[test]
fn save_crop_writes_one_file_per_detection_by_class() {
    let dir = common::tmpdir("detect_crops");
    let img = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/images/BloodImage_00007.jpg"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_yolo9"))
        .args([
            "detect",
            img,
            "--save-crop",
            "--json",
            "--nosave",
            "--device",
            "cpu",
        ])
        .args(["--project", dir.to_str().unwrap(), "--name", "c"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = dir.join("c");
    let dets: Vec<serde_json::Value> = std::fs::read_to_string(run.join("predictions.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(dets.len() > 3);
    let mut total = 0;
    for class in ["RBC", "WBC", "Platelets"] {
        let want = dets.iter().filter(|d| d["class_name"] == class).count();
        let folder = run.join("crops").join(class);
        let mut files: Vec<String> = std::fs::read_dir(&folder)
            .map(|rd| {
                rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        assert_eq!(files.len(), want, "{class}: {files:?}");
        if want > 0 {
            assert!(
                files.contains(&"BloodImage_00007.jpg".to_string()),
                "{files:?}"
            );
        }
        if want > 1 {
            assert!(
                files.contains(&"BloodImage_000072.jpg".to_string()),
                "{files:?}"
            );
        }
        total += files.len();
    }
    assert_eq!(total, dets.len());
    assert!(
        !run.join("BloodImage_00007.jpg").exists(),
        "--nosave draws nothing"
    );
}
