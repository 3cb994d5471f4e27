//! The validation job of `yolo9 val` and of a Rust program ([`run`]): validate weights on a
//! dataset split with the official `val_dual.py` semantics and print the table `Class Images
//! Instances P R mAP50 mAP50-95` (the metrics themselves: [`crate::metrics::validate`]).

use crate::data::scan::{scan_split, ScanOptions};
use crate::data::yaml::{DataConfig, Split};
use crate::metrics::validate::{val_images, validate, ValConfig, ValModel};
use crate::model::yolov9::YoloV9;
use anyhow::{bail, ensure, Context, Result};
use std::path::PathBuf;

/// The options of a validation job (`yolo9 val`'s flags but `--weights`, `--cfg` and
/// `--device`).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct ValOptions {
    /// The dataset description (data.yaml).
    #[cfg_attr(feature = "cli", arg(long))]
    pub data: PathBuf,
    /// Split to validate: val or test.
    #[cfg_attr(feature = "cli", arg(long, default_value = "val"))]
    pub split: String,
    /// Inference size (long side, pixels, 1..=8192), rounded up to a multiple of 32. On the CPU a size and
    /// batch whose estimated memory exceeds the free memory are refused before any work.
    #[cfg_attr(feature = "cli", arg(long, value_name = "IMG", visible_aliases = ["imgsz", "img-size"], default_value = "640",
          value_parser = crate::parse::img, allow_negative_numbers = true))]
    pub img: u32,
    /// Batch size (≥ 1).
    #[cfg_attr(feature = "cli", arg(long, default_value = "32", value_parser = crate::parse::positive,
          allow_negative_numbers = true))]
    pub batch: usize,
    /// Confidence threshold in [0, 1].
    #[cfg_attr(feature = "cli", arg(long = "conf-thres", visible_alias = "conf", value_name = "CONF",
          default_value = "0.001", value_parser = crate::parse::unit, allow_negative_numbers = true))]
    pub conf_thres: f64,
    /// NMS IoU threshold in [0, 1].
    #[cfg_attr(feature = "cli", arg(long = "iou-thres", visible_alias = "iou", value_name = "IOU", default_value = "0.7",
          value_parser = crate::parse::unit, allow_negative_numbers = true))]
    pub iou_thres: f64,
    /// Maximum detections per image (≥ 1).
    #[cfg_attr(feature = "cli", arg(long, default_value = "300", value_parser = crate::parse::positive,
          allow_negative_numbers = true))]
    pub max_det: usize,
    /// Memory budget, e.g. 4GiB: the batch is the largest (up to --batch) whose measured forward
    /// peak fits.
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::parse::budget))]
    pub budget: Option<u64>,
    /// Half-precision (f16) network on a CUDA device, as the official val.py --half; ignored
    /// with a notice on the CPU.
    #[cfg_attr(feature = "cli", arg(long))]
    pub half: bool,
    /// Parent folder of the run folder (the plots go there).
    #[cfg_attr(feature = "cli", arg(long, default_value = "runs/val"))]
    pub project: PathBuf,
    /// Run folder name (exp, exp2, ... when it exists).
    #[cfg_attr(feature = "cli", arg(long, default_value = "exp"))]
    pub name: String,
    /// Reuse the run folder if it exists instead of incrementing.
    #[cfg_attr(feature = "cli", arg(long = "exist-ok"))]
    pub exist_ok: bool,
    /// Draw no plots (and create no run folder unless --save-json asks for one).
    #[cfg_attr(feature = "cli", arg(long))]
    pub noplots: bool,
    /// Write predictions.json (COCO results: image_id = the file stem when every stem is
    /// numeric, else the image's index in the split; category_id = the original category id
    /// for a COCO JSON split, COCO's 91-category id for the 80 COCO classes, else the class
    /// index; bbox xywh in original pixels) into the run folder and print the COCO
    /// (pycocotools) summary evaluated against the split's own labels.
    #[cfg_attr(feature = "cli", arg(long = "save-json"))]
    pub save_json: bool,
    /// Write each image's detections to labels/<stem>.txt in the run folder (`cls cx cy w h`,
    /// normalized to the original image, as detect --save-txt; images without detections get
    /// no file).
    #[cfg_attr(feature = "cli", arg(long = "save-txt"))]
    pub save_txt: bool,
    /// Add the confidence to --save-txt lines.
    #[cfg_attr(feature = "cli", arg(long = "save-conf"))]
    pub save_conf: bool,
    /// Sliced inference ([`crate::detect::tile`]): each image detected tile by tile at --img
    /// (`validate_tiled`), for datasets of large images.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub tile: crate::detect::tile::TileOptions,
}

/// Parses `--split`.
pub fn parse_split(s: &str) -> Result<Split> {
    match s {
        "train" => Ok(Split::Train),
        "val" => Ok(Split::Val),
        "test" => Ok(Split::Test),
        other => bail!("--split {other}: expected val, test or train"),
    }
}

