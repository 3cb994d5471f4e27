//! The single-head GELAN models train (issue 34, "GELAN trains"): `yolo9 train --cfg gelan-X`
//! builds the `DDetect` training graph and trains it with the official single-branch loss
//! (`utils/loss_tal.py ComputeLoss`, what the official `train.py` uses), and its checkpoints are
//! gelan inference weights that `val` and `detect` read.
//!
//! - The loss: on a fixed batch, the single-head loss of the gelan-s training graph made from the
//!   shipped BCCD weights equals, item by item, the main branch of the dual loss of the yolov9-s
//!   training graph made from the same weights (whose main branch is that same network; the dual
//!   loss is checked against the official `loss_tal_dual.py` in `tests/loss/batch.rs`): the rule
//!   `item = gain · main` of `loss_tal.py` instead of `gain · (0.25 · aux + main)`.
//! - The CLI: gelan-t and gelan-s train one epoch at 64 px on two BCCD images, then `val` and
//!   `detect` read the checkpoint. The larger sizes (m, c, e) take minutes each in the debug
//!   profile and are `#[ignore]`d:
//!   `cargo test --release --test train gelan_larger -- --ignored --nocapture`.

use crate::common;

use candle_core::{DType, Device, Tensor};
use std::path::Path;
use std::sync::Arc;
use yolo9::internals::loss::DualTalLoss;
use yolo9::internals::model::yolov9::YoloV9Train;
use yolo9::model::arch::Arch;
use yolo9::model::weights::Graph;
use yolo9::Weights;

