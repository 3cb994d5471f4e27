//! Large-image test sets made from a dataset of small images: every `g × g` consecutive images
//! of a split (sorted by path) placed side by side in one image, with their labels, so that
//! sliced inference ([`crate::detect::tile`]) can be measured against per-image detection on the
//! same objects (`cargo run --release --example compose_large -- DATA.yaml test OUT 4` makes
//! 2560x1920 images from BCCD's 640x480 ones; `val --tile 640 --data OUT/data.yaml`).

use crate::data::scan::{scan_split, ScanOptions};
use crate::data::yaml::{DataConfig, Split};
use anyhow::{ensure, Context, Result};
use image::{Rgb, RgbImage};
use std::path::Path;

/// What [`compose`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Composed {
    /// Large images written.
    pub images: usize,
    /// Boxes in their labels.
    pub boxes: usize,
    /// Each large image's size `(width, height)` in pixels.
    pub size: (u32, u32),
    /// Source images left over (fewer than `g × g` at the end of the split).
    pub left_over: usize,
}

/// Writes `out/images/<split>/large_NNN.jpg` (JPEG quality 95) and `out/labels/<split>/large_NNN.txt`
/// (YOLO `cls cx cy w h`, normalized to the large image) for each group of `g × g` consecutive
/// usable images of `split` of the dataset `data` (row by row; each in a cell of the largest
/// width and height of its group, at the cell's top left, the rest grey 114), and
/// `out/data.yaml` naming the split as `train`, `val` and `test` (a test set), with the dataset's classes.
/// At most `limit` large images (None: all).
///
/// Errors: the dataset cannot be read, `g` is 0, fewer than `g × g` usable images, a write
/// fails.
pub fn compose(
    data: &Path,
    split: Split,
    out: &Path,
    g: u32,
    limit: Option<usize>,
) -> Result<Composed> {
    ensure!(g >= 1, "the grid must be at least 1x1");
    let cfg = DataConfig::load(data)?;
    let scan = scan_split(
        &cfg,
        split,
        &ScanOptions {
            use_cache: false,
            print: false,
            ..Default::default()
        },
    )?;
    let per = (g * g) as usize;
    ensure!(
        scan.records.len() >= per,
        "{}: the {} split has {} usable images, fewer than {g}x{g}",
        crate::text::path(&data),
        split.key(),
        scan.records.len()
    );
    let key = split.key();
    let (img_dir, lab_dir) = (out.join("images").join(key), out.join("labels").join(key));
    for d in [&img_dir, &lab_dir] {
        std::fs::create_dir_all(d)
            .with_context(|| format!("cannot create {}", crate::text::path(&d)))?;
    }
    let none = crate::outfile::Inputs::none();
    let groups = scan.records.len() / per;
    let groups = limit.map_or(groups, |l| groups.min(l));
    let mut done = Composed {
        images: 0,
        boxes: 0,
        size: (0, 0),
        left_over: scan.records.len() - groups * per,
    };
    for (n, group) in scan.records.chunks_exact(per).take(groups).enumerate() {
        let cw = group.iter().map(|r| r.width).max().unwrap_or(1);
        let ch = group.iter().map(|r| r.height).max().unwrap_or(1);
        let (w, h) = (cw * g, ch * g);
        let mut big = RgbImage::from_pixel(w, h, Rgb([114, 114, 114]));
        let mut text = String::new();
        for (k, r) in group.iter().enumerate() {
            let (ox, oy) = ((k as u32 % g) * cw, (k as u32 / g) * ch);
            let img = crate::data::image::load_rgb8(&r.image)?;
            image::imageops::replace(&mut big, &img, ox.into(), oy.into());
            let (iw, ih) = (img.width() as f32, img.height() as f32);
            for b in &r.boxes {
                let cx = (b.cx * iw + ox as f32) / w as f32;
                let cy = (b.cy * ih + oy as f32) / h as f32;
                let bw = b.w * iw / w as f32;
                let bh = b.h * ih / h as f32;
                text += &format!("{} {cx:.6} {cy:.6} {bw:.6} {bh:.6}\n", b.cls);
                done.boxes += 1;
            }
        }
        let stem = format!("large_{n:03}");
        crate::outfile::save_image(&big, &img_dir.join(format!("{stem}.jpg")), &none)?;
        crate::outfile::write(&lab_dir.join(format!("{stem}.txt")), text.as_bytes(), &none)?;
        done.images += 1;
        done.size = (w, h);
    }
    let names: Vec<String> = cfg
        .names
        .iter()
        .map(|n| serde_json::to_string(n).unwrap_or_default())
        .collect();
    let yaml = format!(
        "# {g}x{g} groups of {} images of {} (train names the same images: a test set)\npath: .\ntrain: images/{key}\nval: images/{key}\ntest: images/{key}\nnc: {}\nnames: [{}]\n",
        key,
        crate::text::path(&data),
        cfg.nc,
        names.join(", ")
    );
    crate::outfile::write(&out.join("data.yaml"), yaml.as_bytes(), &none)?;
    Ok(done)
}
