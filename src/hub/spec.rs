//! What a `--weights` value means, the same in every command and for a program that takes one
//! from its user: a file as given, else a name of the official release fetched through the cache
//! ([`weights_file`]), else (no value) the built-in weights ([`builtin_weights`]); and the weights
//! loaded as the model a `--cfg` names ([`load_weights`]).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// What a command names the built-in weights in its messages (its file stem names exports).
pub const BUILTIN_LABEL: &str = "built-in/yolov9-s-bccd.safetensors";

/// The built-in weights (feature `builtin-weights`, which `cli` enables), as the model `cfg` names
/// when given; prints the one line that says the built-in model runs
/// ([`crate::hub::BUILTIN_NOTE`]).
#[cfg(feature = "builtin-weights")]
pub fn builtin_weights(cfg: Option<&str>) -> Result<crate::model::weights::Weights> {
    crate::text::errln!("{}", crate::hub::BUILTIN_NOTE);
    let w = crate::model::weights::Weights::builtin()?;
    match cfg {
        None => Ok(w),
        Some(c) => {
            let arch = crate::model::arch::Arch::from_cfg(c)?;
            Ok(w.with_arch(arch, &format!("--cfg {c}"))
                .context("the built-in weights")?)
        }
    }
}

/// Loads `path` ([`crate::model::weights::Weights::load`]) as the model `cfg` names when given (`--cfg`: a
/// built-in name such as `yolov9-c`, or a model yaml; see [`crate::model::weights::Weights::with_arch`]), else as
/// the model its keys or metadata say. Errors name the file and, with `--cfg`, the first tensor
/// that does not fit.
pub fn load_weights(path: &Path, cfg: Option<&str>) -> Result<crate::model::weights::Weights> {
    let w = crate::model::weights::Weights::load(path)
        .with_context(|| format!("--weights {}", crate::text::path(&path)))?;
    match cfg {
        None => Ok(w),
        Some(c) => {
            let arch = crate::model::arch::Arch::from_cfg(c)?;
            w.with_arch(arch, &format!("--cfg {c}"))
                .with_context(|| format!("--weights {}", crate::text::path(&path)))
        }
    }
}

/// The weights file of `--weights`: an existing path as given, else an official checkpoint by
/// name (`yolov9-s`, `gelan-c.pt`), from the cache or downloaded ([`weights_file`]); `None`
/// without `--weights`: the built-in weights. Errors name the value and what to pass.
pub fn resolve_weights(arg: Option<&Path>) -> Result<Option<PathBuf>> {
    arg.map(weights_file).transpose()
}

/// The file a weights value means (`--weights` of every command, `convert`'s input): an existing
/// path as given; a name of the official release resolved through the cache
/// ([`crate::hub::resolve`], options from the environment); anything else an error naming the
/// value and listing the published names.
pub fn weights_file(p: &Path) -> Result<PathBuf> {
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    let text = p.to_string_lossy();
    if !crate::hub::registry::looks_like_name(&text) {
        bail!(
            "weights file {} not found; pass an existing .safetensors or .pt, or the name of an \
             official checkpoint ({})",
            crate::text::path(p),
            crate::hub::registry::published_names()
        );
    }
    let opts = crate::hub::HubOptions::from_env()?;
    Ok(crate::hub::resolve(p, &opts)?)
}
