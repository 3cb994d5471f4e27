//! Training-loader throughput: `cargo bench --bench loader -- [DATASET] [--img 640]
//! [--batch 16] [--workers 1,2,4,8,16] [--batches N] [--samples N] [--ram]`.
//!
//! `DATASET` is a folder with `data.yaml` or the yaml itself (default
//! `$YOLO9_SHARED/datasets/bccd`, else `../shared/datasets/bccd`); its train split is read
//! without writing a label cache. Prints `name value unit` lines:
//!
//! - `decode_ms`: one JPEG/PNG decode plus the resize to long side `--img` (median);
//! - `augment_reference_ms` / `augment_fast_ms`: one training sample with mosaic (the default
//!   `hyp.scratch-high` recipe: mosaic 1.0, mixup 0.15) from images already in memory, by the f64
//!   reference path (`augment_sample_reference`: 2s×2s canvas, f64 warp and HSV) and by the
//!   one-pass fixed-point path the loader uses (`augment_sample`); medians over `--samples`
//!   seeds on one thread;
//! - `loader_workers_W img/s`: the whole loader (decode from disk, mosaic, augmentation,
//!   collation to CHW batches) for `--batches` batches (default: one epoch) after one warm-up
//!   batch, for each worker count; with `--ram` also `loader_ram_workers_W` from images held in
//!   memory already resized (as `--cache ram`).

use anyhow::{bail, Context, Result};
use image::RgbImage;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use yolo9::data::image::load_rgb8;
use yolo9::internals::data::augment::{
    augment_hsv, augment_hsv_reference, augment_sample, augment_sample_reference, mosaic4,
    random_affine, resize_long_side, warp_affine, AugmentConfig, SourceImage,
};
use yolo9::internals::data::loader::{
    batches_per_epoch, DecodeFn, Loader, LoaderConfig, TrainItem,
};
use yolo9::internals::data::scan::{scan_split, ScanOptions};
use yolo9::internals::data::warp::{mosaic_placements, warp_tiles, CanvasTile};
use yolo9::internals::data::yaml::{DataConfig, Split};

struct Args {
    data: PathBuf,
    img: u32,
    batch: usize,
    workers: Vec<usize>,
    batches: Option<usize>,
    samples: usize,
    ram: bool,
}

