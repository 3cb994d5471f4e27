//! Pictures of a validation run (drawn with plotters into PNG files), as the official
//! `utils/metrics.py` plots: `confusion_matrix.png` (counts) and `confusion_matrix_normalized.png`
//! (each true class's column divided by its total, `ConfusionMatrix.plot(normalize=True)`), rows
//! the predicted class, columns the true class, "background" last; `PR_curve.png`
//! (`plot_pr_curve`) and `F1_curve.png`, `P_curve.png`, `R_curve.png` (`plot_mc_curve`) from the
//! curves of [`super::ap::ap_per_class`].

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
    img.save(out)
        .with_context(|| format!("{}: cannot write the plot", out.display()))
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
