//! Pictures of a validation run (drawn with plotters into PNG files), as the official
//! `utils/metrics.py` plots: `confusion_matrix.png` (counts) and `confusion_matrix_normalized.png`
//! (each true class's column divided by its total, `ConfusionMatrix.plot(normalize=True)`), rows
//! the predicted class, columns the true class, "background" last; `PR_curve.png`
//! (`plot_pr_curve`) and `F1_curve.png`, `P_curve.png`, `R_curve.png` (`plot_mc_curve`) from the
//! curves of [`super::ap::ap_per_class`].
//!
//! Why one file (about 640 lines of code, then its unit tests): every picture of a validation run
//! shares the plotters set-up, the colours and the file writing.

use anyhow::{Context, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::Path;

use super::confusion::ConfusionMatrix;

static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSansMono-Bold.ttf");

/// Registers the plots' font under "sans-serif" (idempotent; the training plots use it too).
pub fn register_font() {
    let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
}

/// Writes a drawn RGB buffer of `size` (width, height) as the image file `out` (format by
/// extension). Errors: a buffer of another size, the file cannot be written.
pub fn save_rgb(buf: Vec<u8>, size: (u32, u32), out: &Path) -> Result<()> {
    let img = image::RgbImage::from_raw(size.0, size.1, buf).context("plot: buffer size")?;
    crate::outfile::save_image(&img, out, &crate::outfile::Inputs::none())
        .with_context(|| format!("{}: cannot write the plot", crate::text::path(&out)))
}

/// The white-to-blue colour of `v` in `0..=1` (matplotlib's "Blues", approximately).
fn blues(v: f64) -> RGBColor {
    let t = v.clamp(0.0, 1.0);
    let lerp = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    RGBColor(lerp(247.0, 8.0), lerp(251.0, 48.0), lerp(255.0, 107.0))
}

/// Draws `cm` (`normalize`: column fractions, else counts) with class `names` into `out`.
///
/// Errors: the file cannot be written.
pub fn plot_confusion_matrix(
    cm: &ConfusionMatrix,
    names: &[String],
    normalize: bool,
    out: &Path,
) -> Result<()> {
    register_font();
    let n = cm.nc + 1;
    let values = if normalize {
        cm.normalized()
    } else {
        cm.matrix.clone()
    };
    let vmax = values
        .iter()
        .flatten()
        .fold(0f64, |a, &b| a.max(b))
        .max(1e-9);
    let mut labels: Vec<String> = names.iter().take(cm.nc).cloned().collect();
    labels.resize(cm.nc, String::new());
    labels.push("background".into());
    let side = (120 + 90 * n as u32).clamp(600, 2400);
    let (w, h) = (side + 160, side + 60);
    let mut buf = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        let title = if normalize {
            "Confusion matrix (normalized by true class)"
        } else {
            "Confusion matrix (counts)"
        };
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(70)
            .y_label_area_size(150)
            // A segmented 0..k has k + 1 cells: 0..n-1 gives the n rows and columns.
            .build_cartesian_2d(
                (0..n as i32 - 1).into_segmented(),
                (0..n as i32 - 1).into_segmented(),
            )
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        // One label at the centre of each cell; row 0 (the first predicted class) at the top.
        let name_of = |v: &SegmentValue<i32>, flip: bool| match v {
            SegmentValue::CenterOf(i) => {
                let i = if flip { n as i32 - 1 - *i } else { *i };
                labels.get(i as usize).cloned().unwrap_or_default()
            }
            _ => String::new(),
        };
        let xf = |v: &SegmentValue<i32>| name_of(v, false);
        let yf = |v: &SegmentValue<i32>| name_of(v, true);
        chart
            .configure_mesh()
            .disable_mesh()
            .x_labels(n + 1)
            .y_labels(n + 1)
            .x_label_formatter(&xf)
            .y_label_formatter(&yf)
            .x_desc("True")
            .y_desc("Predicted")
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 18))
            .draw()
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        for (r, row) in values.iter().enumerate() {
            for (c, &v) in row.iter().enumerate() {
                let (x0, y0) = (c as i32, (n - 1 - r) as i32);
                let color = blues(v / vmax);
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [
                            (SegmentValue::Exact(x0), SegmentValue::Exact(y0)),
                            (SegmentValue::Exact(x0 + 1), SegmentValue::Exact(y0 + 1)),
                        ],
                        color.filled(),
                    )))
                    .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
                // As the official plot: no annotation below 0.005 (normalized) or for 0 counts.
                let shown = if normalize { v >= 0.005 } else { v > 0.0 };
                if shown {
                    let text = if normalize {
                        format!("{v:.2}")
                    } else {
                        format!("{v:.0}")
                    };
                    let ink = if v / vmax > 0.5 { WHITE } else { BLACK };
                    let style = TextStyle::from(("sans-serif", 18).into_font())
                        .color(&ink)
                        .pos(plotters::style::text_anchor::Pos::new(
                            plotters::style::text_anchor::HPos::Center,
                            plotters::style::text_anchor::VPos::Center,
                        ));
                    chart
                        .draw_series(std::iter::once(Text::new(
                            text,
                            (SegmentValue::CenterOf(x0), SegmentValue::CenterOf(y0)),
                            style,
                        )))
                        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
                }
            }
        }
        root.present().map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    }
    save_rgb(buf, (w, h), out)
}

