//! Training pictures: the first batches as the network sees them ([`plot_train_batch`], official
//! `plot_images`), and the training curves as a PNG (official `utils/plots.py::plot_results` layout): ten panels, two
//! rows of five — train box/cls/dfl loss, precision, recall; val box/cls/dfl loss, mAP50,
//! mAP50-95 — against the epoch, one line per run. `yolo9 train` writes `results.png` in the
//! run folder after every epoch; `yolo9 plot` draws several `results.csv` files (ours or the
//! official trainer's, whose column names differ) into one figure for comparison.

pub use crate::train::report::{read_results_csv, Curves, PANELS};
use anyhow::{bail, Result};
use plotters::prelude::*;
use std::path::Path;

/// Line colours of the runs, in order.
const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

/// Draws `runs` into a 2 × 5 panel PNG at `out` (2000 × 800 pixels). Errors: no run, or the
/// file cannot be written.
pub fn plot_results(runs: &[Curves], out: &Path) -> Result<()> {
    if runs.is_empty() {
        bail!("plot: no results to draw");
    }
    crate::metrics::plots::register_font();
    let (w, h) = (2000u32, 800u32);
    let mut buf = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        let areas = root.split_evenly((2, 5));
        for (p, area) in areas.iter().enumerate() {
            let (title, _) = PANELS[p];
            let (mut xmin, mut xmax) = (f64::INFINITY, f64::NEG_INFINITY);
            let (mut ymin, mut ymax) = (f64::INFINITY, f64::NEG_INFINITY);
            for r in runs {
                if let Some(s) = &r.series[p] {
                    for (x, y) in r.epochs.iter().zip(s) {
                        if y.is_finite() && x.is_finite() {
                            xmin = xmin.min(*x);
                            xmax = xmax.max(*x);
                            ymin = ymin.min(*y);
                            ymax = ymax.max(*y);
                        }
                    }
                }
            }
            if !ymin.is_finite() {
                (xmin, xmax, ymin, ymax) = (0.0, 1.0, 0.0, 1.0);
            }
            // Half an epoch either side, so the markers of the first and last epoch (the only
            // one, in a run of one epoch) are drawn whole inside the panel.
            let (xmin, xmax) = (xmin.min(0.0) - 0.5, xmax.max(1.0) + 0.5);
            if ymax - ymin < 1e-9 {
                ymax = ymin + 1.0;
            }
            let pad = 0.05 * (ymax - ymin);
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 18))
                .margin(8)
                .x_label_area_size(24)
                .y_label_area_size(48)
                .build_cartesian_2d(xmin..xmax, (ymin - pad)..(ymax + pad))
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
            chart
                .configure_mesh()
                .label_style(("sans-serif", 12))
                .light_line_style(WHITE.mix(0.0))
                .draw()
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
            for (k, r) in runs.iter().enumerate() {
                let Some(s) = &r.series[p] else { continue };
                let color = COLORS[k % COLORS.len()];
                let pts: Vec<(f64, f64)> = r
                    .epochs
                    .iter()
                    .zip(s)
                    .filter(|(_, y)| y.is_finite())
                    .map(|(x, y)| (*x, *y))
                    .collect();
                // A marker at every epoch, so a run of one epoch (no line) still shows.
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
                let series = chart
                    .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                    .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
                if p == 0 {
                    series.label(r.label.clone()).legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                    });
                }
            }
            if p == 0 {
                chart
                    .configure_series_labels()
                    .label_font(("sans-serif", 13))
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .draw()
                    .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
            }
        }
        root.present().map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    }
    crate::metrics::plots::save_rgb(buf, (w, h), out)
}

