//! Every official YOLOv9 size (`yolo9::model::Arch`): built from its model description, the
//! inference graph made from training weights (the official re-parameterization) computes the
//! training graph's main branch, the weights round-trip through a file with their model, and the
//! taped reverse mode is exact on the blocks only the larger sizes use (ADown, CBLinear, CBFuse,
//! Silence). Parity with the official code on the same weights runs on the GPU machine
//! (`tests/model/arch_parity.rs`).

use crate::common;

use candle_core::{DType, Device, Tensor};
use yolo9::model::{Arch, YoloV9, YoloV9Train};

fn input(b: usize, h: usize, w: usize, seed: u64) -> Tensor {
    common::uniform(&[b, 3, h, w], seed)
        .affine(0.5, 0.5)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
}

/// max |a − b| / max |b|.
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    common::max_abs(a, b) / common::abs_max(b).max(1e-30)
}

#[test]
fn each_size_infers_its_main_branch_and_round_trips_through_a_file() {
    let dir = common::tmpdir("sizes");
    for name in ["yolov9-t", "yolov9-m", "yolov9-c", "yolov9-e"] {
        let arch = Arch::builtin(name).unwrap();
        let train = YoloV9Train::build(&arch, None, 3, vec![], &Device::Cpu, 11).unwrap();
        assert!(train.initialized().len() > 100, "{name}");
        let x = input(1, 64, 96, 2);
        let (_, main) = train.forward_eval_decoded(&x).unwrap();
        let w = train.to_weights().unwrap();
        w.validate(name).unwrap();
        // The inference graph straight from the training weights, and from `convert --infer`.
        let y = YoloV9::load(&w, &Device::Cpu).unwrap().forward(&x).unwrap();
        assert_eq!(y.dims(), main.dims(), "{name}");
        let d = rel(&y, &main);
        assert!(d < 1e-4, "{name}: fused inference graph differs by {d:.2e}");
        let infer = w.to_infer().unwrap();
        let gelan = name.replace("yolov9", "gelan");
        assert_eq!(infer.meta.arch.name, gelan);
        let path = dir.join(format!("{gelan}.safetensors"));
        infer.save(&path, false).unwrap();
        let back = yolo9::Weights::load(&path).unwrap();
        assert_eq!(back.meta.arch.layers, Arch::builtin(&gelan).unwrap().layers);
        let y2 = YoloV9::load(&back, &Device::Cpu)
            .unwrap()
            .forward(&x)
            .unwrap();
        assert_eq!(common::max_abs(&y, &y2), 0.0, "{name}: through the file");
        // A file of the training graph carries its model too, and gelan weights train as yolov9.
        let tpath = dir.join(format!("{name}.safetensors"));
        w.save(&tpath, false).unwrap();
        let tw = yolo9::Weights::load(&tpath).unwrap();
        assert_eq!(tw.meta.arch.name, name);
        let again = YoloV9Train::new(Some(&back), 3, vec![], &Device::Cpu, 0).unwrap();
        assert_eq!(again.arch().name, name);
        // The main branch came from the gelan weights; only the auxiliary one is initialized.
        let h = again.arch().head_index();
        let main_head = [format!("model.{h}.cv4."), format!("model.{h}.cv5.")];
        assert!(again
            .initialized()
            .iter()
            .all(|n| !main_head.iter().any(|p| n.starts_with(p.as_str()))));
        assert!(again
            .initialized()
            .iter()
            .any(|n| n.starts_with(&format!("model.{h}.cv2."))));
    }
    // Eight weight files of up to 230 MB: each run's folder (named by the process id) would
    // otherwise stay behind, about 1 GB a run.
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--cfg` ([`yolo9::Weights::with_arch`]): weights read as the model named, a training graph as
/// its gelan counterpart (the main branch), and another model is refused naming the option and
/// the first tensor that differs.
#[test]
fn cfg_reads_weights_as_the_model_named_and_refuses_another() {
    use std::sync::Arc;
    let arch = Arch::builtin("yolov9-t").unwrap();
    let train = YoloV9Train::build(&arch, None, 2, vec![], &Device::Cpu, 5).unwrap();
    let w = train.to_weights().unwrap();
    let same = w
        .clone()
        .with_arch(Arc::new(arch.clone()), "--cfg yolov9-t")
        .unwrap();
    assert_eq!(same.tensors.len(), w.tensors.len());
    let gelan = w
        .clone()
        .with_arch(Arc::new(Arch::builtin("gelan-t").unwrap()), "--cfg gelan-t")
        .unwrap();
    assert_eq!(gelan.meta.graph, yolo9::model::weights::Graph::Infer);
    assert_eq!(gelan.tensors.len(), w.to_infer().unwrap().tensors.len());
    let x = input(1, 64, 64, 3);
    let a = YoloV9::load(&gelan, &Device::Cpu)
        .unwrap()
        .forward(&x)
        .unwrap();
    let b = YoloV9::load(&w, &Device::Cpu).unwrap().forward(&x).unwrap();
    assert_eq!(common::max_abs(&a, &b), 0.0);
    for other in ["yolov9-s", "gelan-c", "yolov9-e"] {
        let e = w
            .clone()
            .with_arch(
                Arc::new(Arch::builtin(other).unwrap()),
                &format!("--cfg {other}"),
            )
            .unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.starts_with(&format!("--cfg {other}: ")), "{msg}");
        assert!(msg.contains(" tensor model."), "{msg}");
    }
    // An inference graph cannot be read as a training graph: the auxiliary branch is missing.
    let e = gelan
        .with_arch(Arc::new(arch), "--cfg yolov9-t")
        .unwrap_err();
    assert!(format!("{e:#}").contains("missing tensor"), "{e:#}");
}

/// The state_dict of every size has the official key count (one BN per Conv: 6 entries, the head,
/// the DFL kernels) and the parameter counts of the official model summaries.
#[test]
fn parameter_counts_equal_the_official_model_summaries() {
    use yolo9::internals::model::keys;
    for (name, entries, params) in [("yolov9-s", 1772, 9_804_512), ("gelan-s", 1339, 7_226_208)] {
        let arch = Arch::builtin(name).unwrap();
        let e = keys::state_dict_entries(&arch, 80).unwrap();
        assert_eq!(e.len(), entries, "{name}");
        let p: usize = e
            .iter()
            .filter(|(n, _)| keys::is_parameter(n))
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        assert_eq!(p, params, "{name}");
    }
}

/// A small description using every block of the larger sizes, trained one taped step against
/// candle's autograd: the loss items equal and every parameter gradient within 1e-4.
#[test]
fn taped_backward_is_exact_on_adown_cblinear_cbfuse() -> anyhow::Result<()> {
    use yolo9::internals::loss::tal_loss::targets_tensor;
    use yolo9::internals::loss::DualTalLoss;
    use yolo9::model::arch::STRIDES;
    let yaml = "
backbone:
  - [-1, 1, Silence, []]
  - [-1, 1, Conv, [16, 3, 2]]
  - [-1, 1, Conv, [32, 3, 2]]
  - [-1, 1, ADown, [32]]
  - [-1, 1, RepNCSPELAN4, [32, 32, 16, 1]]
  - [-1, 1, ADown, [48]]
  - [-1, 1, ELAN1, [48, 48, 24]]
  - [-1, 1, ADown, [64]]
head:
  - [-1, 1, SPPELAN, [64, 32]]
  - [4, 1, CBLinear, [[16]]]
  - [6, 1, CBLinear, [[16, 32]]]
  - [8, 1, CBLinear, [[16, 32, 64]]]
  - [0, 1, Conv, [16, 3, 2]]
  - [-1, 1, Conv, [32, 3, 2]]
  - [-1, 1, ADown, [16]]
  - [[9, 10, 11, -1], 1, CBFuse, [[0, 0, 0]]]
  - [-1, 1, AConv, [32]]
  - [[10, 11, -1], 1, CBFuse, [[1, 1]]]
  - [-1, 1, AConv, [64]]
  - [[11, -1], 1, CBFuse, [[2]]]
  - [-1, 1, nn.Upsample, [None, 2, 'nearest']]
  - [[-1, 6], 1, Concat, [1]]
  - [-1, 1, Conv, [48, 1, 1]]
  - [[15, 17, 19, 4, 22, 8], 1, DualDDetect, [nc]]
";
    let arch = Arch::from_yaml(yaml, "tiny")?;
    assert_eq!(arch.strides(), vec![8, 16, 32]);
    let dev = Device::Cpu;
    let plain = YoloV9Train::build(&arch, None, 2, vec![], &dev, 5)?;
    let taped = YoloV9Train::build(&arch, None, 2, vec![], &dev, 5)?;
    let loss = DualTalLoss::new(2, &STRIDES)?;
    let x = input(2, 64, 64, 3);
    let t = targets_tensor(
        &[
            [0.0, 0.0, 0.3, 0.4, 0.3, 0.25],
            [1.0, 1.0, 0.5, 0.5, 0.4, 0.4],
        ],
        &dev,
    )?;
    let raw = plain.forward(&x, true)?;
    let ga = loss.compute(&raw.aux, &raw.main, &t, (64, 64))?;
    let items_a = ga.items;
    let ga = ga.total.backward()?;
    let (raw, tape) = taped.forward_taped(&x)?;
    let lo = loss.compute(&raw.aux, &raw.main, &t, (64, 64))?;
    let items_b = lo.items;
    let mut gb = lo.total.backward()?;
    let gb = tape.backward(&mut gb)?;
    for (a, b) in items_a.iter().zip(&items_b) {
        assert!(
            (a - b).abs() <= 1e-6 * a.abs().max(1.0),
            "loss items {a} {b}"
        );
    }
    let mut checked = 0;
    for (pa, pb) in plain.vars().iter().zip(taped.vars()) {
        let (Some(a), Some(b)) = (ga.get(pa.var.as_tensor()), gb.get(pb.var.as_tensor())) else {
            continue;
        };
        let d = rel(b, a);
        assert!(d < 1e-4, "{}: gradient differs by {d:.2e}", pa.name);
        checked += 1;
    }
    // Every layer's parameters got a gradient (the CBLinear convs included).
    assert!(checked > 100, "{checked}");
    for n in [
        "model.9.conv.weight",
        "model.11.conv.bias",
        "model.3.cv2.conv.weight",
    ] {
        let v = taped.vars().iter().find(|v| v.name == n).unwrap();
        assert!(gb.get(v.var.as_tensor()).is_some(), "{n}: no gradient");
    }
    Ok(())
}