/// Colours of the per-class lines (cycled), and the thick "all classes" line.
const CLASS_COLORS: [RGBColor; 6] = [
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
];
const ALL_COLOR: RGBColor = RGBColor(31, 119, 180);

/// One line of a curve figure: legend label, colour, stroke width, points.
type Line = (String, RGBColor, u32, Vec<(f64, f64)>);

/// One curve figure: `lines` on 0..1 x 0..1 axes.
fn curve_figure(title: &str, xdesc: &str, ydesc: &str, lines: &[Line], out: &Path) -> Result<()> {
    register_font();
    let (w, h) = (900u32, 700u32);
    let mut buf = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..1f64, 0f64..1.02f64)
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        chart
            .configure_mesh()
            .x_desc(xdesc)
            .y_desc(ydesc)
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 18))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        for (label, color, width, pts) in lines {
            let (c, wd) = (*color, *width);
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(wd)))
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?
                .label(label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(wd))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        root.present().map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    }
    save_rgb(buf, (w, h), out)
}

/// The name of class `c` for a legend.
fn class_name(names: &[String], c: usize) -> String {
    names.get(c).cloned().unwrap_or_else(|| format!("class{c}"))
}

/// `PR_curve.png`: precision against recall at IoU 0.5 per class (legend: AP50) and their mean
/// ("all classes", legend: mAP50), the official `plot_pr_curve`.
///
/// Errors: the file cannot be written.
pub fn plot_pr_curve(ap: &super::ap::ApPerClass, names: &[String], out: &Path) -> Result<()> {
    let c = &ap.curves;
    let mut lines = Vec::new();
    for (k, (&cls, row)) in ap.classes.iter().zip(&c.pr).enumerate() {
        let pts = c.px.iter().copied().zip(row.iter().copied()).collect();
        let label = format!("{} {:.3}", class_name(names, cls), ap.ap[k][0]);
        lines.push((label, CLASS_COLORS[k % CLASS_COLORS.len()], 1, pts));
    }
    if !c.pr.is_empty() {
        let mean = mean_rows(&c.pr);
        let map50 = ap.ap.iter().map(|a| a[0]).sum::<f64>() / ap.ap.len() as f64;
        let pts = c.px.iter().copied().zip(mean).collect();
        lines.push((format!("all classes {map50:.3} mAP@0.5"), ALL_COLOR, 3, pts));
    }
    curve_figure("Precision-Recall curve", "Recall", "Precision", &lines, out)
}