/// `train_batch<k>.jpg` (the official `plot_images`): up to 16 images of a loader batch, as the
/// network sees them (mosaic and augmentation included), in a square grid with their label boxes
/// and class names, scaled to at most 1920 pixels a side. Users find label errors this way.
///
/// `images`: `B × 3 × S × S` RGB bytes (CHW per image); `targets`: `[img, cls, cx, cy, w, h]`
/// normalized to `S`.
///
/// Errors: the file cannot be written.
pub fn plot_train_batch(
    images: &[u8],
    len: usize,
    size: u32,
    targets: &[[f32; 6]],
    names: &[String],
    out: &Path,
) -> Result<()> {
    let n = len.min(16);
    if n == 0 || size == 0 {
        bail!("plot: an empty batch");
    }
    let s = size as usize;
    let f = size as f32;
    let tiles: Vec<_> = (0..n)
        .map(|k| {
            let px = &images[k * 3 * s * s..(k + 1) * 3 * s * s];
            let img = image::RgbImage::from_fn(size, size, |x, y| {
                let i = y as usize * s + x as usize;
                image::Rgb([px[i], px[s * s + i], px[2 * s * s + i]])
            });
            let dets: Vec<crate::detect::detector::Detection> = targets
                .iter()
                .filter(|r| r[0] as usize == k)
                .map(|r| {
                    let c = r[1] as usize;
                    crate::detect::detector::Detection {
                        class_id: c,
                        class_name: names.get(c).cloned().unwrap_or_else(|| format!("{c}")),
                        confidence: 1.0,
                        bbox: [
                            (r[2] - r[4] / 2.0) * f,
                            (r[3] - r[5] / 2.0) * f,
                            (r[2] + r[4] / 2.0) * f,
                            (r[3] + r[5] / 2.0) * f,
                        ],
                        mask: None,
                    }
                })
                .collect();
            (img, dets)
        })
        .collect();
    crate::metrics::plots::plot_mosaic(&tiles, true, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn train_batch_tiles_the_images_and_draws_their_labels() {
        // Two 64x64 grey images; one label on the second: a 2x2 grid of 64-pixel tiles.
        let (s, n) = (64usize, 2usize);
        let images = vec![128u8; n * 3 * s * s];
        let targets = [[1.0f32, 0.0, 0.5, 0.5, 0.5, 0.5]];
        let dir = std::env::temp_dir().join(format!("yolo9-tb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("train_batch0.jpg");
        plot_train_batch(&images, n, s as u32, &targets, &["cell".to_string()], &p).unwrap();
        let img = image::open(&p).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), (128, 128));
        // The box of the second tile (x 64..128, y 0..64) spans 80..112; grey elsewhere on its
        // edge row, and the tiles below stay white.
        let far =
            |a: &image::Rgb<u8>, b: [u8; 3]| a.0.iter().zip(b).any(|(x, y)| x.abs_diff(y) > 40);
        assert!(
            far(img.get_pixel(96, 16), [128, 128, 128]),
            "the box edge is drawn"
        );
        assert!(
            !far(img.get_pixel(70, 40), [128, 128, 128]),
            "inside the tile, no box"
        );
        assert!(
            !far(img.get_pixel(20, 100), [255, 255, 255]),
            "an empty grid cell is white"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A run of one epoch has no line to draw: every panel still shows its point.
    #[test]
    fn one_epoch_draws_a_point_in_every_panel() {
        let dir = std::env::temp_dir().join(format!("yolo9-plots-one-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let csv = dir.join("results.csv");
        std::fs::write(
            &csv,
            format!(
                "{}\n0,4.6,5.1,5.3,0.01,0.1,0.002,0.0005,1,2,3,0.1,0.001,0.001,1,2,0,0,0,16\n",
                crate::train::report::RESULTS_HEADER
            ),
        )
        .unwrap();
        let c = read_results_csv(&csv, "one").unwrap();
        assert_eq!(c.epochs, vec![0.0]);
        let png = dir.join("results.png");
        plot_results(&[c], &png).unwrap();
        let img = image::open(&png).unwrap().to_rgb8();
        // Panels are 400 x 400 (2 rows of 5); count the run's colour in each.
        for row in 0..2u32 {
            for col in 0..5u32 {
                let n = (0..400u32)
                    .flat_map(|y| (0..400u32).map(move |x| (col * 400 + x, row * 400 + y)))
                    .filter(|&(x, y)| img.get_pixel(x, y).0 == [31, 119, 180])
                    .count();
                // A filled circle of radius 3 has about 29 pixels.
                assert!(
                    n >= 20,
                    "panel ({row}, {col}): {n} pixels of the run's colour"
                );
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reads_both_csv_dialects_and_draws() {
        let dir = std::env::temp_dir().join(format!("yolo9-plots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ours = dir.join("ours.csv");
        std::fs::write(
            &ours,
            format!(
                "{}\n0,4.6,5.1,5.3,0.01,0.1,0.002,0.0005,1,2,3,0.1,0.001,0.001,1,2,0,0,0,16\n\
                 1,4.4,5.0,5.2,0.02,0.2,0.004,0.0010,1,2,3,0.1,0.001,0.001,1,2,0,0,0,16\n",
                crate::train::report::RESULTS_HEADER
            ),
        )
        .unwrap();
        let official = dir.join("official.csv");
        std::fs::write(
            &official,
            "   epoch,  train/box_loss,  train/cls_loss,  train/dfl_loss,  metrics/precision,  metrics/recall,  metrics/mAP_0.5,metrics/mAP_0.5:0.95,  val/box_loss,  val/cls_loss,  val/dfl_loss,  x/lr0,  x/lr1,  x/lr2\n\
                  0,  4.48,  5.26,  5.30,  0.0026,  0.094,  0.0026,  0.00057,  0,  0,  0,  0.089,  0.0012,  0.0012\n",
        )
        .unwrap();
        let a = read_results_csv(&ours, "yolo9").unwrap();
        let b = read_results_csv(&official, "official").unwrap();
        assert_eq!(a.epochs, vec![0.0, 1.0]);
        assert_eq!(a.series[9].as_ref().unwrap(), &vec![0.0005, 0.0010]);
        assert_eq!(b.series[8].as_ref().unwrap(), &vec![0.0026]);
        assert_eq!(b.series[9].as_ref().unwrap(), &vec![0.00057]);
        let png = dir.join("curves.png");
        plot_results(&[a, b], &png).unwrap();
        let img = image::open(&png).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), (2000, 800));
        // Both line colours are present.
        let has = |c: [u8; 3]| img.pixels().any(|p| p.0 == c);
        assert!(has([31, 119, 180]) && has([255, 127, 14]));
        std::fs::write(&ours, "epoch,train/box_loss\n0,abc\n").unwrap();
        let e = format!("{:#}", read_results_csv(&ours, "x").unwrap_err());
        assert!(e.contains("ours.csv:2") && e.contains("abc"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