/// Runs a validation job: the split's labels scanned (with the label cache), the weights
/// (`weights`, loaded after the data and the memory were checked) run over its images at `img`
/// on `device`, the table `Class Images Instances P R mAP50 mAP50-95` printed (official
/// `val_dual.py`), and with the options the run folder's files: `predictions.json` and the COCO
/// summary, `labels/`, the plots.
///
/// Errors: the split or the data yaml is missing or bad, the model's classes differ from the
/// dataset's, the size does not fit the memory, an output cannot be written.
pub fn run(
    o: &ValOptions,
    device: crate::device::DeviceSpec,
    weights: impl FnOnce() -> Result<(PathBuf, crate::model::weights::Weights)>,
) -> Result<()> {
    let mut a = o.clone();
    let split = parse_split(&a.split)?;
    // As the official `check_img_size`: the size is rounded up to a multiple of the stride.
    let (img, note) = crate::detect::letterbox::effective_img(a.img);
    if let Some(n) = note {
        crate::text::errln!("{n}");
    }
    a.img = img;
    ensure!(a.batch >= 1, "--batch must be at least 1");
    let cfg = DataConfig::load(&a.data)?;
    ensure!(
        !cfg.sources(split).is_empty(),
        "{}: no `{}` split in the data yaml; add `{}: images/{}`",
        crate::text::path(&cfg.yaml_path),
        split.key(),
        split.key(),
        split.key()
    );
    let (device, notice) = crate::device::open(device)?;
    if let Some(n) = notice {
        crate::text::errln!("{n}");
    }
    // The size against the memory before any work (the budget search starts at one image).
    crate::footprint::check_device(
        &crate::footprint::Request {
            what: "validation",
            work: crate::footprint::Work::Infer,
            img: a.img,
            images: if a.budget.is_some() { 1 } else { a.batch },
            batch_option: Some("--batch"),
            split_option: None,
        },
        &device,
        a.budget,
    )?;
    let (weights_path, weights) = weights()?;
    ensure!(
        weights.meta.nc == cfg.nc,
        "--weights {} has nc = {} but {} has nc = {}; validate with the dataset the model was trained on",
        crate::text::path(&weights_path),
        weights.meta.nc,
        crate::text::path(&cfg.yaml_path),
        cfg.nc
    );
    if a.half && device.is_cpu() {
        crate::text::errln!("--half has no effect on the CPU: the network runs in f32");
    }
    let dtype = crate::detect::config::inference_dtype(a.half, &device);
    let model = YoloV9::load_dtype(&weights, &device, dtype)?.for_validation();
    let scan = scan_for_val(&cfg, split)?;
    let images = val_images(&scan);
    let saving = a.save_json || a.save_txt;
    if !a.noplots || saving {
        let labels: Vec<PathBuf> = scan
            .records
            .iter()
            .filter_map(|r| r.label.clone())
            .collect();
        let inputs = [&a.data, &weights_path]
            .into_iter()
            .chain(images.iter().map(|i| &i.path))
            .chain(&labels)
            .map(PathBuf::as_path);
        crate::runs::refuse_reused_dir(&a.project, &a.name, a.exist_ok, inputs)?;
    }
    let batch = match a.budget {
        Some(budget) => {
            let probe = crate::memory::MemoryProbe::new(&device)?;
            let d = crate::budget::plan_inference(&model, a.img, a.batch, budget, &probe)?;
            crate::text::outln!("{}", d.describe().replace("micro-batch", "batch"));
            d.micro
        }
        None => a.batch,
    };
    let vc = ValConfig {
        img: a.img,
        batch,
        conf_thres: a.conf_thres as f32,
        iou_thres: a.iou_thres as f32,
        max_det: a.max_det,
        progress: true,
        confusion: !a.noplots,
        collect: saving || !a.noplots,
        ..ValConfig::default()
    };
    let r = if a.tile.on() {
        // `with_config` checks the tile options too.
        let detector = crate::detect::detector::Detector::from_model(model, device.clone())
            .with_config(crate::detect::config::DetectorConfig {
                img_size: a.img,
                conf: vc.conf_thres,
                iou: f64::from(vc.iou_thres),
                max_det: vc.max_det,
                multi_label: true,
                tile: a.tile,
                ..crate::detect::config::DetectorConfig::default()
            })?;
        crate::metrics::validate::validate_tiled(&detector, &images, &vc)?
    } else if model.is_seg() {
        crate::metrics::seg_val::validate_seg(
            crate::metrics::seg_val::SegValModel::Infer(&model),
            &images,
            &vc,
        )?
    } else {
        validate(ValModel::Infer(&model), &images, &vc)?
    };
    for (p, why) in &r.skipped {
        crate::detect::job::report_skipped(crate::text::path(&p), why);
    }
    match &r.masks {
        Some(m) => crate::text::out!(
            "{}",
            crate::metrics::seg::seg_table(&r.metrics, m, &cfg.names)
        ),
        None => crate::text::out!("{}", r.metrics.table(&cfg.names)),
    }
    crate::text::outln!(
        "{} images in {:.1} s ({:.2} img/s)",
        r.metrics.seen,
        r.seconds,
        r.metrics.seen as f64 / r.seconds.max(1e-9)
    );
    if a.noplots && !saving {
        return Ok(());
    }
    save_outputs(&a, &cfg, &scan, &images, &r, batch)
}

