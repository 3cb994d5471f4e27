//! The training loader: determinism across worker counts, bounded queue, bad samples skipped.
use image::{Rgb, RgbImage};
use std::path::PathBuf;
use std::sync::Arc;
use yolo9::internals::data::augment::AugmentConfig;
use yolo9::internals::data::loader::*;

fn dataset(tag: &str) -> (PathBuf, Vec<TrainItem>) {
    let dir = std::env::temp_dir().join(format!("yolo9-loader-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut items = Vec::new();
    for i in 0..7u32 {
        let p = dir.join(format!("img{i}.png"));
        let mut img = RgbImage::from_pixel(80 + 8 * i, 60, Rgb([30, 60, 90]));
        for y in 10..40 {
            for x in 10..50 {
                img.put_pixel(x, y, Rgb([200, (i * 30) as u8, 40]));
            }
        }
        img.save(&p).unwrap();
        let w = (80 + 8 * i) as f32;
        items.push(TrainItem {
            path: p,
            labels: vec![(i % 3, [30.0 / w, 25.0 / 60.0, 40.0 / w, 30.0 / 60.0])],
        });
    }
    // One corrupt file: it must be skipped, reported and replaced.
    let bad = dir.join("broken.png");
    std::fs::write(&bad, b"\x89PNG\r\n\x1a\nnot really").unwrap();
    items.push(TrainItem {
        path: bad,
        labels: vec![],
    });
    (dir, items)
}

fn decode() -> Arc<DecodeFn> {
    Arc::new(|p: &std::path::Path| Ok(image::open(p)?.to_rgb8()))
}

fn cfg(workers: usize) -> LoaderConfig {
    LoaderConfig {
        img_size: 64,
        batch: 3,
        seed: 7,
        workers,
        prefetch: 2,
        augment: AugmentConfig::default(),
        shuffle: true,
    }
}

#[test]
fn same_batches_whatever_the_worker_count() -> anyhow::Result<()> {
    let (dir, items) = dataset("det");
    let a = Loader::new(items.clone(), decode(), cfg(1))?;
    let b = Loader::new(items, decode(), cfg(3))?;
    let ea: Vec<Batch> = a.epoch(2, 0).collect();
    let eb: Vec<Batch> = b.epoch(2, 0).collect();
    assert_eq!(ea.len(), 3); // 8 items in batches of 3
    let mut total = 0;
    for (x, y) in ea.iter().zip(&eb) {
        assert_eq!(x.images, y.images);
        assert_eq!(x.targets, y.targets);
        assert_eq!(x.images.len(), x.len * 3 * 64 * 64);
        for t in &x.targets {
            assert!((t[0] as usize) < x.len);
        }
        total += x.len;
    }
    // Every position yields an image: the broken one is replaced, and reported.
    assert_eq!(total, 8);
    let skipped: Vec<_> = ea.iter().flat_map(|b| b.skipped.clone()).collect();
    assert!(
        skipped.iter().any(|(p, _)| p.ends_with("broken.png")),
        "{skipped:?}"
    );
    // The pipelined producer gives what the synchronous path builds.
    for (k, x) in ea.iter().enumerate() {
        let y = a.batch(2, k);
        assert_eq!(
            (&x.images, &x.targets, &x.paths),
            (&y.images, &y.targets, &y.paths)
        );
    }
    // Resuming from batch 1 gives the same batches as the uninterrupted epoch.
    let resumed: Vec<Batch> = a.epoch(2, 1).collect();
    assert_eq!(resumed[0].images, ea[1].images);
    // Another epoch is shuffled differently.
    assert_ne!(epoch_order(8, 7, 2, true), epoch_order(8, 7, 3, true));
    std::fs::remove_dir_all(dir).ok();
    Ok(())
}

#[test]
fn dropping_an_epoch_stops_the_producer() -> anyhow::Result<()> {
    let (dir, items) = dataset("drop");
    let l = Loader::new(items, decode(), cfg(2))?;
    let mut it = l.epoch(0, 0);
    assert!(it.next().is_some());
    drop(it); // must return (producer blocked on the bounded queue is released)
    std::fs::remove_dir_all(dir).ok();
    Ok(())
}
