//! `yolo9 export`: the detector as an ONNX model ([`crate::export`]).

use super::detect::WeightsArgs;
use crate::export::{onnx, ExportOptions, NmsExport};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::path::PathBuf;

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// ONNX (default operator set, opset 13–21).
    Onnx,
}

/// Arguments of `yolo9 export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The weights and model.
    #[command(flatten)]
    pub weights: WeightsArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "onnx")]
    pub format: Format,
    /// Input size in pixels: one number (square) or H W; multiples of 32.
    #[arg(long, visible_aliases = ["imgsz", "img-size"], num_args = 1..=2, default_values_t = [640])]
    pub img: Vec<usize>,
    /// Batch size of a static model.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Batch, height and width as symbolic dimensions.
    #[arg(long)]
    pub dynamic: bool,
    /// f16 weights and activations (the input stays f32 in 0..1, the output f32).
    #[arg(long)]
    pub half: bool,
    /// An end-to-end model: NMS inside, outputs num_dets, boxes, scores, classes (and masks for
    /// a segmentation model).
    #[arg(long)]
    pub nms: bool,
    /// --nms: confidence threshold in (0, 1).
    #[arg(long = "conf-thres", visible_alias = "conf", value_name = "CONF", default_value_t = 0.25,
          value_parser = crate::parse::unit_f32, allow_negative_numbers = true)]
    pub conf: f32,
    /// --nms: IoU threshold in [0, 1].
    #[arg(long = "iou-thres", visible_alias = "iou", value_name = "IOU", default_value_t = 0.45,
          value_parser = crate::parse::unit_f32, allow_negative_numbers = true)]
    pub iou: f32,
    /// --nms: detections per image at most.
    #[arg(long, default_value_t = 300)]
    pub max_det: usize,
    /// ONNX operator set.
    #[arg(long, default_value_t = 17)]
    pub opset: i64,
    /// Output file [default: the weights' file name with .onnx (`-half`/`-nms` added for those
    /// options), in the current folder].
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// Runs `yolo9 export`: builds the model, writes it atomically, prints what was written.
pub fn run(args: ExportArgs) -> Result<()> {
    let (path, weights) = args.weights.load()?;
    let img = match args.img.as_slice() {
        [s] => (*s, *s),
        [h, w] => (*h, *w),
        _ => bail!("--img takes one size or H W"),
    };
    let opts = ExportOptions {
        img,
        batch: args.batch,
        dynamic: args.dynamic,
        half: args.half,
        nms: args.nms.then_some(NmsExport {
            conf: args.conf,
            iou: args.iou,
            max_det: args.max_det,
        }),
        opset: args.opset,
    };
    let output = match args.output {
        Some(o) => o,
        None => {
            let stem = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into());
            let mut name = stem;
            if args.half {
                name.push_str("-half");
            }
            if args.nms {
                name.push_str("-nms");
            }
            PathBuf::from(format!("{name}.onnx"))
        }
    };
    // The weights (and a model yaml) are inputs: refused as the output before any work.
    let mut inputs = crate::outfile::Inputs::of([&path]);
    if let Some(cfg) = &args.weights.cfg {
        inputs.add(std::path::Path::new(cfg));
    }
    crate::outfile::check(&output, &inputs).context("-o")?;
    let model = onnx::export(&weights, &opts)?;
    let bytes = crate::export::write(&model, &output, &inputs)?;
    let nodes = model.graph.as_ref().map_or(0, |g| g.node.len());
    let shape = if opts.dynamic {
        "dynamic batch, height and width".to_string()
    } else {
        format!("input {}x3x{}x{}", opts.batch, img.0, img.1)
    };
    crate::text::outln!(
        "exported {} ({}, {} classes) to {}: {:.1} MB, {nodes} nodes, opset {}, {shape}{}{}",
        crate::text::path(&path),
        weights.meta.arch.name,
        weights.meta.nc,
        crate::text::path(&output),
        bytes as f64 / 1e6,
        opts.opset,
        if opts.half { ", f16" } else { "" },
        if opts.nms.is_some() {
            format!(
                ", NMS (conf {}, iou {}, max_det {})",
                args.conf, args.iou, args.max_det
            )
        } else {
            String::new()
        }
    );
    Ok(())
}
