//! `yolo9 convert`: official `.pt` → safetensors.
use crate::convert::int8::{quantize_file, Int8Options};
use crate::convert::{convert_file, default_output, ConvertOptions};
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `yolo9 convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The checkpoint to convert (.pt official checkpoint, .pt state_dict or .safetensors), or the
    /// name of an official checkpoint (yolov9-c, gelan-e, ...), downloaded once into the cache.
    pub input: PathBuf,
    /// Output safetensors file [default: beside the input, `NAME.safetensors`, or
    /// `NAME-infer-half.safetensors` with the options' suffixes when that would be the input
    /// itself].
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Store the weights as f16 (half the size; loaders upcast to f32).
    #[arg(long)]
    pub half: bool,
    /// Write only the inference graph: the main branch, as the gelan counterpart of the model
    /// (yolov9-c -> gelan-c: its layers up to the DDetect head, renumbered).
    #[arg(long)]
    pub infer: bool,
    /// The model the checkpoint is: a built-in name (yolov9-t/s/m/c/e, gelan-t/s/m/c/e) or a
    /// model yaml in the official format; a checkpoint that is not that model is refused, naming
    /// the first tensor that differs [default: recognised from the checkpoint's keys].
    #[arg(long)]
    pub cfg: Option<String>,
    /// Calibrate for INT8 inference on the CPU (post-training static quantization: per-channel
    /// weights, activation ranges from `--data` images); the file keeps its f32 weights and
    /// runs in floating point on a GPU. Needs --data.
    #[arg(long, requires = "data")]
    pub int8: bool,
    /// Dataset yaml whose val images (else train) calibrate --int8.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Images to calibrate --int8 on, spread evenly over the split.
    #[arg(long, default_value_t = 100)]
    pub calib_images: usize,
}

/// Runs `yolo9 convert`: reads the checkpoint, checks it, writes safetensors atomically and
/// prints a summary (tensors, parameters, classes, anything ignored).
pub fn run(mut args: ConvertArgs) -> Result<()> {
    // An official checkpoint by name (`yolo9 convert yolov9-c --infer`) is fetched into the cache
    // first; its default output goes to the current folder, not into the cache.
    let by_name = !args.input.is_file();
    let named = args.input.clone();
    args.input = super::detect::weights_file(&args.input)?;
    let output = match args.output {
        Some(o) => o,
        None if by_name => {
            let stem = crate::hub::registry::strip_pt(&named.to_string_lossy()).to_string();
            default_output(&PathBuf::from(format!("{stem}.pt")), args.infer, args.half)
        }
        None => default_output(&args.input, args.infer, args.half),
    };
    if crate::runs::input_within(&output, [args.input.as_path()]).is_some() {
        bail!(
            "{}: -o {} is the input itself; converting would replace it. Pass another -o",
            crate::text::path(&args.input),
            crate::text::path(&output)
        )
    }
    let mut inputs = crate::outfile::Inputs::of([&args.input]);
    if let Some(cfg) = &args.cfg {
        inputs.add(std::path::Path::new(cfg));
    }
    crate::outfile::check(&output, &inputs)?;
    let opts = ConvertOptions {
        half: args.half,
        infer: args.infer,
        cfg: args
            .cfg
            .as_deref()
            .map(crate::model::arch::Arch::from_cfg)
            .transpose()?,
    };
    let report = match (&args.data, args.int8) {
        (Some(data), true) => {
            let int8 = Int8Options {
                data: data.clone(),
                images: args.calib_images,
                imgsz: 640,
                threads: 0,
            };
            quantize_file(&args.input, &output, opts, &int8)?
        }
        (Some(_), false) => bail!("--data is for --int8; add --int8 or drop --data"),
        _ => convert_file(&args.input, &output, opts)?,
    };
    crate::text::out!("{report}");
    let size = std::fs::metadata(&output).map(|m| m.len()).unwrap_or(0);
    crate::text::outln!("wrote:      {} ({size} bytes)", crate::text::path(&output));
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_output_equal_to_the_input_is_refused_and_the_input_kept() {
        let dir = std::env::temp_dir().join(format!("yolo9-convert-same-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("best.pt");
        std::fs::write(&input, b"not a checkpoint").unwrap();
        let args = super::ConvertArgs {
            input: input.clone(),
            output: Some(dir.join(".").join("best.pt")),
            half: false,
            infer: false,
            cfg: None,
            int8: false,
            data: None,
            calib_images: 100,
        };
        let e = super::run(args).unwrap_err().to_string();
        assert!(e.contains("is the input itself"), "{e}");
        assert_eq!(std::fs::read(&input).unwrap(), b"not a checkpoint");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