/// `F1_curve.png`, `P_curve.png` or `R_curve.png` (`which` = "F1", "Precision", "Recall"):
/// the metric against the confidence threshold per class and their mean, smoothed as the
/// official `plot_mc_curve` (legend: the mean's maximum and where it is).
///
/// Errors: an unknown `which`, the file cannot be written.
pub fn plot_mc_curve(
    ap: &super::ap::ApPerClass,
    names: &[String],
    which: &str,
    out: &Path,
) -> Result<()> {
    let c = &ap.curves;
    let rows = match which {
        "F1" => &c.f1,
        "Precision" => &c.p,
        "Recall" => &c.r,
        other => anyhow::bail!("plot: unknown curve {other:?}"),
    };
    let mut lines = Vec::new();
    for (k, (&cls, row)) in ap.classes.iter().zip(rows).enumerate() {
        let pts = c.px.iter().copied().zip(row.iter().copied()).collect();
        lines.push((
            class_name(names, cls),
            CLASS_COLORS[k % CLASS_COLORS.len()],
            1,
            pts,
        ));
    }
    if !rows.is_empty() {
        let mean = super::ap::smooth(&mean_rows(rows), 0.05);
        let (i, m) = mean
            .iter()
            .enumerate()
            .fold((0, f64::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b });
        let label = format!("all classes {m:.2} at {:.3}", c.px[i]);
        let pts = c.px.iter().copied().zip(mean).collect();
        lines.push((label, ALL_COLOR, 3, pts));
    }
    curve_figure(
        &format!("{which}-Confidence curve"),
        "Confidence",
        which,
        &lines,
        out,
    )
}

/// Column means of equal-length rows.
fn mean_rows(rows: &[Vec<f64>]) -> Vec<f64> {
    let n = rows.len() as f64;
    (0..rows[0].len())
        .map(|k| rows.iter().map(|r| r[k]).sum::<f64>() / n)
        .collect()
}

/// Every picture of a validation run into `dir`: the two confusion matrices (when `cm` is given)
/// and the PR, F1, P and R curves. Returns the files written.
///
/// Errors: a file cannot be written.
pub fn plot_validation(
    dir: &Path,
    ap: &super::ap::ApPerClass,
    cm: Option<&ConfusionMatrix>,
    names: &[String],
) -> Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    if let Some(cm) = cm {
        for (normalize, file) in [
            (false, "confusion_matrix.png"),
            (true, "confusion_matrix_normalized.png"),
        ] {
            plot_confusion_matrix(cm, names, normalize, &dir.join(file))?;
            out.push(dir.join(file));
        }
    }
    plot_pr_curve(ap, names, &dir.join("PR_curve.png"))?;
    out.push(dir.join("PR_curve.png"));
    for (which, file) in [
        ("F1", "F1_curve.png"),
        ("Precision", "P_curve.png"),
        ("Recall", "R_curve.png"),
    ] {
        plot_mc_curve(ap, names, which, &dir.join(file))?;
        out.push(dir.join(file));
    }
    Ok(out)
}

