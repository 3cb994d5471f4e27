//! The training loader: rayon workers decode and augment ahead of the training step through a
//! bounded queue.
//!
//! - **Deterministic**: the epoch order is a shuffle seeded by `(seed, epoch)`, and sample `p` of
//!   the epoch draws its augmentation from an RNG seeded by `(seed, epoch, p)`: the batches are the
//!   same whatever `workers` is, and a resumed run reproduces them from any batch index.
//! - **Bounded memory**: at most `prefetch` finished batches wait in the queue, plus the
//!   samples of the [`BATCHES_AHEAD`] batches being built, whatever `workers` is.
//! - **No idle workers at batch ends**: the samples of the next batch are queued on the workers
//!   while the current one is being finished and collated, so the slowest sample of a batch
//!   (a mixup draws two mosaics) does not leave the other workers waiting.
//! - **Never dies on a bad sample**: an image that fails to decode is replaced by the next
//!   decodable image in the epoch order and reported in [`Batch::skipped`]; the epoch goes on.
//!
//! Batches follow the official `collate_fn`: images `(B, 3, S, S)` u8 RGB, targets `(N, 6)`
//! rows `[image_index_in_batch, cls, cx, cy, w, h]` normalized.

use crate::data::augment::{augment_sample, resize_long_side_owned, AugmentConfig, SourceImage};
use image::RgbImage;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A function that decodes an image file to 8-bit RGB (EXIF and colour rules applied).
pub type DecodeFn = dyn Fn(&Path) -> anyhow::Result<RgbImage> + Send + Sync;

/// A built sample: the image, its normalized labels and (segmentation) its overlap mask with
/// the labels in the mask's order.
type Sample = (RgbImage, Vec<(u32, [f32; 4])>, Option<Vec<u32>>);

/// A built sample (`None` when nothing decodable was found) and the files skipped on the way
/// with their reasons.
type SampleResult = (Option<Sample>, Vec<(PathBuf, String)>);

/// Batches whose samples are queued on the workers at a time by [`Loader::epoch`]: the one being
/// finished and the next.
pub const BATCHES_AHEAD: usize = 2;

/// One training image and its labels `(cls, [cx, cy, w, h])`, normalized.
#[derive(Debug, Clone)]
pub struct TrainItem {
    /// Image file.
    pub path: PathBuf,
    /// Labels, normalized `cx cy w h`.
    pub labels: Vec<(u32, [f32; 4])>,
    /// Segmentation datasets: one outline per label (normalized points; empty for a box row),
    /// see [`crate::data::augment::SourceImage::outlines`]. Empty for detection.
    pub outlines: Vec<Vec<[f32; 2]>>,
}

/// Loader settings.
#[derive(Debug, Clone)]
pub struct LoaderConfig {
    /// Square training size `S` in pixels (multiple of 32).
    pub img_size: u32,
    /// Micro-batch size.
    pub batch: usize,
    /// Run seed (`--seed`).
    pub seed: u64,
    /// Decoding threads (`--workers`).
    pub workers: usize,
    /// Finished batches allowed to wait in the queue.
    pub prefetch: usize,
    /// Augmentation (set `mosaic = 0` for the close-mosaic epochs).
    pub augment: AugmentConfig,
    /// Shuffle the epoch order (training) or keep the file order.
    pub shuffle: bool,
    /// Segmentation training: each batch carries the overlap masks of its images at
    /// `1 / mask_ratio` of `img_size` ([`Batch::masks`], official `--mask-ratio`, 4). `None`:
    /// boxes only.
    pub mask_ratio: Option<usize>,
}

/// One collated micro-batch.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Index of this batch within the epoch.
    pub index: usize,
    /// `B × 3 × S × S` RGB bytes, channel-major (CHW per image).
    pub images: Vec<u8>,
    /// Number of images `B`.
    pub len: usize,
    /// Side `S`.
    pub size: u32,
    /// Targets `[img, cls, cx, cy, w, h]`, normalized.
    pub targets: Vec<[f32; 6]>,
    /// Image paths, one per image.
    pub paths: Vec<PathBuf>,
    /// Samples skipped while building this batch: path and reason.
    pub skipped: Vec<(PathBuf, String)>,
    /// Segmentation ([`LoaderConfig::mask_ratio`] `r`): `B × (S / r) × (S / r)` overlap masks
    /// (official `polygons2masks_overlap`), value `k + 1` where image `b`'s `k`-th target row
    /// (in the order of [`Batch::targets`]) is, 0 elsewhere. Empty for detection.
    pub masks: Vec<u32>,
}

