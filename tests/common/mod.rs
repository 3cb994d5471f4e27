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

/// `shared/cases/<name>`, lexically normalized (the yaml loader reports normalized paths).
pub fn case_dir(name: &str) -> PathBuf {
    yolo9::internals::data::fsio::normalize(&case(name))
}

/// Copies the folder tree `from` to `to`, every copied file and folder writable (the source may
/// be read-only, as `../shared` is in CI), for tests that need a dataset they may change.
pub fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.path().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
            set_writable(&dst, true);
        }
    }
    set_writable(to, true);
}

/// Makes `path` writable or read-only (the owner's write bit).
pub fn set_writable(path: &std::path::Path, writable: bool) {
    let mut perm = std::fs::metadata(path).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perm.set_readonly(!writable);
    std::fs::set_permissions(path, perm).unwrap();
}

/// Options of a tiny CPU training run in `dir` named `name`: the [`tiny_dataset`] of 2 train
/// images there (made when `dir/data.yaml` is missing), its `hyp.yaml`, 3 epochs of batch 1 at
/// 64x64 with one loader thread, no close-mosaic, quiet, validating only the final epoch.
pub fn tiny_run_options(dir: &std::path::Path, name: &str) -> yolo9::train::trainer::TrainOptions {
    let yaml = if dir.join("data.yaml").is_file() {
        dir.join("data.yaml")
    } else {
        tiny_dataset(dir, 2)
    };
    let mut o = yolo9::train::trainer::TrainOptions::new(yaml);
    // The smallest model: what these runs check (the engine: resume, guards, groups, budget)
    // does not depend on the model's size, and yolov9-t trains several times faster than -s.
    o.cfg = Some("yolov9-t".into());
    o.epochs = 3;
    o.img = 64;
    o.batch = 1;
    o.workers = 1;
    o.close_mosaic = 0;
    o.project = dir.join("runs");
    o.name = name.into();
    o.hyp = Some(dir.join("hyp.yaml"));
    o.verbose = false;
    o.noval = true;
    o
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

/// A fresh, empty folder for one test: `<tmp>/yolo9-<test binary>-<calling file>-<tag>-<pid>`
/// (removed first if an earlier run left it). The calling file (`tests/data/scan.rs` gives
/// `scan`) keeps the tags of the files grouped into one test binary apart.
#[track_caller]
pub fn tmpdir(tag: &str) -> PathBuf {
    let file = std::path::Path::new(std::panic::Location::caller().file())
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let d = std::env::temp_dir().join(format!(
        "yolo9-{}-{file}-{tag}-{}",
        env!("CARGO_CRATE_NAME"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs the `yolo9` program of this build with `args` in `cwd` (the test's own working
/// directory when `None`): `(exit code, stdout, stderr)`, the code -1 when a signal ended it.
pub fn yolo9_in(cwd: Option<&std::path::Path>, args: &[&str]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_yolo9"));
    cmd.args(args);
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    let out = cmd.output().expect("run yolo9");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`yolo9_in`] the test's working directory.
pub fn yolo9(args: &[&str]) -> (i32, String, String) {
    yolo9_in(None, args)
}

/// CRC-32 (ISO-HDLC, PNG's) of `data`.
pub fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A PNG that is only a header: the signature, an IHDR claiming `w`×`h` with `bit_depth` and
/// `color_type` (0 grey, 2 RGB, 4 grey + alpha), an empty IDAT (so the header parses completely)
/// and IEND. Decoders read its size without allocating pixels; decoding it fails as truncated.
pub fn png_header(w: u32, h: u32, bit_depth: u8, color_type: u8) -> Vec<u8> {
    let mut v = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[bit_depth, color_type, 0, 0, 0]);
    v.extend_from_slice(&13u32.to_be_bytes());
    v.extend_from_slice(&ihdr);
    v.extend_from_slice(&crc32(&ihdr).to_be_bytes());
    for kind in [&b"IDAT"[..], &b"IEND"[..]] {
        v.extend_from_slice(&0u32.to_be_bytes());
        v.extend_from_slice(kind);
        v.extend_from_slice(&crc32(kind).to_be_bytes());
    }
    v
}

/// A synthetic assigner batch in the layout of the YOLOv9 head, for the device assigner tests:
/// `(anchors, pbox (B, 4, A) grid units, logits (B, 64 + nc, A), gt)` for square images of side
/// `img` (strides 8, 16, 32), `bs` images of up to `m` GT rows each. Deterministic in `seed`.
/// Image 1 has class logits of -200 (every score 0, so every metric is 0: the top-k fallback)
/// and a GT row over the top-left corner (the anchors the fallback picks),
/// image 2 predicts boxes far from every GT at every other anchor (overlaps 0), the last image has no GT rows
/// (padding), and some rows of the others are padded too; GTs overlap, so anchors are claimed
/// twice.
#[allow(dead_code)]
pub fn assigner_batch(
    img: usize,
    bs: usize,
    m: usize,
    nc: usize,
    seed: u64,
) -> (
    yolo9::internals::loss::Anchors,
    candle_core::Tensor,
    candle_core::Tensor,
    yolo9::internals::loss::GtBatch,
) {
    use candle_core::{Device, Tensor};
    let hw: Vec<(usize, usize)> = [8, 16, 32].iter().map(|s| (img / s, img / s)).collect();
    let anchors = yolo9::internals::loss::Anchors::new(&hw, &[8, 16, 32]).unwrap();
    let na = anchors.len();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut r = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % 1_000_000) as f32 / 1_000_000.0
    };
    let f = img as f32;
    let (mut labels, mut bboxes, mut mask) = (Vec::new(), Vec::new(), Vec::new());
    for b in 0..bs {
        for j in 0..m {
            if b == 1 && j == 0 {
                // Covers the first anchors, the ones the fallback picks when every metric is 0.
                labels.push(0);
                bboxes.push([0.0, 0.0, 0.3 * f, 0.3 * f]);
                mask.push(true);
                continue;
            }
            let valid = b + 1 < bs && r() > 0.1;
            let (cx, cy) = (f * (0.1 + 0.8 * r()), f * (0.1 + 0.8 * r()));
            let (w, h) = (f * (0.01 + 0.4 * r() * r()), f * (0.01 + 0.4 * r() * r()));
            labels.push(if valid {
                (r() * nc as f32) as i64 % nc as i64
            } else {
                0
            });
            bboxes.push(if valid {
                [cx - w / 2.0, cy - h / 2.0, cx + w / 2.0, cy + h / 2.0]
            } else {
                [0.0; 4]
            });
            mask.push(valid);
        }
    }
    let gt = yolo9::internals::loss::GtBatch {
        batch: bs,
        n_max_boxes: m,
        labels,
        bboxes,
        mask,
    };
    let mut pbox = vec![0f32; bs * 4 * na];
    for b in 0..bs {
        for (a, p) in anchors.points.iter().enumerate() {
            let far = if b == 2 && a % 2 == 0 { 1000.0 } else { 0.0 };
            let d = [r(), r(), r(), r()].map(|v| 0.2 + 4.0 * v);
            let v = [
                p[0] - d[0] + far,
                p[1] - d[1],
                p[0] + d[2] + far,
                p[1] + d[3],
            ];
            for (c, x) in v.into_iter().enumerate() {
                pbox[(b * 4 + c) * na + a] = x;
            }
        }
    }
    let no = 64 + nc;
    let mut logits = vec![0f32; bs * no * na];
    for b in 0..bs {
        for c in 0..no {
            for a in 0..na {
                logits[(b * no + c) * na + a] = if b == 1 && c >= 64 {
                    -200.0
                } else {
                    -6.0 + 8.0 * r()
                };
            }
        }
    }
    (
        anchors,
        Tensor::from_vec(pbox, (bs, 4, na), &Device::Cpu).unwrap(),
        Tensor::from_vec(logits, (bs, no, na), &Device::Cpu).unwrap(),
        gt,
    )
}

/// A torchvision-style box list as a `(1, 4+nc, n)` f32 output for the batched NMS op in its
/// `xyxy` form: rows x1, y1, x2, y2, then per class the box's score in its class's row and
/// −∞ elsewhere, so the best class of box j is `classes[j]` (all 0 when `classes` is None).
pub fn box_list_output(
    boxes: &[[f32; 4]],
    scores: &[f32],
    classes: Option<&[usize]>,
) -> candle_core::Tensor {
    let n = boxes.len();
    let nc = classes.map_or(1, |c| c.iter().max().map_or(1, |&m| m + 1));
    let mut v = vec![f32::NEG_INFINITY; (4 + nc) * n];
    for j in 0..n {
        for r in 0..4 {
            v[r * n + j] = boxes[j][r];
        }
        let c = classes.map_or(0, |c| c[j]);
        v[(4 + c) * n + j] = scores[j];
    }
    candle_core::Tensor::from_vec(v, (1, 4 + nc, n), &candle_core::Device::Cpu).unwrap()
}

/// A random decoded output `(b, 4+nc, a)` f32 with many score ties: centres in 0..640, sides in
/// 2..130 px (some boxes nearly equal), scores quantized to 1/64 with most below 0.05.
pub fn random_output(b: usize, nc: usize, a: usize, seed: u64) -> candle_core::Tensor {
    let u: Vec<f64> = uniform(&[b * (4 + nc) * a], seed).to_vec1().unwrap();
    let mut v = vec![0f32; u.len()];
    for i in 0..b {
        for r in 0..4 + nc {
            for j in 0..a {
                let k = (i * (4 + nc) + r) * a + j;
                let x = (u[k] + 1.0) / 2.0; // 0..1
                v[k] = match r {
                    // Centres on a coarse grid, so that boxes pile up.
                    0 | 1 => ((x * 40.0).floor() * 16.0) as f32,
                    2 | 3 => (2.0 + (x * 8.0).floor() * 16.0) as f32,
                    _ => ((x.powi(6) * 64.0).floor() / 64.0) as f32,
                };
            }
        }
    }
    candle_core::Tensor::from_vec(v, (b, 4 + nc, a), &candle_core::Device::Cpu).unwrap()
}

/// Runs the `ffmpeg` program quietly with `args` (`-v error -y` first) and asserts it succeeded,
/// naming its arguments and stderr. The video and stream tests need it on PATH (`.ci/run`
/// installs it with apt).
pub fn ffmpeg(args: &[&str]) {
    let out = std::process::Command::new("ffmpeg")
        .args(["-v", "error", "-y"])
        .args(args)
        .output()
        .expect("ffmpeg not on PATH (.ci/run installs it: apt-get install ffmpeg)");
    assert!(
        out.status.success(),
        "ffmpeg {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `tests/model/seg_oracle/<name>`: the segmentation oracle files of `benches/seg_oracle.py`.
/// From the repository root when the build's source folder is not on this machine (the
/// `gpu_parity` binary run on the GPU machine).
pub fn seg_oracle(name: &str) -> PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = if root.is_dir() {
        root
    } else {
        std::path::Path::new(".")
    };
    root.join("tests/model/seg_oracle").join(name)
}

/// The small segmentation graph `name` (`tiny-seg`, `tiny-dseg`) with the oracle's seeded
/// weights (nc 3, classes `a b c`), validated, and every tensor of its oracle file (the weights,
/// `x`, `pred`, `proto`, …).
pub fn seg_oracle_weights(
    name: &str,
) -> (
    yolo9::Weights,
    std::collections::HashMap<String, candle_core::Tensor>,
) {
    let yaml = std::fs::read_to_string(seg_oracle(&format!("{name}.yaml"))).unwrap();
    let arch = std::sync::Arc::new(yolo9::model::Arch::from_yaml(&yaml, name).unwrap());
    let t: std::collections::HashMap<String, candle_core::Tensor> = candle_core::safetensors::load(
        seg_oracle(&format!("{name}.safetensors")),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let tensors = t
        .iter()
        .filter(|(k, _)| k.starts_with("model."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let meta = yolo9::ModelMeta {
        nc: 3,
        names: vec!["a".into(), "b".into(), "c".into()],
        strides: vec![8, 16, 32],
        graph: yolo9::model::weights::graph_of(&arch),
        arch,
        int8: None,
    };
    let w = yolo9::Weights { tensors, meta };
    w.validate(name).unwrap();
    (w, t)
}

/// `tiny-seg.pt` (the official pickled checkpoint of the tiny-seg graph) converted with its
/// `--cfg`, as `yolo9 convert` reads it: the weights and the conversion report.
pub fn tiny_seg_converted() -> (yolo9::Weights, yolo9::convert::Report) {
    let yaml = std::fs::read_to_string(seg_oracle("tiny-seg.yaml")).unwrap();
    let arch = std::sync::Arc::new(yolo9::model::Arch::from_yaml(&yaml, "tiny-seg").unwrap());
    let opts = yolo9::convert::ConvertOptions {
        cfg: Some(arch),
        ..Default::default()
    };
    let (w, _, report) = yolo9::convert::convert(&seg_oracle("tiny-seg.pt"), &opts).unwrap();
    (w, report)
}

/// A state_dict summary as the oracles write it, `[[name, [shape...]], ...]` → `(name, shape)`
/// in order.
pub fn state_dict_entries_json(v: &serde_json::Value) -> Vec<(String, Vec<usize>)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let shape = e[1].as_array().unwrap();
            (
                e[0].as_str().unwrap().to_string(),
                shape.iter().map(|d| d.as_u64().unwrap() as usize).collect(),
            )
        })
        .collect()
}

/// The data config `yaml` and the validation images of its `split`, scanned without the label
/// cache (as `yolo9 val` reads them).
pub fn val_split(
    yaml: &std::path::Path,
    split: yolo9::internals::data::yaml::Split,
) -> (
    yolo9::internals::data::yaml::DataConfig,
    Vec<yolo9::metrics::validate::ValImage>,
) {
    let cfg = yolo9::internals::data::yaml::DataConfig::load(yaml).unwrap();
    let scan = yolo9::internals::data::scan::scan_split(
        &cfg,
        split,
        &yolo9::internals::data::scan::ScanOptions {
            use_cache: false,
            print: false,
            ..Default::default()
        },
    )
    .unwrap();
    let images = yolo9::metrics::validate::val_images(&scan);
    (cfg, images)
}