/// The mosaic of the official `plot_images`: up to 16 `tiles` (each an image and its boxes in
/// that image's pixels) in a square grid of `ceil(sqrt(n))` cells, every cell the size of the
/// first image scaled so that the grid is at most 1920 pixels a side; each image is fitted into
/// its cell (aspect kept, grey 114 around it, as a letterboxed batch) and its boxes drawn with
/// [`crate::detect::draw::draw_detections`] (`hide_conf`: labels without the confidence).
/// `train_batch*.jpg`, `val_batch*_labels.jpg` and `val_batch*_pred.jpg` are drawn with it.
///
/// Errors: no tile, or the file cannot be written.
pub fn plot_mosaic(
    tiles: &[(image::RgbImage, Vec<crate::detect::detector::Detection>)],
    hide_conf: bool,
    out: &Path,
) -> Result<()> {
    use crate::detect::draw::{draw_detections, DrawOptions};
    let n = tiles.len().min(16);
    anyhow::ensure!(n > 0, "plot: an empty batch");
    let (w0, h0) = tiles[0].0.dimensions();
    anyhow::ensure!(w0 > 0 && h0 > 0, "plot: an empty image");
    let grid = (n as f64).sqrt().ceil() as u32;
    let scale = (1920.0 / (grid * w0.max(h0)) as f64).min(1.0);
    let (tw, th) = (
        ((w0 as f64 * scale).round() as u32).max(1),
        ((h0 as f64 * scale).round() as u32).max(1),
    );
    let mut canvas = image::RgbImage::from_pixel(grid * tw, grid * th, image::Rgb([255; 3]));
    let opts = DrawOptions {
        line_thickness: 2,
        hide_labels: false,
        hide_conf,
    };
    for (k, (img, dets)) in tiles.iter().take(n).enumerate() {
        let (w, h) = img.dimensions();
        let r = (tw as f64 / w.max(1) as f64).min(th as f64 / h.max(1) as f64);
        let (nw, nh) = (
            ((w as f64 * r).round() as u32).clamp(1, tw),
            ((h as f64 * r).round() as u32).clamp(1, th),
        );
        let (ox, oy) = ((tw - nw) / 2, (th - nh) / 2);
        let mut cell = image::RgbImage::from_pixel(tw, th, image::Rgb([114; 3]));
        let resized = if (nw, nh) == (w, h) {
            img.clone()
        } else {
            image::imageops::resize(img, nw, nh, image::imageops::FilterType::Triangle)
        };
        image::imageops::replace(&mut cell, &resized, ox as i64, oy as i64);
        let moved: Vec<_> = dets
            .iter()
            .map(|d| {
                let mut d = d.clone();
                let (sx, sy) = (nw as f32 / w.max(1) as f32, nh as f32 / h.max(1) as f32);
                d.bbox = [
                    d.bbox[0] * sx + ox as f32,
                    d.bbox[1] * sy + oy as f32,
                    d.bbox[2] * sx + ox as f32,
                    d.bbox[3] * sy + oy as f32,
                ];
                d
            })
            .collect();
        draw_detections(&mut cell, &moved, 1.0, &opts)?;
        let (gx, gy) = ((k as u32 % grid) * tw, (k as u32 / grid) * th);
        image::imageops::replace(&mut canvas, &cell, gx as i64, gy as i64);
    }
    crate::outfile::save_image(&canvas, out, &crate::outfile::Inputs::none())
        .with_context(|| format!("{}: cannot write the plot", crate::text::path(&out)))?;
    Ok(())
}

/// Confidence above which a prediction is drawn in `val_batch*_pred.jpg` (official
/// `plot_images` `conf_thres`).
pub const PLOT_CONF: f32 = 0.25;

/// `val_batch{k}_labels.jpg` and `val_batch{k}_pred.jpg`, k = 0..2 (official `val_dual.py`
/// `plot_images` of the first three batches): the first 16 images of each validation batch of
/// `batch` images, in the order validated (`dets`, by aspect ratio as the rect batches), with
/// their labels (class names) and with their predictions of confidence above [`PLOT_CONF`]
/// (`name 0.87`). Images are read again from their files (skipped when they no longer decode).
/// Returns the files written.
///
/// Errors: a file cannot be written.
pub fn plot_val_batches(
    dir: &Path,
    images: &[super::validate::ValImage],
    dets: &[super::validate::ImageDetections],
    batch: usize,
    names: &[String],
) -> Result<Vec<std::path::PathBuf>> {
    use crate::detect::detector::Detection;
    let det = |cls: f32, conf: f32, b: [f32; 4]| {
        let c = cls as usize;
        Detection {
            class_id: c,
            class_name: names.get(c).cloned().unwrap_or_else(|| format!("{c}")),
            confidence: conf,
            bbox: b,
            mask: None,
        }
    };
    let mut out = Vec::new();
    for (k, chunk) in dets.chunks(batch.max(1)).take(3).enumerate() {
        let mut labels = Vec::new();
        let mut preds = Vec::new();
        for im in chunk.iter().take(16) {
            let Some(vi) = images.get(im.image) else {
                continue;
            };
            let Ok(img) = crate::data::image::load_rgb8(&vi.path) else {
                continue;
            };
            let l: Vec<Detection> = im
                .labels
                .iter()
                .map(|l| det(l[0], 1.0, [l[1], l[2], l[3], l[4]]))
                .collect();
            let p: Vec<Detection> = im
                .dets
                .iter()
                .filter(|d| d[4] > PLOT_CONF)
                .map(|d| det(d[5], d[4], [d[0], d[1], d[2], d[3]]))
                .collect();
            labels.push((img.clone(), l));
            preds.push((img, p));
        }
        if labels.is_empty() {
            continue;
        }
        for (tiles, hide_conf, file) in [
            (&labels, true, format!("val_batch{k}_labels.jpg")),
            (&preds, false, format!("val_batch{k}_pred.jpg")),
        ] {
            plot_mosaic(tiles, hide_conf, &dir.join(&file))?;
            out.push(dir.join(file));
        }
    }
    Ok(out)
}

