//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The `shared/` folder beside the repository (oracle files, datasets, bad-input cases).
/// Override with `YOLO9_SHARED`. Panics with a clear message when it is missing: the parity
/// tests must never pass by skipping.
pub fn shared_dir() -> PathBuf {
    let p = match std::env::var_os("YOLO9_SHARED") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"),
    };
    assert!(
        p.join("reference").is_dir(),
        "shared folder not found at {} (set YOLO9_SHARED)",
        p.display()
    );
    p
}

/// `shared/reference/<name>`.
pub fn reference(name: &str) -> PathBuf {
    shared_dir().join("reference").join(name)
}

/// `shared/cases/<name>`.
pub fn case(name: &str) -> PathBuf {
    shared_dir().join("cases").join(name)
}

/// A tiny dataset of the first `n_train` BCCD train images (and 1 val image) in `dir`, with
/// `dir/hyp.yaml` turning augmentation off and raising the LR so few iterations move the weights.
pub fn tiny_dataset(dir: &std::path::Path, n_train: usize) -> PathBuf {
    let src = shared_dir().join("datasets/bccd");
    let mut names: Vec<_> = std::fs::read_dir(src.join("images/train"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for split in ["train", "val"] {
        std::fs::create_dir_all(dir.join("images").join(split)).unwrap();
        std::fs::create_dir_all(dir.join("labels").join(split)).unwrap();
        for n in names
            .iter()
            .take(if split == "train" { n_train } else { 1 })
        {
            std::fs::copy(
                src.join("images/train").join(n),
                dir.join("images").join(split).join(n),
            )
            .unwrap();
            let stem = std::path::Path::new(n).with_extension("txt");
            std::fs::copy(
                src.join("labels/train").join(&stem),
                dir.join("labels").join(split).join(&stem),
            )
            .unwrap();
        }
    }
    let yaml = dir.join("data.yaml");
    std::fs::write(
        &yaml,
        "path: .\ntrain: images/train\nval: images/val\nnames: [RBC, WBC, Platelets]\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("hyp.yaml"),
        "lr0: 0.1\nwarmup_bias_lr: 0.1\nlrf: 0.01\nmomentum: 0.937\nweight_decay: 0.0005\nwarmup_epochs: 3.0\n\
         hsv_h: 0\nhsv_s: 0\nhsv_v: 0\ntranslate: 0\nscale: 0\nfliplr: 0\nmosaic: 0\nmixup: 0\n",
    )
    .unwrap();
    yaml
}

/// max |a − b| over all elements, in f64 (both tensors converted to f64 on the CPU; same shape).
pub fn max_abs(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims(), "max_abs: shapes differ");
    let f = |t: &candle_core::Tensor| {
        t.to_device(&candle_core::Device::Cpu)
            .unwrap()
            .to_dtype(candle_core::DType::F64)
            .unwrap()
    };
    abs_max(&(f(a) - f(b)).unwrap())
}

/// max |a| over all elements, in f64.
pub fn abs_max(a: &candle_core::Tensor) -> f64 {
    a.to_device(&candle_core::Device::Cpu)
        .unwrap()
        .to_dtype(candle_core::DType::F64)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

/// A reproducible f64 CPU tensor with values uniform in [−1, 1) (xorshift64 from `seed`).
pub fn uniform(shape: &[usize], seed: u64) -> candle_core::Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f64> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect();
    candle_core::Tensor::from_vec(v, shape, &candle_core::Device::Cpu).unwrap()
}

/// A fresh, empty folder for one test: `<tmp>/yolo9-<test binary>-<tag>-<pid>` (removed first if
/// an earlier run left it).
pub fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "yolo9-{}-{tag}-{}",
        env!("CARGO_CRATE_NAME"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
