//! What `yolo9 detect` (and a program doing the same) writes for each image or frame: the
//! [`Sinks`] of a run folder (`labels/<stem>.txt`, `predictions.jsonl`, `crops/`), chosen by
//! [`SinkOptions`]; the `--save-txt` label line (official format, numbers as Python's `%g`), the
//! per-image count summary, output names that never overwrite one another, the annotated image's
//! file name and the `--save-crop` crops. The command line (`crate::cli::detect`) derives its
//! output flags from [`SinkOptions`] and runs the sources through one [`Sinks`].
use crate::boxes::xyxy_to_yolo;
use crate::detect::detector::Detection;
use crate::detect::draw::DrawOptions;
use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Which outputs a detection run writes into its run folder (the output flags of `yolo9
/// detect`, derived from this struct). All off by default except the annotated images.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct SinkOptions {
    /// Save YOLO label files (labels/<stem>.txt).
    #[cfg_attr(feature = "cli", arg(long = "save-txt"))]
    pub save_txt: bool,
    /// Add the confidence to --save-txt lines.
    #[cfg_attr(feature = "cli", arg(long = "save-conf"))]
    pub save_conf: bool,
    /// Write predictions.jsonl (one detection per line, original pixels).
    #[cfg_attr(feature = "cli", arg(long))]
    pub json: bool,
    /// Save each detection's crop as crops/<class name>/<stem>.jpg (official --save-crop: the
    /// box widened by 2% + 10 px; repeated names get 2, 3, ...).
    #[cfg_attr(feature = "cli", arg(long = "save-crop"))]
    pub save_crop: bool,
    /// Do not save annotated images (or videos).
    #[cfg_attr(feature = "cli", arg(long))]
    pub nosave: bool,
    /// How the annotated images are drawn.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub draw: DrawOptions,
}

impl SinkOptions {
    /// Whether anything is written (and so a run folder is needed).
    pub fn saving(&self) -> bool {
        !self.nosave || self.save_txt || self.json || self.save_crop
    }
}

/// One image or frame handed to [`Sinks::write`].
#[derive(Debug, Clone, Copy)]
pub struct Item<'a> {
    /// The source as written in `predictions.jsonl` (`image`): the file path, or the name of a
    /// video or stream.
    pub source: &'a str,
    /// The output stem ([`unique_stems`]): labels go to `labels/<stem>.txt` (a frame's to
    /// `labels/<stem>_<frame>.txt`), crops to `crops/<class>/<stem>.jpg`.
    pub stem: &'a str,
    /// The frame number of a video or stream (from 1); `None` for an image. Written as `frame`
    /// in `predictions.jsonl`, whose lines are then flushed at once (a stream may run until it
    /// is stopped).
    pub frame: Option<u64>,
    /// The image's size in original pixels `(w, h)` (the label lines are normalized by it).
    pub size: (u32, u32),
}

/// The writers of one run folder: `labels/<stem>.txt` (`--save-txt`), `predictions.jsonl`
/// (`--json`) and `crops/` (`--save-crop`), shared by the images, videos and streams of a run.
/// The annotated images and videos are the caller's (they differ by source kind).
pub struct Sinks {
    dir: PathBuf,
    opts: SinkOptions,
    jsonl: Option<std::io::BufWriter<std::fs::File>>,
    labels: usize,
}

impl Sinks {
    /// Sinks writing into the run folder `dir` (which exists when `opts` saves anything):
    /// creates `labels/` and `predictions.jsonl` as `opts` asks.
    ///
    /// Errors: a folder or file that cannot be created, named.
    pub fn open(dir: &Path, opts: SinkOptions) -> Result<Sinks> {
        if opts.save_txt {
            let labels = dir.join("labels");
            std::fs::create_dir_all(&labels)
                .with_context(|| format!("cannot create {}", crate::text::path(&labels)))?;
        }
        let jsonl = if opts.json {
            let p = dir.join("predictions.jsonl");
            // Grows as images and frames are detected (a stream may never end), so it is opened
            // in place, after the refusals of every output (not an input, a regular file).
            let f = crate::outfile::create_stream(&p, &crate::outfile::Inputs::none())?;
            Some(std::io::BufWriter::new(f))
        } else {
            None
        };
        Ok(Sinks {
            dir: dir.to_path_buf(),
            opts,
            jsonl,
            labels: 0,
        })
    }

    /// The run folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The options.
    pub fn options(&self) -> &SinkOptions {
        &self.opts
    }