/// Bins per axis of the `labels.jpg` 2-D histograms.
pub const LABEL_BINS: usize = 50;

/// What `labels.jpg` shows (official `plot_labels`, without seaborn's correlogram): boxes per
/// class, and `LABEL_BINS × LABEL_BINS` histograms of the box centres (x, y) and sizes
/// (width, height), normalized coordinates in `[0, 1]` (row = y or height bin, column = x or
/// width bin; a value of 1 falls in the last bin).
#[derive(Debug, Clone, PartialEq)]
pub struct LabelStats {
    /// Boxes per class (`nc` entries).
    pub per_class: Vec<usize>,
    /// Centre histogram, `[y_bin][x_bin]`.
    pub xy: Vec<Vec<usize>>,
    /// Size histogram, `[h_bin][w_bin]`.
    pub wh: Vec<Vec<usize>>,
    /// Boxes counted.
    pub boxes: usize,
}

impl LabelStats {
    /// The statistics of `boxes` (`(cls, [cx, cy, w, h])`, normalized) for `nc` classes;
    /// classes ≥ `nc` are left out.
    pub fn new<'a>(boxes: impl IntoIterator<Item = &'a (u32, [f32; 4])>, nc: usize) -> LabelStats {
        let bin = |v: f32| ((v.clamp(0.0, 1.0) * LABEL_BINS as f32) as usize).min(LABEL_BINS - 1);
        let mut s = LabelStats {
            per_class: vec![0; nc],
            xy: vec![vec![0; LABEL_BINS]; LABEL_BINS],
            wh: vec![vec![0; LABEL_BINS]; LABEL_BINS],
            boxes: 0,
        };
        for (c, b) in boxes {
            let Some(n) = s.per_class.get_mut(*c as usize) else {
                continue;
            };
            *n += 1;
            s.xy[bin(b[1])][bin(b[0])] += 1;
            s.wh[bin(b[3])][bin(b[2])] += 1;
            s.boxes += 1;
        }
        s
    }
}

