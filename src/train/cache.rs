//! `--cache ram`: the training images decoded and resized once, kept in memory (the official
//! `LoadImagesAndLabels(cache_images='ram')`, and its `check_cache_ram` memory check).
//!
//! Each image is stored as the loader uses it before augmentation: decoded to RGB and resized
//! so its long side is `--img` ([`resize_long_side`], the official `load_image`). The loader then
//! takes it as it is ([`crate::data::loader::Loader::with_resized_source`]), so cached and
//! uncached runs give the same batches byte for byte.
//!
//! Before anything is decoded the memory the cache needs is estimated from the image sizes the
//! dataset scan read from the headers: `Σ 3 · w' · h'` bytes, `(w', h')` each image's size after
//! the resize. When that plus a [`CACHE_MARGIN`] share exceeds the available memory
//! (`MemAvailable`), the run goes on **without** a cache and says so (as the official trainer:
//! "not caching images"). Images that fail to decode are not cached; the loader meets them as
//! without a cache (skipped and replaced, with the reason).

use crate::data::augment::resize_long_side;
use crate::data::loader::DecodeFn;
use crate::memory::fmt_size;
use image::RgbImage;
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Share of the estimate added as a safety margin before comparing with the available memory
/// (the official `check_cache_ram(safety_margin=0.1)`).
pub const CACHE_MARGIN: f64 = 0.1;

/// The size `(w', h')` of a `w × h` image after [`resize_long_side`] to `img_size`.
pub fn resized_dims(w: u32, h: u32, img_size: u32) -> (u32, u32) {
    let r = img_size as f64 / w.max(h).max(1) as f64;
    if (r - 1.0).abs() < f64::EPSILON {
        return (w, h);
    }
    (
        ((w as f64 * r) as u32).max(1),
        ((h as f64 * r) as u32).max(1),
    )
}

/// Bytes the cache of images of sizes `dims` (`(w, h)` as stored in the files) needs at
/// `img_size`: `Σ 3 · w' · h'`.
pub fn cache_bytes(dims: &[(u32, u32)], img_size: u32) -> u64 {
    dims.iter()
        .map(|&(w, h)| {
            let (w, h) = resized_dims(w, h, img_size);
            3 * w as u64 * h as u64
        })
        .sum()
}

/// Whether a cache of `needed` bytes fits in `available` bytes with the [`CACHE_MARGIN`]; the
/// `Err` is the line that says why not (both sizes named).
pub fn check_fits(needed: u64, available: u64) -> Result<(), String> {
    let with_margin = needed as f64 * (1.0 + CACHE_MARGIN);
    if with_margin < available as f64 {
        Ok(())
    } else {
        Err(format!(
            "warning: --cache ram needs {} for the training images (+{:.0}% margin), only {} \
             memory is available: not caching images (training decodes them as without --cache)",
            fmt_size(needed),
            CACHE_MARGIN * 100.0,
            fmt_size(available)
        ))
    }
}

/// Decoded, resized training images by path.
pub struct RamCache {
    images: HashMap<PathBuf, RgbImage>,
    bytes: u64,
}

impl RamCache {
    /// Decodes every one of `paths` with `decode` on `workers` threads and keeps it resized to
    /// the long side `img_size`. Images that fail to decode are left out (the loader meets them
    /// as without a cache). `cancel` is asked between images: a request ends the fill with
    /// [`crate::cancel::Stopped`] in the error chain.
    pub fn fill(
        paths: &[PathBuf],
        decode: &DecodeFn,
        img_size: u32,
        workers: usize,
        cancel: &crate::cancel::Cancel,
    ) -> anyhow::Result<RamCache> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(workers.max(1))
            .thread_name(|i| format!("yolo9-cache-{i}"))
            .build()?;
        let decoded: Vec<anyhow::Result<Option<(PathBuf, RgbImage)>>> = pool.install(|| {
            paths
                .par_iter()
                .map(|p| {
                    cancel.check("caching the training images")?;
                    Ok(decode(p)
                        .ok()
                        .map(|img| (p.clone(), resize_long_side(&img, img_size))))
                })
                .collect()
        });
        let mut images = HashMap::with_capacity(paths.len());
        let mut bytes = 0u64;
        for d in decoded {
            if let Some((p, img)) = d? {
                bytes += img.as_raw().len() as u64;
                images.insert(p, img);
            }
        }
        Ok(RamCache { images, bytes })
    }

    /// Number of cached images.
    pub fn len(&self) -> usize {
        self.images.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
    }

    /// Bytes of pixel data held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// A decode function for the loader (use it with
    /// [`crate::data::loader::Loader::with_resized_source`]): the cached image of a path, else
    /// `decode` of it resized as the cache stores images (`fallback` for images the fill could
    /// not decode: the same error comes back).
    pub fn decode_fn(self, fallback: Arc<DecodeFn>, img_size: u32) -> Arc<DecodeFn> {
        let images = Arc::new(self.images);
        Arc::new(move |p: &Path| match images.get(p) {
            Some(img) => Ok(img.clone()),
            None => fallback(p).map(|img| resize_long_side(&img, img_size)),
        })
    }
}
