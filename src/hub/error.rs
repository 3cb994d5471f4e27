//! The error of weights by name ([`HubError`]): one line per failure, naming the file, URL or
//! value and what to do; a [`crate::error::Error::Weights`] for the library's callers.

use std::path::PathBuf;

/// Failures of resolving, fetching or verifying weights by name. Each message is one line that
/// names the file, URL or value and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HubError {
    /// Neither an existing file nor a name the release publishes.
    #[error("{spec}: no such file, and not a model the official v0.1 release publishes (published: {published}){hint}")]
    UnknownName {
        /// What was given.
        spec: String,
        /// The published names, comma-separated.
        published: String,
        /// A hint for a near miss (`yolov9-t` → `yolov9-t-converted`).
        hint: String,
    },
    /// `YOLO9_OFFLINE=1` (or a build without the `download` feature) and the model is not cached.
    #[error("{name} is not in the cache and {why}: download {url} and place it at {place} (it is verified and converted on the next run)")]
    Offline {
        /// The model name.
        name: String,
        /// Why there is no download (`YOLO9_OFFLINE=1 forbids the network`).
        why: String,
        /// The release file's URL.
        url: String,
        /// Where to place it.
        place: PathBuf,
    },
    /// A download failed ([`HubError::Http`], [`HubError::Network`], [`HubError::TooLarge`]):
    /// the reason, and where to place the file fetched another way, as offline mode says.
    #[error("{reason}; or download {url} another way and place it at {} (it is verified and converted on the next run)", crate::text::path(.place))]
    DownloadFailed {
        /// Why the download failed.
        reason: Box<HubError>,
        /// The release file's URL.
        url: String,
        /// Where to place it.
        place: PathBuf,
    },
    /// `--weights` names something that exists but is not a regular file (a folder, a FIFO, a
    /// device).
    #[error("{}: is {kind}, not a weights file; pass a .safetensors or .pt file (or the name of a published model)", crate::text::path(.path))]
    NotAFile {
        /// What was given.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The server answered with an error status that retrying does not fix (4xx).
    #[error("{url}: HTTP {status}{}", if *.status == 404 { " (not found: check the name, or YOLO9_WEIGHTS_URL)" } else { "" })]
    Http {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
    },
    /// Every attempt failed (timeouts, resets, 5xx, bodies cut short).
    #[error("{url}: download failed after {attempts} attempts (last: {last}); check the network or set YOLO9_WEIGHTS_URL to a mirror")]
    Network {
        /// The URL.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's reason.
        last: String,
    },
    /// The file is larger than the limit.
    #[error("{url}: {bytes} bytes is over the download limit of {limit} bytes (YOLO9_DOWNLOAD_MAX_BYTES)")]
    TooLarge {
        /// The URL.
        url: String,
        /// Its size (declared or received so far).
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// A cached file differs from its manifest record.
    #[error("{}: SHA-256 {actual} differs from {recorded} recorded when it was cached; the file changed: delete it to fetch it again", crate::text::path(.path))]
    HashMismatch {
        /// The cached file.
        path: PathBuf,
        /// The manifest's hash.
        recorded: String,
        /// The file's hash now.
        actual: String,
    },
    /// A checkpoint that is not the model its name promises (unreadable, another architecture,
    /// another parameter count, a non-finite tensor).
    #[error("{source_name}: {message}")]
    Verify {
        /// The URL or file it came from.
        source_name: String,
        /// What is wrong.
        message: String,
    },
    /// An environment variable with a value that is not a number of the kind it takes.
    #[error("{var}={value:?}: not a non-negative number")]
    Env {
        /// The variable (`YOLO9_DOWNLOAD_TIMEOUT`).
        var: String,
        /// Its value.
        value: String,
    },
    /// The cache folder or a file in it cannot be created, read or written.
    #[error("{}: {message}", crate::text::path(.path))]
    Cache {
        /// The folder or file.
        path: PathBuf,
        /// What failed and what to do.
        message: String,
    },
}

impl From<HubError> for crate::error::Error {
    fn from(e: HubError) -> Self {
        let path = match &e {
            HubError::HashMismatch { path, .. } | HubError::Cache { path, .. } => path.clone(),
            HubError::Offline { place, .. } => place.clone(),
            _ => PathBuf::new(),
        };
        crate::error::Error::Weights {
            path,
            message: e.to_string(),
        }
    }
}