/// Default number of workers: available cores − 1 (at least 1).
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get().saturating_sub(1).max(1))
        .unwrap_or(1)
}

/// The order of the dataset for `epoch`: a permutation of `0..n` seeded by `(seed, epoch)`.
pub fn epoch_order(n: usize, seed: u64, epoch: usize, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if shuffle {
        let mut rng = ChaCha8Rng::seed_from_u64(mix(seed, epoch as u64, u64::MAX));
        order.shuffle(&mut rng);
    }
    order
}

/// Positions `[lo, hi)` of `rank`'s share of the global batch `[start, end)`: `world`
/// contiguous slices in rank order, the first `len % world` ranks one image larger (a share can
/// be empty when the batch has fewer images than ranks). At `world == 1` the whole batch.
///
/// The sample at a position is the same whatever the world size (the loader seeds its
/// augmentation by epoch position), so the shares of all ranks are the single-device batch.
pub fn shard_range(start: usize, end: usize, rank: usize, world: usize) -> (usize, usize) {
    let world = world.max(1);
    let len = end.saturating_sub(start);
    let (q, r) = (len / world, len % world);
    let lo = start + rank * q + rank.min(r);
    let hi = lo + q + usize::from(rank < r);
    (lo.min(end), hi.min(end))
}

/// Number of batches per epoch (the last batch may be smaller).
pub fn batches_per_epoch(n: usize, batch: usize) -> usize {
    n.div_ceil(batch.max(1))
}