fn shipped() -> Weights {
    Weights::load(Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors"))
        .unwrap()
}

/// Targets `[img, cls, cx, cy, w, h]` (normalized) on a 128x128 batch of 2.
fn targets() -> Tensor {
    let rows: [[f32; 6]; 4] = [
        [0.0, 0.0, 0.30, 0.35, 0.25, 0.30],
        [0.0, 2.0, 0.70, 0.60, 0.10, 0.12],
        [1.0, 1.0, 0.50, 0.50, 0.40, 0.45],
        [1.0, 0.0, 0.20, 0.80, 0.15, 0.20],
    ];
    Tensor::from_vec(rows.concat(), (4, 6), &Device::Cpu).unwrap()
}

#[test]
fn gelan_single_head_loss_is_the_main_branch_of_the_dual_loss() {
    let w = shipped();
    assert_eq!(w.meta.arch.name, "gelan-s");
    let dev = Device::Cpu;
    let names = w.meta.names.clone();
    let gelan = YoloV9Train::build(&w.meta.arch, Some(&w), 3, names.clone(), &dev, 0).unwrap();
    assert!(!gelan.is_dual());
    assert!(gelan.initialized().is_empty(), "{:?}", gelan.initialized());
    assert_eq!(gelan.meta().graph, Graph::Infer);
    let dual_arch = Arch::builtin("yolov9-s").unwrap();
    let dual = YoloV9Train::build(&dual_arch, Some(&w), 3, names, &dev, 0).unwrap();
    assert!(dual.is_dual());

    let x = common::uniform(&[2, 3, 128, 128], 11)
        .affine(0.5, 0.5)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    // Eval mode: BN from the running statistics, so both graphs see the same numbers.
    let g = gelan.forward(&x, false).unwrap();
    let d = dual.forward(&x, false).unwrap();
    assert!(g.aux.is_empty() && d.aux.len() == 3);
    for (a, b) in g.main.iter().zip(&d.main) {
        assert_eq!(common::max_abs(a, b), 0.0, "the same network");
    }
    let loss = DualTalLoss::new(3, &[8, 16, 32]).unwrap();
    let t = targets();
    let single = loss.compute(&g.aux, &g.main, &t, (128, 128)).unwrap();
    let both = loss.compute(&d.aux, &d.main, &t, (128, 128)).unwrap();
    let m = &both.main;
    let want = [m.box_loss * 7.5, m.cls_loss * 0.5, m.dfl_loss * 1.5];
    for (k, (got, want)) in single.items.iter().zip(&want).enumerate() {
        let rel = ((got - want) / want).abs();
        assert!(rel <= 1e-6, "item {k}: {got} vs {want}");
    }
    assert!(want.iter().all(|v| v.is_finite() && *v > 0.0), "{want:?}");
    assert!(
        both.aux.box_loss > 0.0 && (both.items[0] - want[0]).abs() > 1e-3,
        "the dual loss adds 0.25 · aux"
    );
    // total = (box + cls + dfl) · batch size, and no auxiliary contribution at all.
    let total: f32 = single.total.to_scalar().unwrap();
    let sum: f32 = single.items.iter().sum();
    assert!(
        (total - 2.0 * sum).abs() <= 1e-5 * total.abs(),
        "{total} vs {sum}"
    );
    assert_eq!(single.aux.target_scores_sum, 0.0);
    assert!(single.aux.assignment.is_none());
    assert_eq!(
        single.main.target_scores_sum, m.target_scores_sum,
        "the same assignment"
    );

    // With the branch given as both auxiliary and main, the dual rule gives 1.25 x the single one.
    let twice = loss.compute(&g.main, &g.main, &t, (128, 128)).unwrap();
    for k in 0..3 {
        let rel = ((twice.items[k] - 1.25 * single.items[k]) / twice.items[k]).abs();
        assert!(rel <= 1e-6, "item {k}");
    }

    // The gradient reaches every class tensor of the single head (`cv3`, dense BCE) and the box
    // branch (`cv2`, through the foreground anchors of the levels that have some).
    let raw = gelan.forward(&x, true).unwrap();
    let out = loss.compute(&raw.aux, &raw.main, &t, (128, 128)).unwrap();
    let grads = out.total.backward().unwrap();
    let norm = |name: &str| -> f64 {
        let v = gelan.vars().iter().find(|v| v.name == name).unwrap();
        grads.get(v.var.as_tensor()).map_or(0.0, common::abs_max)
    };
    for l in 0..3 {
        assert!(norm(&format!("model.22.cv3.{l}.2.weight")) > 0.0, "cv3.{l}");
    }
    assert!(norm("model.22.cv2.0.2.weight") > 0.0, "cv2.0");
}

/// Trains `cfg` for one epoch through the CLI in `dir` and returns best.safetensors.
fn train_cli(dir: &Path, cfg: &str) -> std::path::PathBuf {
    let yaml = common::tiny_dataset(dir, 2);
    let (code, out, err) = common::yolo9(&[
        "train",
        "--cfg",
        cfg,
        "--data",
        yaml.to_str().unwrap(),
        "--hyp",
        dir.join("hyp.yaml").to_str().unwrap(),
        "--img",
        "64",
        "--epochs",
        "1",
        "--batch",
        "2",
        "--workers",
        "1",
        "--device",
        "cpu",
        "--noplots",
        "--project",
        dir.join("runs").to_str().unwrap(),
        "--name",
        cfg,
    ]);
    assert_eq!(code, 0, "train --cfg {cfg}:\n{out}\n{err}");
    let csv = std::fs::read_to_string(dir.join("runs").join(cfg).join("results.csv")).unwrap();
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    // epoch, train/box_loss, train/cls_loss, train/dfl_loss, ...
    let losses: Vec<f64> = row[1..4]
        .iter()
        .map(|v| v.trim().parse().unwrap())
        .collect();
    assert!(
        losses.iter().all(|v| v.is_finite() && *v > 0.0),
        "{cfg}: train losses {losses:?}"
    );
    dir.join("runs").join(cfg).join("weights/best.safetensors")
}

/// The checkpoint is the gelan inference graph: it loads as such, `val` and `detect` run on it.
fn check_checkpoint(dir: &Path, cfg: &str, best: &Path) {
    let w = Weights::load(best).unwrap();
    assert_eq!(w.meta.arch.name, cfg);
    assert_eq!(w.meta.graph, Graph::Infer);
    assert_eq!(w.meta.nc, 3);
    let want = Arch::builtin(cfg).unwrap();
    assert_eq!(*w.meta.arch, want);
    let m = yolo9::internals::model::yolov9::YoloV9::load(&w, &Device::Cpu).unwrap();
    let x = Tensor::zeros((1, 3, 64, 64), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(m.forward(&x).unwrap().dims(), &[1, 7, 84]);
    let (code, out, err) = common::yolo9(&[
        "val",
        "--data",
        dir.join("data.yaml").to_str().unwrap(),
        "--weights",
        best.to_str().unwrap(),
        "--img",
        "64",
        "--device",
        "cpu",
        "--noplots",
        "--project",
        dir.join("runs").to_str().unwrap(),
        "--name",
        "val",
    ]);
    assert_eq!(code, 0, "val of {cfg}:\n{out}\n{err}");
    assert!(out.contains("all"), "{out}");
    let img = std::fs::read_dir(dir.join("images/val"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let (code, out, err) = common::yolo9(&[
        "detect",
        img.to_str().unwrap(),
        "--weights",
        best.to_str().unwrap(),
        "--img",
        "64",
        "--device",
        "cpu",
        "--conf",
        "0.0001",
        "--project",
        dir.join("runs").to_str().unwrap(),
        "--name",
        "detect",
    ]);
    assert_eq!(code, 0, "detect with {cfg}:\n{out}\n{err}");
}

#[test]
fn gelan_t_and_s_train_one_epoch_and_their_checkpoints_validate_and_detect() {
    for cfg in ["gelan-t", "gelan-s"] {
        let dir = common::tmpdir(cfg);
        let best = train_cli(&dir, cfg);
        check_checkpoint(&dir, cfg, &best);
        // Training goes on from the checkpoint with --cfg naming its graph.
        let w = Weights::load(&best).unwrap();
        let arch = Arc::new(Arch::builtin(cfg).unwrap());
        let again =
            YoloV9Train::build(&arch, Some(&w), 3, w.meta.names.clone(), &Device::Cpu, 0).unwrap();
        assert!(again.initialized().is_empty(), "{:?}", again.initialized());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
#[ignore = "minutes in the debug profile: cargo test --release --test train gelan_larger -- --ignored"]
fn gelan_larger_sizes_train_one_epoch() {
    for cfg in ["gelan-m", "gelan-c", "gelan-e"] {
        let dir = common::tmpdir(cfg);
        let best = train_cli(&dir, cfg);
        check_checkpoint(&dir, cfg, &best);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The single-head loss against the official `utils/loss_tal.py ComputeLoss` on a fixed batch
/// (`gelan_loss_batch.safetensors`, made by `benches/torch_gelan_loss.py` from the shipped
/// weights in eval mode): the loss items within 1e-4 relative. `#[ignore]`d until that file is in
/// `../shared/reference/`:
/// `cargo test --test train gelan_loss_matches -- --ignored --nocapture`.
#[test]
#[ignore = "needs ../shared/reference/gelan_loss_batch.safetensors (benches/torch_gelan_loss.py)"]
fn gelan_loss_matches_the_official_loss_tal() {
    let r = candle_core::safetensors::load(
        common::reference("gelan_loss_batch.safetensors"),
        &Device::Cpu,
    )
    .expect("gelan_loss_batch.safetensors (run benches/torch_gelan_loss.py)");
    let w = shipped();
    let m = YoloV9Train::build(
        &w.meta.arch,
        Some(&w),
        3,
        w.meta.names.clone(),
        &Device::Cpu,
        0,
    )
    .unwrap();
    let x = &r["x"];
    let (_, _, h, wd) = x.dims4().unwrap();
    let raw = m.forward(x, false).unwrap();
    for (i, p) in raw.main.iter().enumerate() {
        let d = common::max_abs(p, &r[&format!("head_p{}", i + 3)]);
        eprintln!("head P{}: max |diff| {d:e}", i + 3);
    }
    let loss = DualTalLoss::new(3, &[8, 16, 32]).unwrap();
    let out = loss
        .compute(&raw.aux, &raw.main, &r["targets"], (h, wd))
        .unwrap();
    let want: Vec<f32> = r["loss_items"].to_vec1().unwrap();
    eprintln!("items {:?} vs official {want:?}", out.items);
    for (k, (got, want)) in out.items.iter().zip(&want).enumerate() {
        let rel = ((got - want) / want).abs();
        assert!(rel <= 1e-4, "item {k}: {got} vs {want} (rel {rel:e})");
    }
    let total: f32 = out.total.to_scalar().unwrap();
    let total_ref: f32 = r["loss_total"].to_scalar().unwrap();
    assert!(
        ((total - total_ref) / total_ref).abs() <= 1e-4,
        "{total} vs {total_ref}"
    );
}