    /// Writes `dets` of `item`: its label file (when there are detections), its
    /// `predictions.jsonl` lines, and with `--save-crop` the crops of `full` (the original
    /// pixels; needed only then, so a caller may drop them early otherwise).
    ///
    /// Errors: a file that cannot be written, named.
    pub fn write(
        &mut self,
        item: Item<'_>,
        dets: &[Detection],
        full: Option<&image::RgbImage>,
    ) -> Result<()> {
        let (w, h) = item.size;
        if self.opts.save_txt && !dets.is_empty() {
            let name = match item.frame {
                Some(f) => format!("{}_{f}.txt", item.stem),
                None => format!("{}.txt", item.stem),
            };
            let lp = self.dir.join("labels").join(name);
            let text: String = dets
                .iter()
                .map(|d| label_line(d, w, h, self.opts.save_conf) + "\n")
                .collect();
            crate::outfile::write(&lp, text.as_bytes(), &crate::outfile::Inputs::none())?;
            self.labels += 1;
        }
        if let Some(out) = self.jsonl.as_mut() {
            for d in dets {
                let mut line = serde_json::json!({
                    "image": item.source,
                    "class_id": d.class_id,
                    "class_name": d.class_name,
                    "confidence": d.confidence,
                    "xyxy": d.bbox,
                });
                if let Some(f) = item.frame {
                    line["frame"] = f.into();
                }
                if let Some(m) = &d.mask {
                    // The outline in original pixels, [[x, y], …].
                    line["polygon"] = serde_json::json!(m.polygon);
                }
                writeln!(out, "{line}").context("writing predictions.jsonl")?;
            }
            if item.frame.is_some() {
                out.flush().context("writing predictions.jsonl")?;
            }
        }
        if self.opts.save_crop {
            if let Some(img) = full {
                save_crops(&self.dir, img, dets, item.stem)?;
            }
        }
        Ok(())
    }

    /// Label files written so far.
    pub fn labels_written(&self) -> usize {
        self.labels
    }

    /// Flushes `predictions.jsonl`; returns the number of label files written.
    ///
    /// Errors: the flush failed.
    pub fn finish(mut self) -> Result<usize> {
        if let Some(out) = self.jsonl.as_mut() {
            out.flush().context("writing predictions.jsonl")?;
        }
        Ok(self.labels)
    }
}

/// Formats a number like C/Python `'%g'` (6 significant digits, trailing zeros removed,
/// exponent form below 1e-4 or from 1e6).
pub fn fmt_g(x: f64) -> String {
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.into();
    }
    if !x.is_finite() {
        return if x.is_nan() {
            "nan".into()
        } else if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    let e = format!("{x:.5e}");
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let strip = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        format!(
            "{}e{}{:02}",
            strip(mant),
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    } else {
        strip(&format!("{:.*}", (5 - exp) as usize, x))
    }
}

/// One label line `cls cx cy w h [conf]` for a detection on a `w x h` image, as the official
/// detect `--save-txt`: box rounded to whole pixels (detect.py rounds the scaled boxes), then
/// [`yolo_line`].
///
/// A detection with a mask writes its outline instead, as the official `segment/predict.py
/// --save-txt`: `cls x1 y1 x2 y2 … [conf]`, the polygon's points normalized by the image size.
pub fn label_line(d: &Detection, w: u32, h: u32, with_conf: bool) -> String {
    if let Some(m) = d.mask.as_ref().filter(|m| !m.polygon.is_empty()) {
        let mut s = format!("{}", d.class_id);
        for p in &m.polygon {
            s.push(' ');
            s.push_str(&fmt_g(f64::from(p[0]) / f64::from(w.max(1))));
            s.push(' ');
            s.push_str(&fmt_g(f64::from(p[1]) / f64::from(h.max(1))));
        }
        if with_conf {
            s.push(' ');
            s.push_str(&fmt_g(f64::from(d.confidence)));
        }
        return s;
    }
    let b = d.bbox.map(|v| v.round_ties_even());
    yolo_line(d.class_id, b, d.confidence, w, h, with_conf)
}

/// The label-line writer of `--save-txt` (detect and val): `cls cx cy w h [conf]` for box
/// `xyxy` (original-image pixels) of a `w x h` image, normalized, each number as `%g` (the
/// official `('%g ' * len(line)).rstrip() % line`). `yolo9 val --save-txt` passes its boxes
/// unrounded, as the official `val_dual.py save_one_txt`.
pub fn yolo_line(
    class_id: usize,
    xyxy: [f32; 4],
    conf: f32,
    w: u32,
    h: u32,
    with_conf: bool,
) -> String {
    let y = xyxy_to_yolo(xyxy, w, h);
    let mut s = format!("{class_id}");
    for v in y {
        s.push(' ');
        s.push_str(&fmt_g(f64::from(v)));
    }
    if with_conf {
        s.push(' ');
        s.push_str(&fmt_g(f64::from(conf)));
    }
    s
}