/// `labels.jpg` (official `plot_labels`, a 2 × 2 figure of 1600 × 1600 pixels): the number of
/// boxes per class (bars, class names below), up to 1000 of the boxes drawn as outlines centred
/// in a unit square (their sizes at a glance), and the [`LabelStats`] histograms of the box
/// centres x–y and sizes width–height (darker = more boxes). `boxes`: `(cls, [cx, cy, w, h])`
/// normalized. Returns the statistics drawn.
///
/// Errors: the file cannot be written.
pub fn plot_labels(boxes: &[(u32, [f32; 4])], names: &[String], out: &Path) -> Result<LabelStats> {
    register_font();
    let stats = LabelStats::new(boxes, names.len());
    let (w, h) = (1600u32, 1600u32);
    let mut buf = vec![255u8; (w * h * 3) as usize];
    let e = |e: &dyn std::fmt::Display| anyhow::anyhow!("plot: {e}");
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let areas = root.split_evenly((2, 2));
        // (0, 0): boxes per class
        let nc = names.len().max(1);
        let top = stats.per_class.iter().copied().max().unwrap_or(0).max(1) as f64 * 1.05;
        let mut chart = ChartBuilder::on(&areas[0])
            .caption(
                format!("{} boxes per class", stats.boxes),
                ("sans-serif", 24),
            )
            .margin(16)
            .x_label_area_size(if nc > 12 { 110 } else { 40 })
            .y_label_area_size(70)
            .build_cartesian_2d((0..nc.max(2) - 1).into_segmented(), 0f64..top)
            .map_err(|x| e(&x))?;
        let label_names = names.to_vec();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(WHITE.mix(0.0))
            .x_labels(nc.min(40))
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => label_names.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .x_label_style(if nc > 12 {
                ("sans-serif", 13)
                    .into_font()
                    .transform(FontTransform::Rotate90)
            } else {
                ("sans-serif", 16).into_font()
            })
            .y_desc("instances")
            .label_style(("sans-serif", 16))
            .draw()
            .map_err(|x| e(&x))?;
        chart
            .draw_series(stats.per_class.iter().enumerate().map(|(c, &n)| {
                let col = crate::detect::draw::class_color(c);
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(c), 0.0),
                        (SegmentValue::Exact(c + 1), n as f64),
                    ],
                    RGBColor(col[0], col[1], col[2]).filled(),
                );
                bar.set_margin(0, 0, 6, 6);
                bar
            }))
            .map_err(|x| e(&x))?;
        // (0, 1): box outlines centred
        let mut chart = ChartBuilder::on(&areas[1])
            .caption("boxes (centred)", ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..1f64, 1f64..0f64)
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .disable_mesh()
            .label_style(("sans-serif", 16))
            .draw()
            .map_err(|x| e(&x))?;
        chart
            .draw_series(boxes.iter().take(1000).map(|(c, b)| {
                let col = crate::detect::draw::class_color(*c as usize);
                Rectangle::new(
                    [
                        (0.5 - b[2] as f64 / 2.0, 0.5 - b[3] as f64 / 2.0),
                        (0.5 + b[2] as f64 / 2.0, 0.5 + b[3] as f64 / 2.0),
                    ],
                    RGBColor(col[0], col[1], col[2]).mix(0.4).stroke_width(1),
                )
            }))
            .map_err(|x| e(&x))?;
        // (1, 0) and (1, 1): the two histograms
        for (area, hist, title, xd, yd, flip) in [
            (&areas[2], &stats.xy, "box centres", "x", "y", true),
            (&areas[3], &stats.wh, "box sizes", "width", "height", false),
        ] {
            let peak = hist.iter().flatten().copied().max().unwrap_or(0).max(1) as f64;
            let yr = if flip { 1f64..0f64 } else { 0f64..1f64 };
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 24))
                .margin(16)
                .x_label_area_size(50)
                .y_label_area_size(70)
                .build_cartesian_2d(0f64..1f64, yr)
                .map_err(|x| e(&x))?;
            chart
                .configure_mesh()
                .disable_mesh()
                .x_desc(xd)
                .y_desc(yd)
                .label_style(("sans-serif", 16))
                .draw()
                .map_err(|x| e(&x))?;
            let step = 1.0 / LABEL_BINS as f64;
            chart
                .draw_series(hist.iter().enumerate().flat_map(|(r, row)| {
                    row.iter()
                        .enumerate()
                        .filter(|(_, &v)| v > 0)
                        .map(move |(c, &v)| {
                            // square root: the few crowded bins do not wash out the rest
                            let t = 0.15 + 0.85 * (v as f64 / peak).sqrt();
                            Rectangle::new(
                                [
                                    (c as f64 * step, r as f64 * step),
                                    ((c + 1) as f64 * step, (r + 1) as f64 * step),
                                ],
                                blues(t).filled(),
                            )
                        })
                }))
                .map_err(|x| e(&x))?;
        }
        root.present().map_err(|x| e(&x))?;
    }
    save_rgb(buf, (w, h), out)?;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("yolo9-plots-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn label_stats_count_every_box_once() {
        let boxes = [
            (0u32, [0.5f32, 0.5, 0.1, 0.2]),
            (2, [0.0, 1.0, 1.0, 0.019]),
            (2, [0.5, 0.5, 0.1, 0.2]),
            (7, [0.5, 0.5, 0.1, 0.2]), // class ≥ nc: left out
        ];
        let s = LabelStats::new(&boxes, 3);
        assert_eq!(s.per_class, vec![1, 0, 2]);
        assert_eq!(s.boxes, 3);
        assert_eq!(s.xy[25][25], 2, "centre 0.5 → bin 25");
        assert_eq!(s.xy[49][0], 1, "x 0 → first bin, y 1 → last bin");
        assert_eq!(s.wh[10][5], 2, "w 0.1 → bin 5, h 0.2 → bin 10");
        assert_eq!(s.wh[0][49], 1);
        let total: usize = s.xy.iter().flatten().sum();
        assert_eq!(total, 3);
        let total: usize = s.wh.iter().flatten().sum();
        assert_eq!(total, 3);
        // the picture: 1600 x 1600, not blank, the same numbers returned
        let d = tmp("labels");
        let names = ["RBC", "WBC", "Platelets"].map(String::from);
        let drawn = plot_labels(&boxes, &names, &d.join("labels.jpg")).unwrap();
        assert_eq!(drawn, s);
        let img = image::open(d.join("labels.jpg")).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), (1600, 1600));
        assert!(
            img.pixels().any(|p| p[2] as i32 > p[0] as i32 + 60),
            "blue cells drawn"
        );
    }

    #[test]
    fn val_batches_draw_labels_and_confident_predictions() {
        use super::super::validate::{ImageDetections, ValImage};
        let d = tmp("valbatch");
        // An image of its own (a unit test does not read ../shared, which CI may keep elsewhere).
        let shared = d.join("BloodImage_00000.jpg");
        image::RgbImage::from_pixel(640, 480, image::Rgb([200, 120, 120]))
            .save(&shared)
            .unwrap();
        let (w, h) = image::image_dimensions(&shared).unwrap();
        let images: Vec<ValImage> = (0..5)
            .map(|_| ValImage {
                path: shared.clone(),
                width: w,
                height: h,
                labels: vec![],
                outlines: vec![],
            })
            .collect();
        let dets: Vec<ImageDetections> = (0..5)
            .map(|i| ImageDetections {
                image: i,
                dets: vec![
                    [10.0, 10.0, 200.0, 200.0, 0.9, 0.0],
                    [300.0, 10.0, 400.0, 100.0, 0.2, 1.0], // below 0.25: not drawn
                ],
                labels: vec![[1.0, 300.0, 200.0, 500.0, 400.0]],
            })
            .collect();
        let names = ["RBC", "WBC"].map(String::from);
        // batches of 2: three batches drawn (images 0-1, 2-3, 4), each labels + pred
        let files = plot_val_batches(&d, &images, &dets, 2, &names).unwrap();
        let got: Vec<String> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            got,
            [
                "val_batch0_labels.jpg",
                "val_batch0_pred.jpg",
                "val_batch1_labels.jpg",
                "val_batch1_pred.jpg",
                "val_batch2_labels.jpg",
                "val_batch2_pred.jpg"
            ]
        );
        // two images in a 2 x 2 grid of full-size cells; one image: a single cell
        let b0 = image::open(d.join("val_batch0_pred.jpg"))
            .unwrap()
            .to_rgb8();
        assert_eq!(b0.dimensions(), (2 * w, 2 * h));
        let b2 = image::open(d.join("val_batch2_labels.jpg"))
            .unwrap()
            .to_rgb8();
        assert_eq!(b2.dimensions(), (w, h));
        // the confident prediction's outline (class 0 colour) on the pred picture at x = 10,
        // the 0.2 one not drawn (its left edge at x = 300, y = 50 is the photo's colour)
        let c0 = crate::detect::draw::class_color(0);
        let c1 = crate::detect::draw::class_color(1);
        let near = |p: &image::Rgb<u8>, c: image::Rgb<u8>| {
            (0..3).all(|k| (p[k] as i32 - c[k] as i32).abs() < 40)
        };
        assert!(near(b0.get_pixel(10, 120), c0));
        assert!(!near(b0.get_pixel(300, 60), c1));
        // the label (class 1) outline on the labels picture at x = 300
        let l0 = image::open(d.join("val_batch0_labels.jpg"))
            .unwrap()
            .to_rgb8();
        assert!(near(l0.get_pixel(300, 300), c1));
    }
}
