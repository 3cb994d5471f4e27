//! The confusion matrix (official `ConfusionMatrix`, conf 0.25 / IoU 0.45) on hand-made images,
//! its agreement with the per-class recall of the same matching, and its pictures.
use crate::common;

use yolo9::internals::metrics::confusion::ConfusionMatrix;
use yolo9::internals::metrics::plots::plot_confusion_matrix;

#[test]
fn hand_cases_land_in_the_right_cells() {
    let mut cm = ConfusionMatrix::new(2);
    // Image 1: label 0 found as 0; label 1 found as 0 (wrong class); a detection of class 1 on
    // nothing (background FP); a detection below conf 0.25 ignored.
    cm.process_batch(
        &[
            [10., 10., 50., 50., 0.9, 0.],
            [100., 100., 150., 150., 0.8, 0.],
            [200., 200., 220., 220., 0.7, 1.],
            [10., 10., 50., 50., 0.2, 1.],
        ],
        &[[0., 11., 11., 50., 50.], [1., 100., 100., 152., 150.]],
    );
    // Image 2: a label with no detection (missed).
    cm.process_batch(&[], &[[1., 0., 0., 30., 30.]]);
    // Image 3: two detections on one label: the best IoU keeps it, the other is a background FP.
    cm.process_batch(
        &[[0., 0., 40., 40., 0.9, 1.], [0., 0., 30., 40., 0.95, 1.]],
        &[[1., 0., 0., 40., 40.]],
    );
    // Image 4: a detection and no label: not counted (the official `if n:` quirk, no match).
    cm.process_batch(&[[0., 0., 10., 10., 0.9, 0.]], &[]);
    let want = vec![
        vec![1.0, 1.0, 0.0], // predicted 0: true 0, true 1 (wrong class)
        vec![0.0, 1.0, 2.0], // predicted 1: true 1; background FPs (image 1, image 3)
        vec![0.0, 1.0, 0.0], // predicted background: the missed label of image 2
    ];
    assert_eq!(cm.matrix, want);
    let n = cm.normalized();
    assert!((n[0][1] - 1.0 / 3.0).abs() < 1e-9 && (n[2][1] - 1.0 / 3.0).abs() < 1e-9);
    // Column sums are the labels per class; the diagonal over it is the recall at these
    // thresholds.
    let labels: Vec<f64> = (0..3)
        .map(|c| (0..3).map(|r| cm.matrix[r][c]).sum())
        .collect();
    assert_eq!(labels, [1.0, 3.0, 2.0]);
}

#[test]
fn plots_are_written_and_colour_the_cells_by_value() {
    let mut cm = ConfusionMatrix::new(3);
    cm.matrix = vec![
        vec![50.0, 0.0, 0.0, 5.0],
        vec![0.0, 9.0, 1.0, 1.0],
        vec![2.0, 0.0, 7.0, 0.0],
        vec![8.0, 1.0, 2.0, 0.0],
    ];
    let names: Vec<String> = ["RBC", "WBC", "Platelets"].map(String::from).into();
    let dir = common::tmpdir("metrics_confusion");
    for (normalize, file) in [(false, "counts.png"), (true, "normalized.png")] {
        let p = dir.join(file);
        plot_confusion_matrix(&cm, &names, normalize, &p).unwrap();
        let img = image::open(&p).unwrap().to_rgb8();
        assert!(img.width() >= 600 && img.height() >= 600);
        // The darkest cell colour (the largest value) and white both appear.
        let dark = img.pixels().filter(|p| p.0 == [8, 48, 107]).count();
        assert!(
            dark > 1000,
            "{file}: {dark} pixels of the largest value's colour"
        );
        assert!(img.pixels().any(|p| p.0 == [255, 255, 255]));
    }
    if let Ok(keep) = std::env::var("YOLO9_KEEP_PLOTS") {
        for f in ["counts.png", "normalized.png"] {
            std::fs::copy(dir.join(f), std::path::Path::new(&keep).join(f)).unwrap();
        }
    }
}

/// The curves of `ap_per_class` agree with its numbers (P, R and F1 at the chosen confidence are
/// points of the curves; the area under each class's PR curve is its AP50 up to the sampling), and
/// the four curve pictures are written.
#[test]
fn curves_agree_with_the_numbers_and_are_drawn() {
    use yolo9::internals::metrics::ap::{ap_per_class, N_IOU};
    // Two classes, 40 predictions with a seeded mix of hits and misses.
    let mut s = 7u64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % 10_000) as f32 / 10_000.0
    };
    let (mut tp, mut conf, mut cls) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..40 {
        let c = rnd();
        let hit = rnd() < c;
        tp.push([hit; N_IOU]);
        conf.push(c);
        cls.push((i % 2) as u32);
    }
    let targets: Vec<u32> = (0..30).map(|i| (i % 2) as u32).collect();
    let ap = ap_per_class(&tp, &conf, &cls, &targets);
    let c = &ap.curves;
    assert_eq!(c.px.len(), 1000);
    assert_eq!((c.p.len(), c.r.len(), c.f1.len(), c.pr.len()), (2, 2, 2, 2));
    for k in 0..2 {
        let at = (0..1000)
            .find(|&i| c.p[k][i] == ap.p[k] && c.r[k][i] == ap.r[k])
            .expect("P and R are read off the curves");
        assert_eq!(c.f1[k][at], ap.f1[k]);
        let area: f64 = (0..999)
            .map(|i| (c.px[i + 1] - c.px[i]) * (c.pr[k][i] + c.pr[k][i + 1]) / 2.0)
            .sum();
        assert!(
            (area - ap.ap[k][0]).abs() < 0.01,
            "class {k}: {area} vs {}",
            ap.ap[k][0]
        );
    }
    let dir = common::tmpdir("metrics_curves");
    let names: Vec<String> = ["a", "b"].map(String::from).into();
    let files = yolo9::internals::metrics::plots::plot_validation(&dir, &ap, None, &names).unwrap();
    assert_eq!(files.len(), 4);
    for f in &files {
        let img = image::open(f).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), (900, 700), "{}", f.display());
        // The thick "all classes" line is drawn.
        assert!(
            img.pixels().any(|p| p.0 == [31, 119, 180]),
            "{}",
            f.display()
        );
    }
    if let Ok(keep) = std::env::var("YOLO9_KEEP_PLOTS") {
        for f in &files {
            std::fs::copy(f, std::path::Path::new(&keep).join(f.file_name().unwrap())).unwrap();
        }
    }
}