/// `25 RBC, 2 WBC` (counts by class id order) or `(no detections)`.
pub fn count_summary(dets: &[Detection], names: &[String]) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for d in dets {
        *counts.entry(d.class_id).or_insert(0usize) += 1;
    }
    if counts.is_empty() {
        return "(no detections)".into();
    }
    counts
        .into_iter()
        .map(|(c, n)| {
            let name = names.get(c).cloned().unwrap_or_else(|| format!("class{c}"));
            format!("{n} {name}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The annotated image's file name for input `p` saved under the output stem `stem`: the
/// input's extension when it is jpg/jpeg/png/bmp, else `stem.<ext>.jpg` (`stem.jpg` without an
/// extension).
pub fn annotated_name(p: &Path, stem: &str) -> PathBuf {
    PathBuf::from(match p.extension().and_then(|e| e.to_str()) {
        Some(e)
            if matches!(
                e.to_ascii_lowercase().as_str(),
                "jpg" | "jpeg" | "png" | "bmp"
            ) =>
        {
            format!("{stem}.{e}")
        }
        Some(e) => format!("{stem}.{e}.jpg"),
        None => format!("{stem}.jpg"),
    })
}

/// One output stem per input, unique within the run: the file stem, or `stem_2`, `stem_3`, ...
/// (the first free one) when an earlier input already uses it, so `a/same.jpg`, `b/same.png` and
/// `c/same.png` give three label files and three drawn images instead of overwriting each other.
pub fn unique_stems(files: &[PathBuf]) -> Vec<String> {
    let mut taken = std::collections::HashSet::new();
    files
        .iter()
        .map(|p| {
            let base = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "image".into());
            let mut name = base.clone();
            let mut k = 2;
            while !taken.insert(name.clone()) {
                name = format!("{base}_{k}");
                k += 1;
            }
            name
        })
        .collect()
}

/// `--save-crop`: each detection's crop ([`crate::detect::draw::crop_box`]) as
/// `crops/<class name>/<stem>.jpg`, or `<stem>2.jpg`, `<stem>3.jpg`, ... when taken (the official
/// `increment_path`).
pub fn save_crops(
    save_dir: &Path,
    img: &image::RgbImage,
    dets: &[Detection],
    stem: &str,
) -> Result<()> {
    for d in dets {
        let Some(crop) = crate::detect::draw::crop_box(img, d.bbox) else {
            continue;
        };
        let dir = save_dir.join("crops").join(safe_dir_name(&d.class_name));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", crate::text::path(&dir)))?;
        let p = crate::runs::first_free(&dir, stem, ".jpg");
        crate::outfile::save_image(&crop, &p, &crate::outfile::Inputs::none())
            .with_context(|| format!("cannot save the crop {}", crate::text::path(&p)))?;
    }
    Ok(())
}

/// A class name as a folder name: path separators and control characters become `_`.
pub fn safe_dir_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c == '/' || c == '\\' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    match s.as_str() {
        "" | "." | ".." => "_".to_string(),
        _ => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_of_inputs_with_the_same_name_do_not_overwrite_each_other() {
        use std::path::PathBuf;
        let files: Vec<PathBuf> = [
            "a/same.jpg",
            "b/same.png",
            "c/same.png",
            "d/same_2.jpg",
            "e/x.tif",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let stems = super::unique_stems(&files);
        assert_eq!(stems, ["same", "same_2", "same_3", "same_2_2", "x"]);
        let names: Vec<PathBuf> = files
            .iter()
            .zip(&stems)
            .map(|(p, s)| super::annotated_name(p, s))
            .collect();
        let want: Vec<PathBuf> = [
            "same.jpg",
            "same_2.png",
            "same_3.png",
            "same_2_2.jpg",
            "x.tif.jpg",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(names, want);
    }

    #[test]
    fn g_format_matches_printf() {
        let cases = [
            (0.5, "0.5"),
            (0.123456789, "0.123457"),
            (1.0, "1"),
            (100.0, "100"),
            (123456.0, "123456"),
            (1234567.0, "1.23457e+06"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (0.0, "0"),
            (2.5e-7, "2.5e-07"),
            (0.999999, "0.999999"),
            (0.9999996, "1"),
        ];
        for (x, s) in cases {
            assert_eq!(fmt_g(x), s, "{x}");
        }
    }
}
