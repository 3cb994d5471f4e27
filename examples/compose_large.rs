//! Builds a large-image test set from a dataset of small images ([`yolo9::internals::data::compose`]):
//!
//! ```text
//! cargo run --release --example compose_large -- DATA.yaml SPLIT OUT [G]
//! cargo run --release --example compose_large -- ../shared/datasets/bccd/data.yaml test /tmp/bccd-large 4
//! ```
//! writes `OUT/images/SPLIT/large_NNN.jpg` (G x G source images each; 2560x1920 for BCCD and
//! G = 4), their labels and `OUT/data.yaml`, for `yolo9 val --data OUT/data.yaml --split test
//! --tile 640` against `yolo9 val` on the source split.
use anyhow::{Context, Result};
use std::path::PathBuf;

fn main() -> Result<()> {
    let usage = "usage: compose_large DATA.yaml SPLIT OUT [G]";
    let mut args = std::env::args().skip(1);
    let data = PathBuf::from(args.next().context(usage)?);
    let split = yolo9::metrics::job::parse_split(&args.next().context(usage)?)?;
    let out = PathBuf::from(args.next().context(usage)?);
    let g: u32 = match args.next() {
        Some(s) => s.parse().with_context(|| format!("G {s}: a number"))?,
        None => 4,
    };
    let c = yolo9::internals::data::compose::compose(&data, split, &out, g, None)?;
    println!(
        "{} images of {}x{} with {} boxes in {} ({} source images left over)",
        c.images,
        c.size.0,
        c.size.1,
        c.boxes,
        out.display(),
        c.left_over
    );
    Ok(())
}