/// Scans the labels of `split` (with the label cache) and prints the summary, the COCO
/// category mapping when the split is COCO JSON, and a warning when the cache was not written.
fn scan_for_val(cfg: &DataConfig, split: Split) -> Result<crate::data::scan::SplitScan> {
    let scan = scan_split(
        cfg,
        split,
        &ScanOptions {
            use_cache: true,
            print: false,
            ..Default::default()
        },
    )?;
    if let crate::data::scan::CacheStatus::NotWritten { path, reason } = &scan.cache {
        crate::text::errln!(
            "warning: label cache {} not written: {reason} (the labels are scanned again next time)",
            crate::text::path(&path)
        );
    }
    if let Some(c) = &cfg.coco {
        crate::text::outln!("{}", c.mapping_line(&cfg.names));
    }
    crate::text::outln!("{}", scan.summary(&cfg.names));
    Ok(scan)
}

/// The run folder's files of a validation `r` of `images` at `batch`: `predictions.json` and
/// the COCO summary (`--save-json`), `labels/` (`--save-txt`), the plots (unless `--noplots`).
fn save_outputs(
    a: &ValOptions,
    cfg: &DataConfig,
    scan: &crate::data::scan::SplitScan,
    images: &[crate::metrics::validate::ValImage],
    r: &crate::metrics::validate::ValResult,
    batch: usize,
) -> Result<()> {
    let dir = crate::runs::claim_run_dir(&a.project, &a.name, a.exist_ok).with_context(|| {
        format!(
            "cannot create the run folder under {}",
            crate::text::path(&a.project)
        )
    })?;
    if a.save_json {
        let dets = r.detections.as_deref().unwrap_or_default();
        let cats = crate::metrics::coco_json::category_ids(
            &cfg.names,
            cfg.coco.as_ref().map(|c| c.ids.as_slice()),
        );
        let (ids, note) = crate::metrics::coco_json::dataset_image_ids(images, &scan.coco_ids);
        if let Some(n) = note {
            crate::text::errln!("{n}");
        }
        let (path, ev) = crate::metrics::coco_json::save_and_evaluate(
            &dir, images, dets, &cfg.names, &ids, &cats,
        )?;
        crate::text::outln!(
            "Saved {}; COCO bbox evaluation against the split's labels:",
            crate::text::path(&path)
        );
        for line in ev.summary_lines() {
            crate::text::outln!("{line}");
        }
    }
    if a.save_txt {
        let dets = r.detections.as_deref().unwrap_or_default();
        let n = save_txt(&dir, images, dets, a.save_conf)?;
        crate::text::outln!(
            "{n} label files saved to {}",
            crate::text::path(&dir.join("labels"))
        );
    }
    if !a.noplots {
        crate::metrics::plots::plot_validation(
            &dir,
            &r.metrics.per_class,
            r.confusion.as_ref(),
            &cfg.names,
        )?;
        if let Some(dets) = &r.detections {
            crate::metrics::plots::plot_val_batches(&dir, images, dets, batch, &cfg.names)?;
        }
    }
    crate::text::outln!("Results saved to {}", crate::text::path(&dir));
    Ok(())
}

/// `--save-txt`: `dir/labels/<stem>.txt` for every validated image with at least one detection,
/// one [`crate::detect::output::yolo_line`] per detection (the official `save_one_txt`: boxes as
/// scaled, unrounded; `--save-conf` adds the confidence). Stems are made unique as detect's
/// ([`crate::detect::output::unique_stems`]). Returns the number of files written.
pub fn save_txt(
    dir: &std::path::Path,
    images: &[crate::metrics::validate::ValImage],
    dets: &[crate::metrics::validate::ImageDetections],
    with_conf: bool,
) -> Result<usize> {
    use crate::detect::output::{unique_stems, yolo_line};
    let labels = dir.join("labels");
    std::fs::create_dir_all(&labels)
        .with_context(|| format!("cannot create {}", crate::text::path(&labels)))?;
    let paths: Vec<PathBuf> = images.iter().map(|i| i.path.clone()).collect();
    let stems = unique_stems(&paths);
    let mut n = 0;
    for im in dets {
        let (Some(vi), Some(stem)) = (images.get(im.image), stems.get(im.image)) else {
            continue;
        };
        if im.dets.is_empty() {
            continue;
        }
        let mut text = String::new();
        for d in &im.dets {
            let b = [d[0], d[1], d[2], d[3]];
            text += &yolo_line(d[5] as usize, b, d[4], vi.width, vi.height, with_conf);
            text.push('\n');
        }
        let p = labels.join(format!("{stem}.txt"));
        crate::outfile::write(&p, text.as_bytes(), &crate::outfile::Inputs::none())?;
        n += 1;
    }
    Ok(n)
}
