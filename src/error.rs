//! [`Error`]: what the library's public entry points return ([`crate::Detector`],
//! [`crate::Weights`], [`crate::device::select`], and `yolo9::train::train` with the `train`
//! feature), with variants a service can match on. Inside, the library works with `anyhow`
//! chains of context; at the boundary a chain becomes a variant ([`Error::from`]), keeping its
//! whole text in the message.

use crate::memory::OutOfMemory;
use std::path::PathBuf;

/// An error of the yolo9 library.
///
/// Every variant's text names what failed and what to do; [`Error::Other`] keeps the whole
/// chain of context (`{:#}`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A weights file that is missing, unreadable, damaged, or not a model yolo9 builds (the
    /// message names the first tensor that does not fit).
    #[error("{message}")]
    Weights {
        /// The file given.
        path: PathBuf,
        /// What is wrong with it, naming the file.
        message: String,
    },
    /// An image file that cannot be read or decoded (corrupt, truncated, an unsupported format,
    /// or larger than the decoder's limits).
    #[error("{message}")]
    Image {
        /// The file given.
        path: PathBuf,
        /// What is wrong with it, naming the file.
        message: String,
    },
    /// An option outside its valid range (a threshold outside `[0, 1]`, a class the model does
    /// not have, an image size out of range).
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// The device (or the memory budget) ran out of memory; a smaller batch or image size may
    /// fit.
    #[error(transparent)]
    OutOfMemory(OutOfMemory),
    /// A device that is not available or failed to start (`--device 1` on a one-GPU machine, a
    /// CUDA device on a CPU-only build).
    #[error("{0}")]
    Device(String),
    /// Reading or writing `path` failed.
    #[error("{}: {source}", crate::text::path(.path))]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Any other failure, with its whole chain of context.
    #[error("{0:#}")]
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Error {
    /// An [`Error`] anywhere in the chain is returned as it is (context added inside the library
    /// does not hide it); an out-of-memory failure becomes [`Error::OutOfMemory`] with the
    /// chain's text; anything else is [`Error::Other`].
    fn from(e: anyhow::Error) -> Self {
        let e = match e.downcast::<Error>() {
            Ok(inner) => return inner,
            Err(e) => e,
        };
        if crate::memory::is_oom(&e) {
            return Error::OutOfMemory(OutOfMemory {
                what: format!("{e:#}"),
            });
        }
        Error::Other(e)
    }
}

/// The text of `e`, starting with `path` unless it names it already.
fn naming(path: &std::path::Path, e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    let p = crate::text::path(&path).to_string();
    if text.contains(&p) {
        text
    } else {
        format!("{p}: {text}")
    }
}

impl From<OutOfMemory> for Error {
    fn from(e: OutOfMemory) -> Self {
        Error::OutOfMemory(e)
    }
}

impl Error {
    /// [`Error::Weights`] for `path` with the text of `e` (its whole chain), prefixed with the
    /// path unless the text names it already.
    pub fn weights(path: impl Into<PathBuf>, e: &anyhow::Error) -> Self {
        let path = path.into();
        Error::Weights {
            message: naming(&path, e),
            path,
        }
    }

    /// [`Error::Image`] for `path` with the text of `e` (its whole chain), prefixed with the path
    /// unless the text names it already.
    pub fn image(path: impl Into<PathBuf>, e: &anyhow::Error) -> Self {
        let path = path.into();
        Error::Image {
            message: naming(&path, e),
            path,
        }
    }

    /// Whether this is [`Error::OutOfMemory`].
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_becomes_a_variant() {
        let oom: anyhow::Error = OutOfMemory {
            what: "a micro-batch of 4".into(),
        }
        .into();
        let e = Error::from(oom.context("epoch 1 batch 3"));
        assert!(e.is_out_of_memory(), "{e:?}");
        // An Error inside a chain of context comes back as itself.
        let inner: anyhow::Error = Error::InvalidOption("conf 2".into()).into();
        let e = Error::from(inner.context("detect"));
        assert!(
            matches!(e, Error::InvalidOption(ref m) if m == "conf 2"),
            "{e:?}"
        );
        let e = Error::from(anyhow::anyhow!("low").context("high"));
        assert!(matches!(e, Error::Other(_)));
        assert_eq!(e.to_string(), "high: low");
    }
}
