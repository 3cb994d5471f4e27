//! `yolo9 convert`: official `.pt` → safetensors.
use crate::convert::{convert_file, ConvertOptions};
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `yolo9 convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The checkpoint to convert (.pt official checkpoint, .pt state_dict or .safetensors).
    pub input: PathBuf,
    /// Output safetensors file [default: the input path with the extension `.safetensors`].
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Store the weights as f16 (half the size; loaders upcast to f32).
    #[arg(long)]
    pub half: bool,
    /// Write only the inference graph (gelan-s layout: layers 0-21 + DDetect at 22).
    #[arg(long)]
    pub infer: bool,
}

/// Runs `yolo9 convert`: reads the checkpoint, checks it, writes safetensors atomically and
/// prints a summary (tensors, parameters, classes, anything ignored).
pub fn run(args: ConvertArgs) -> Result<()> {
    let output = match args.output {
        Some(o) => o,
        None => {
            let o = args.input.with_extension("safetensors");
            if o == args.input {
                bail!(
                    "{}: the default output would overwrite the input; pass -o OUT",
                    args.input.display()
                )
            }
            o
        }
    };
    if output.is_dir() {
        bail!(
            "{}: is a directory; pass -o FILE.safetensors",
            output.display()
        )
    }
    let report = convert_file(
        &args.input,
        &output,
        ConvertOptions {
            half: args.half,
            infer: args.infer,
        },
    )?;
    print!("{report}");
    let size = std::fs::metadata(&output).map(|m| m.len()).unwrap_or(0);
    println!("wrote:      {} ({size} bytes)", output.display());
    Ok(())
}
