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
            outlines: Vec::new(),
        });
    }
    // One corrupt file: it must be skipped, reported and replaced.
    let bad = dir.join("broken.png");
    std::fs::write(&bad, b"\x89PNG\r\n\x1a\nnot really").unwrap();
    items.push(TrainItem {
        path: bad,
        labels: vec![],
        outlines: Vec::new(),
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
        mask_ratio: None,
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

#[test]
fn segmentation_batches_carry_overlap_masks_in_target_order() -> anyhow::Result<()> {
    let (dir, mut items) = dataset("seg");
    // The 40 × 30 rectangle of each image as a 4-point outline (the broken one has none).
    for it in &mut items {
        it.outlines = it
            .labels
            .iter()
            .map(|(_, l)| {
                let (x1, y1) = (l[0] - l[2] / 2.0, l[1] - l[3] / 2.0);
                let (x2, y2) = (l[0] + l[2] / 2.0, l[1] + l[3] / 2.0);
                vec![[x1, y1], [x2, y1], [x2, y2], [x1, y2]]
            })
            .collect();
    }
    let seg = LoaderConfig {
        mask_ratio: Some(4),
        ..cfg(2)
    };
    let loader = Loader::new(items.clone(), decode(), seg.clone())?;
    let det = Loader::new(items, decode(), cfg(2))?;
    let (mut objects, mut area) = (0, 0);
    for (b, d) in loader.epoch(0, 0).zip(det.epoch(0, 0)) {
        assert_eq!(b.masks.len(), b.len * 16 * 16, "(B, 64/4, 64/4)");
        assert!(d.masks.is_empty(), "boxes only without mask_ratio");
        assert_eq!(b.images, d.images, "the masks change no pixel");
        for i in 0..b.len {
            let rows = b.targets.iter().filter(|t| t[0] as usize == i).count();
            let plane = &b.masks[i * 256..(i + 1) * 256];
            let top = plane.iter().copied().max().unwrap_or(0) as usize;
            assert!(top <= rows, "mask values index the image's target rows");
            objects += rows;
            area += plane.iter().filter(|&&v| v != 0).count();
        }
    }
    assert!(
        objects > 4 && area > 50,
        "{objects} objects, {area} mask pixels"
    );
    // Items without outlines (box labels) train their boxes as outlines: no label is lost.
    let (_, boxes_only) = dataset("seg");
    let loader = Loader::new(boxes_only, decode(), seg)?;
    let (mut rows, mut area) = (0, 0);
    for b in loader.epoch(0, 0) {
        rows += b.targets.len();
        area += b.masks.iter().filter(|&&v| v != 0).count();
    }
    assert!(rows > 4 && area > 50, "{rows} rows, {area} mask pixels");
    std::fs::remove_dir_all(dir).ok();
    Ok(())
}