fn mix(a: u64, b: u64, c: u64) -> u64 {
    // SplitMix64 finalizer over the three words: distinct seeds per (run, epoch, sample).
    let mut z = a
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(b.wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_add(c.wrapping_mul(0x94D0_49BB_1331_11EB));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The training loader over a fixed list of items.
pub struct Loader {
    items: Arc<Vec<TrainItem>>,
    decode: Arc<DecodeFn>,
    cfg: LoaderConfig,
    pool: Arc<rayon::ThreadPool>,
    /// `decode` gives images already resized to the long side `img_size` (a RAM cache).
    resized: bool,
    /// `(rank, world)`: each batch is this rank's share ([`shard_range`]); `(0, 1)` by default.
    shard: (usize, usize),
}

/// The batches of one epoch, produced in the background. Dropping it stops the producer.
pub struct EpochBatches {
    rx: Receiver<Batch>,
    handle: Option<JoinHandle<()>>,
}

impl Iterator for EpochBatches {
    type Item = Batch;
    fn next(&mut self) -> Option<Batch> {
        self.rx.recv().ok()
    }
}

impl Drop for EpochBatches {
    fn drop(&mut self) {
        // Closing the receiver makes the producer's next send fail, so it ends promptly.
        let (_tx, rx) = sync_channel(0);
        self.rx = rx;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Loader {
    /// A loader over `items`, decoding with `decode`. Errors if the worker pool cannot start.
    pub fn new(
        items: Vec<TrainItem>,
        decode: Arc<DecodeFn>,
        cfg: LoaderConfig,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(!items.is_empty(), "no training images to load");
        anyhow::ensure!(cfg.batch >= 1, "batch size must be at least 1");
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(cfg.workers.max(1))
            .thread_name(|i| format!("yolo9-loader-{i}"))
            .build()?;
        Ok(Loader {
            items: Arc::new(items),
            decode,
            cfg,
            pool: Arc::new(pool),
            resized: false,
            shard: (0, 1),
        })
    }

    /// The same loader for a `decode` that returns images already resized so their long side
    /// is `img_size` (as [`crate::data::augment::resize_long_side`] does; e.g. the RAM cache of `--cache ram`): they
    /// are used as they are, so the batches equal those of the uncached loader byte for byte.
    pub fn with_resized_source(mut self) -> Self {
        self.resized = true;
        self
    }

    /// The same loader giving rank `rank`'s share of each batch of `world` ranks
    /// ([`shard_range`] of the batch's epoch positions; `batch` stays the global batch, the
    /// batch count and [`Batch::index`] are the single-device ones). At `world == 1` the loader
    /// is unchanged. Errors when `rank >= world`.
    pub fn with_shard(mut self, rank: usize, world: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(
            rank < world,
            "rank {rank} of world size {world}: the rank must be below the world size"
        );
        self.shard = (rank, world);
        Ok(self)
    }

    /// Positions `[lo, hi)` of this loader's part of batch `b` (its shard of the global batch).
    fn part(&self, n: usize, b: usize) -> (usize, usize) {
        let (lo, hi) = batch_range(n, self.cfg.batch, b);
        shard_range(lo, hi, self.shard.0, self.shard.1)
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when there are no items (never: [`Loader::new`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The settings (mutable between epochs, e.g. to close mosaic or change the batch size).
    pub fn config_mut(&mut self) -> &mut LoaderConfig {
        &mut self.cfg
    }

    /// The settings.
    pub fn config(&self) -> &LoaderConfig {
        &self.cfg
    }

    /// Builds one sample: position `pos` of the epoch, dataset index `index`.
    fn sample(&self, epoch: usize, pos: usize, index: usize) -> SampleResult {
        let decode = (&self.decode, self.resized);
        build_sample(&self.items, decode, &self.cfg, epoch, pos, index)
    }

    /// Builds batch `b` of `epoch` synchronously (used by the producer and by tests).
    pub fn batch(&self, epoch: usize, b: usize) -> Batch {
        let order = epoch_order(self.items.len(), self.cfg.seed, epoch, self.cfg.shuffle);
        make_batch(self, &order, epoch, b)
    }

    /// Starts producing the batches of `epoch` from batch index `start` (for resume) in the
    /// background.
    pub fn epoch(&self, epoch: usize, start: usize) -> EpochBatches {
        let (tx, rx) = sync_channel(self.cfg.prefetch.max(1));
        let this = Loader {
            items: self.items.clone(),
            decode: self.decode.clone(),
            cfg: self.cfg.clone(),
            pool: self.pool.clone(),
            resized: self.resized,
            shard: self.shard,
        };
        let this = Arc::new(this);
        let handle = std::thread::spawn(move || {
            let order = epoch_order(this.items.len(), this.cfg.seed, epoch, this.cfg.shuffle);
            let order = Arc::new(order);
            let nb = batches_per_epoch(order.len(), this.cfg.batch);
            let mut inflight = VecDeque::new();
            let mut next = start;
            loop {
                while inflight.len() < BATCHES_AHEAD && next < nb {
                    inflight.push_back((next, launch(&this, &order, epoch, next)));
                    next += 1;
                }
                let Some((b, rx)) = inflight.pop_front() else {
                    break;
                };
                let (lo, hi) = this.part(order.len(), b);
                let mut results: Vec<(usize, SampleResult)> = Vec::with_capacity(hi - lo);
                for _ in lo..hi {
                    match rx.recv() {
                        Ok(r) => results.push(r),
                        Err(_) => break,
                    }
                }
                results.sort_by_key(|r| r.0);
                let batch = collate(&this, &order, b, results, false);
                if tx.send(batch).is_err() {
                    break;
                }
            }
        });
        EpochBatches {
            rx,
            handle: Some(handle),
        }
    }
}

fn build_sample(
    items: &Arc<Vec<TrainItem>>,
    (decode, resized): (&Arc<DecodeFn>, bool),
    cfg: &LoaderConfig,
    epoch: usize,
    pos: usize,
    index: usize,
) -> SampleResult {
    let n = items.len();
    let skipped = std::sync::Mutex::new(Vec::new());
    let load = |i: usize| -> Option<SourceImage> {
        let it = &items[i];
        match decode(&it.path) {
            Ok(img) => Some(SourceImage {
                image: if resized {
                    img
                } else {
                    resize_long_side_owned(img, cfg.img_size)
                },
                labels: it.labels.clone(),
                // Segmentation of an image without outlines: each box stands for its outline.
                outlines: if cfg.mask_ratio.is_some() && it.outlines.is_empty() {
                    vec![Vec::new(); it.labels.len()]
                } else {
                    it.outlines.clone()
                },
            }),
            Err(e) => {
                if let Ok(mut s) = skipped.lock() {
                    s.push((it.path.clone(), format!("{e:#}")));
                }
                None
            }
        }
    };
    // A sample that cannot be decoded is replaced by the next decodable one in dataset order.
    for k in 0..n {
        let idx = (index + k) % n;
        let mut rng = ChaCha8Rng::seed_from_u64(mix(cfg.seed, epoch as u64, pos as u64));
        if let Some(a) = augment_sample(&cfg.augment, cfg.img_size, idx, n, &load, &mut rng) {
            let mut s = skipped.into_inner().unwrap_or_default();
            s.dedup_by(|a, b| a.0 == b.0);
            let sample = match cfg.mask_ratio {
                None => (a.image, a.labels, None),
                Some(r) => {
                    let (mask, order) = a.overlap_mask(r);
                    let labels = order.iter().map(|&k| a.labels[k]).collect();
                    (a.image, labels, Some(mask))
                }
            };
            return (Some(sample), s);
        }
    }
    (None, skipped.into_inner().unwrap_or_default())
}

/// Positions `[lo, hi)` of batch `b` in the epoch order.
fn batch_range(n: usize, bs: usize, b: usize) -> (usize, usize) {
    let bs = bs.max(1);
    ((b * bs).min(n), ((b + 1) * bs).min(n))
}

/// Queues the samples of batch `b` on the workers; they arrive on the receiver as they finish.
fn launch(
    loader: &Arc<Loader>,
    order: &Arc<Vec<usize>>,
    epoch: usize,
    b: usize,
) -> Receiver<(usize, SampleResult)> {
    let (lo, hi) = loader.part(order.len(), b);
    let (stx, srx) = channel();
    for p in lo..hi {
        let (l, o, stx) = (loader.clone(), order.clone(), stx.clone());
        loader.pool.spawn(move || {
            // A panic in a spawned job would abort the process: it becomes a skipped sample.
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.sample(epoch, p, o[p])))
                    .unwrap_or_else(|_| {
                        let path = l.items[o[p]].path.clone();
                        (
                            None,
                            vec![(path, "internal error while augmenting".to_string())],
                        )
                    });
            // The epoch was dropped: nobody waits for this sample.
            let _ = stx.send((p, r));
        });
    }
    srx
}

fn make_batch(loader: &Loader, order: &[usize], epoch: usize, b: usize) -> Batch {
    let (lo, hi) = loader.part(order.len(), b);
    let positions: Vec<usize> = (lo..hi).collect();
    let results: Vec<_> = loader.pool.install(|| {
        positions
            .par_iter()
            .map(|&p| (p, loader.sample(epoch, p, order[p])))
            .collect()
    });
    collate(loader, order, b, results, true)
}

/// Collates the samples of batch `b` (in position order) into a [`Batch`]: images CHW one after
/// another, targets with their image index. `parallel`: split the CHW copy over the workers
/// (when they are idle), else do it on the calling thread.
fn collate(
    loader: &Loader,
    order: &[usize],
    b: usize,
    results: Vec<(usize, SampleResult)>,
    parallel: bool,
) -> Batch {
    let s = loader.cfg.img_size as usize;
    let mut batch = Batch {
        index: b,
        images: Vec::new(),
        len: 0,
        size: loader.cfg.img_size,
        targets: Vec::new(),
        paths: Vec::new(),
        skipped: Vec::new(),
        masks: Vec::new(),
    };
    let mut images = Vec::with_capacity(results.len());
    for (p, (sample, skipped)) in results {
        batch.skipped.extend(skipped);
        let Some((img, labels, mask)) = sample else {
            continue;
        };
        batch.masks.extend(mask.unwrap_or_default());
        let i = batch.len as f32;
        for (cls, l) in labels {
            batch.targets.push([i, cls as f32, l[0], l[1], l[2], l[3]]);
        }
        batch.paths.push(loader.items[order[p]].path.clone());
        batch.len += 1;
        images.push(img);
    }
    // HWC RGB → CHW, each image by a worker straight into its slot of the batch.
    let plane = s * s;
    batch.images = vec![0u8; images.len() * 3 * plane];
    if parallel {
        loader.pool.install(|| {
            batch
                .images
                .par_chunks_mut(3 * plane)
                .zip(images.into_par_iter())
                .for_each(|(dst, img)| hwc_to_chw(img.as_raw(), dst, plane));
        });
    } else {
        for (dst, img) in batch.images.chunks_mut(3 * plane).zip(&images) {
            hwc_to_chw(img.as_raw(), dst, plane);
        }
    }
    batch
}

/// Splits interleaved RGB (`plane` pixels) into three planes `R…G…B…` of `dst`.
fn hwc_to_chw(src: &[u8], dst: &mut [u8], plane: usize) {
    let (r, rest) = dst.split_at_mut(plane.min(dst.len()));
    let (g, b) = rest.split_at_mut(plane.min(rest.len()));
    for (((p, r), g), b) in src.chunks_exact(3).zip(r).zip(g).zip(b) {
        *r = p[0];
        *g = p[1];
        *b = p[2];
    }
}