fn parse_args() -> Result<Args> {
    let shared = std::env::var_os("YOLO9_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    let mut a = Args {
        data: shared.join("datasets/bccd"),
        img: 640,
        batch: 16,
        workers: vec![1, 2, 4, 8, 16],
        batches: None,
        samples: 12,
        ram: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().with_context(|| format!("{k} needs a value"));
        match k.as_str() {
            "--img" => a.img = val()?.parse()?,
            "--batch" => a.batch = val()?.parse()?,
            "--workers" => {
                a.workers = val()?
                    .split(',')
                    .map(|w| w.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            "--batches" => a.batches = Some(val()?.parse()?),
            "--samples" => a.samples = val()?.parse()?,
            "--ram" => a.ram = true,
            // `cargo bench` passes --bench to every bench binary.
            "--bench" => {}
            s if s.starts_with("--") => bail!("unknown option {s}"),
            s => a.data = PathBuf::from(s),
        }
    }
    Ok(a)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn items(data: &Path) -> Result<Vec<TrainItem>> {
    let yaml = if data.is_dir() {
        data.join("data.yaml")
    } else {
        data.to_path_buf()
    };
    let cfg = DataConfig::load(&yaml)?;
    let opts = ScanOptions {
        use_cache: false,
        print: false,
        ..Default::default()
    };
    let scan = scan_split(&cfg, Split::Train, &opts)?;
    Ok(scan
        .records
        .iter()
        .map(|r| TrainItem {
            path: r.image.clone(),
            labels: r
                .boxes
                .iter()
                .map(|b| (b.cls, [b.cx, b.cy, b.w, b.h]))
                .collect(),
            outlines: r.segments.clone(),
        })
        .collect())
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let items = items(&args.data)?;
    if items.is_empty() {
        bail!("no training images under {}", args.data.display());
    }
    let s = args.img;
    println!("dataset {} images {}", args.data.display(), items.len());
    println!(
        "host_cores {}",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    // Decode (+ resize) of every image once: the in-memory set for the augmentation timing.
    let mut decode_ms = Vec::new();
    let mut mem: Vec<SourceImage> = Vec::with_capacity(items.len());
    for it in &items {
        let t = Instant::now();
        let img = resize_long_side(&load_rgb8(&it.path)?, s);
        decode_ms.push(t.elapsed().as_secs_f64() * 1e3);
        mem.push(SourceImage {
            image: img,
            labels: it.labels.clone(),
            outlines: it.outlines.clone(),
        });
    }
    println!("decode_ms {:.2}", median(decode_ms));

    let n = mem.len();
    let load = |i: usize| mem.get(i).cloned();
    let cfg = AugmentConfig::default();
    for (name, fast) in [("augment_reference_ms", false), ("augment_fast_ms", true)] {
        let mut times = Vec::new();
        for seed in 0..args.samples as u64 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let t = Instant::now();
            let out = if fast {
                augment_sample(&cfg, s, seed as usize % n, n, &load, &mut rng)
            } else {
                augment_sample_reference(&cfg, s, seed as usize % n, n, &load, &mut rng)
            };
            times.push(t.elapsed().as_secs_f64() * 1e3);
            std::hint::black_box(out);
        }
        println!("{name} {:.2}", median(times));
    }

    // The parts: the mosaic + affine warp and the HSV step, reference vs fast.
    {
        let mut t_ref_warp = Vec::new();
        let mut t_fast_warp = Vec::new();
        let mut t_ref_hsv = Vec::new();
        let mut t_fast_hsv = Vec::new();
        for seed in 0..args.samples as u64 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let k = seed as usize;
            let tiles = [
                &mem[k % n],
                &mem[(k + 1) % n],
                &mem[(k + 2) % n],
                &mem[(k + 3) % n],
            ];
            let centre = (s as i64 * 3 / 4, s as i64 * 5 / 4);
            let (m, _) = random_affine(&cfg, 2 * s, 2 * s, -(s as i64) / 2, &mut rng);
            let t = Instant::now();
            let (canvas, _) = mosaic4(tiles, s, centre);
            let reference = warp_affine(&canvas, &m, s, s);
            t_ref_warp.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let places = mosaic_placements(tiles.map(|i| i.image.dimensions()), s, centre);
            let ct: [CanvasTile; 4] = std::array::from_fn(|i| CanvasTile {
                image: &tiles[i].image,
                place: places[i],
            });
            let mut fast = RgbImage::new(s, s);
            warp_tiles(&ct, &m, &mut fast);
            t_fast_warp.push(t.elapsed().as_secs_f64() * 1e3);
            let mut a = reference.clone();
            let t = Instant::now();
            augment_hsv_reference(&mut a, 0.015, 0.7, 0.4, &mut rng);
            t_ref_hsv.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            augment_hsv(&mut fast, 0.015, 0.7, 0.4, &mut rng);
            t_fast_hsv.push(t.elapsed().as_secs_f64() * 1e3);
            std::hint::black_box((a, fast));
        }
        println!("warp_reference_ms {:.2}", median(t_ref_warp));
        println!("warp_fast_ms {:.2}", median(t_fast_warp));
        println!("hsv_reference_ms {:.2}", median(t_ref_hsv));
        println!("hsv_fast_ms {:.2}", median(t_fast_hsv));
    }

    let disk: Arc<DecodeFn> = Arc::new(|p: &Path| load_rgb8(p));
    let cache: Arc<HashMap<PathBuf, RgbImage>> = Arc::new(
        items
            .iter()
            .zip(&mem)
            .map(|(it, m)| (it.path.clone(), m.image.clone()))
            .collect(),
    );
    drop(mem);
    let ram: Arc<DecodeFn> = Arc::new(move |p: &Path| {
        cache
            .get(p)
            .cloned()
            .with_context(|| format!("{} not cached", p.display()))
    });
    let modes: &[(&str, bool)] = if args.ram {
        &[("loader", false), ("loader_ram", true)]
    } else {
        &[("loader", false)]
    };
    let nb = batches_per_epoch(items.len(), args.batch);
    for &(name, cached) in modes {
        for &w in &args.workers {
            let cfg = LoaderConfig {
                img_size: s,
                batch: args.batch,
                seed: 0,
                workers: w,
                prefetch: 2,
                augment: AugmentConfig::default(),
                shuffle: true,
                mask_ratio: None,
            };
            let decode = if cached { ram.clone() } else { disk.clone() };
            let mut loader = Loader::new(items.clone(), decode, cfg)?;
            if cached {
                loader = loader.with_resized_source();
            }
            // Warm-up: one batch (thread start, allocator).
            std::hint::black_box(loader.batch(1, 0));
            let take = args.batches.unwrap_or(nb).min(nb);
            let t = Instant::now();
            let mut images = 0;
            for b in loader.epoch(0, 0).take(take) {
                images += b.len;
            }
            let secs = t.elapsed().as_secs_f64();
            println!(
                "{name}_workers_{w} {:.1} img/s ({images} images in {secs:.2} s)",
                images as f64 / secs
            );
        }
    }
    Ok(())
}
