//! Pictures of a validation run (drawn with plotters into PNG files):
//! `confusion_matrix.png` (counts) and `confusion_matrix_normalized.png` (each true class's column
//! divided by its total, the official `ConfusionMatrix.plot(normalize=True)`), rows the predicted
//! class, columns the true class, "background" last.

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
    let img = image::RgbImage::from_raw(w, h, buf).context("plot: buffer size")?;
    img.save(out)
        .with_context(|| format!("{}: cannot write the plot", out.display()))?;
    Ok(())
}
