//! How names resolve ([`HubOptions`]): the cache folder, the release URL, the network policy and
//! limits, from the environment or given by a caller.

use super::cache::{self, Cache};
use super::error::HubError;
use super::registry::RELEASE_URL;
use std::path::PathBuf;
use std::time::Duration;

/// How names resolve: the cache folder, the release URL, the network policy and limits.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// The cache folder (`None`: no folder could be found; any name is then an error).
    pub home: Option<PathBuf>,
    /// Base URL of the release (files are `BASE/NAME.pt`).
    pub base_url: String,
    /// No network: a model not in the cache is an error naming the file to place.
    pub offline: bool,
    /// Connect timeout, and the longest wait for any read (a stalled server).
    pub timeout: Duration,
    /// Retries after the first attempt (5xx, 429, timeouts, resets, cut bodies).
    pub retries: u32,
    /// Wait before the first retry; doubled for each next one.
    pub backoff: Duration,
    /// The largest file accepted, in bytes.
    pub max_bytes: u64,
    /// Print the progress bar (on a terminal), retries and the SHA-256 lines on stderr.
    pub verbose: bool,
}

impl Default for HubOptions {
    /// The cache folder of [`cache::default_home`], the official release, online, 30 s
    /// timeouts, 4 retries from 1 s, a 1 GiB limit, verbose. Only the folder is read from the
    /// environment; [`HubOptions::from_env`] reads the other variables too.
    fn default() -> Self {
        Self {
            home: cache::default_home(),
            base_url: RELEASE_URL.to_string(),
            offline: false,
            timeout: Duration::from_secs(30),
            retries: 4,
            backoff: Duration::from_secs(1),
            max_bytes: 1 << 30,
            verbose: true,
        }
    }
}

impl HubOptions {
    /// The options the environment sets: `YOLO9_HOME` (cache folder, else the platform's:
    /// [`cache::default_home`]), `YOLO9_WEIGHTS_URL` (base URL), `YOLO9_OFFLINE=1`,
    /// `YOLO9_DOWNLOAD_TIMEOUT` (seconds, connect and per read; default 30),
    /// `YOLO9_DOWNLOAD_RETRIES` (default 4), `YOLO9_DOWNLOAD_BACKOFF` (seconds before the first
    /// retry, doubled after; default 1), `YOLO9_DOWNLOAD_MAX_BYTES` (default 1 GiB).
    ///
    /// Errors: [`HubError::Env`] for a variable that is not a non-negative number.
    pub fn from_env() -> Result<Self, HubError> {
        let d = Self::default();
        let var = |k: &str| crate::switches::var(k).filter(|v| !v.trim().is_empty());
        let num = |k: &str| -> Result<Option<f64>, HubError> {
            match var(k) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .map(Some)
                    .ok_or_else(|| HubError::Env {
                        var: k.to_string(),
                        value: v.clone(),
                    }),
            }
        };
        Ok(Self {
            home: d.home,
            base_url: var("YOLO9_WEIGHTS_URL").unwrap_or(d.base_url),
            offline: var("YOLO9_OFFLINE").is_some_and(|v| v.trim() != "0"),
            timeout: num("YOLO9_DOWNLOAD_TIMEOUT")?
                .map(Duration::from_secs_f64)
                .unwrap_or(d.timeout),
            retries: num("YOLO9_DOWNLOAD_RETRIES")?
                .map(|x| x as u32)
                .unwrap_or(d.retries),
            backoff: num("YOLO9_DOWNLOAD_BACKOFF")?
                .map(Duration::from_secs_f64)
                .unwrap_or(d.backoff),
            max_bytes: num("YOLO9_DOWNLOAD_MAX_BYTES")?
                .map(|x| x as u64)
                .unwrap_or(d.max_bytes),
            verbose: true,
        })
    }

    /// The release file's URL for `name`.
    pub fn url(&self, name: &str) -> String {
        format!("{}/{name}.pt", self.base_url.trim_end_matches('/'))
    }

    pub(super) fn cache(&self) -> Result<Cache, HubError> {
        match &self.home {
            Some(dir) => Ok(Cache { dir: dir.clone() }),
            None => Err(HubError::Cache {
                path: PathBuf::from("$YOLO9_HOME"),
                message: "no cache folder: set YOLO9_HOME (or HOME) to a writable folder".into(),
            }),
        }
    }
}
