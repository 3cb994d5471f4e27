//! Training-graph tests: train-mode BN against the official oracle, gradients of the custom
//! pooling/upsampling against finite differences, variables, groups and state_dict export.

use crate::common;

use candle_core::{DType, Device, Tensor, Var};
use std::collections::HashMap;
use yolo9::internals::model::conv::{Conv, ConvSpec};
use yolo9::internals::model::params::{BuildMode, Builder};
use yolo9::internals::model::pool;
use yolo9::model::{ParamGroup, YoloV9Train};

/// Checks d(sum(f(x) * r))/dx from candle's backward against central differences.
fn check_grad(name: &str, x: &Tensor, f: impl Fn(&Tensor) -> Tensor) {
    let xv = Var::from_tensor(x).unwrap();
    let y0 = f(xv.as_tensor());
    let r = common::uniform(y0.dims(), 99);
    let loss = (y0 * &r).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    let g: Vec<f64> = grads
        .get(xv.as_tensor())
        .expect("no gradient reached the input")
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let base: Vec<f64> = x.flatten_all().unwrap().to_vec1().unwrap();
    let eps = 1e-6;
    let mut worst = 0f64;
    for i in 0..base.len() {
        let mut p = base.clone();
        p[i] += eps;
        let mut m = base.clone();
        m[i] -= eps;
        let ev = |v: Vec<f64>| {
            let t = Tensor::from_vec(v, x.dims(), &Device::Cpu).unwrap();
            (f(&t) * &r)
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
        };
        let fd = (ev(p) - ev(m)) / (2.0 * eps);
        worst = worst.max((fd - g[i]).abs());
    }
    println!("{name}: max |autograd - finite difference| = {worst:.2e}");
    assert!(worst < 1e-6, "{name}: gradient error {worst}");
}

#[test]
fn pooling_and_upsample_gradients_match_finite_differences() {
    let x = common::uniform(&[1, 2, 5, 6], 1);
    check_grad("avg_pool 2x2 s1", &x, |t| {
        pool::avg_pool_2x2_s1(t, true).unwrap()
    });
    check_grad("max_pool 5 s1 p2 (x3 chained, as SPPELAN)", &x, |t| {
        let a = pool::max_pool_same(t, 5).unwrap();
        let b = pool::max_pool_same(&a, 5).unwrap();
        let c = pool::max_pool_same(&b, 5).unwrap();
        Tensor::cat(&[t, &a, &b, &c], 1).unwrap()
    });
    check_grad("upsample nearest 2x", &x, |t| {
        pool::upsample_nearest_2x(t).unwrap()
    });
}

#[test]
fn train_mode_bn_gradient_matches_finite_differences() {
    // One Conv (conv + train-mode BN + SiLU) built in f64 from fresh init.
    let dev = Device::Cpu;
    let mut b = Builder::new(None, None, &dev, BuildMode::Train, 7);
    let mut conv = Conv::load(&mut b, "model.0", ConvSpec::new(2, 3, 3, 1)).unwrap();
    conv.weight = common::uniform(&[3, 2, 3, 3], 3);
    let bn = conv.bn.as_mut().unwrap();
    bn.weight = (common::uniform(&[3], 4) + 1.5).unwrap();
    bn.bias = common::uniform(&[3], 5);
    bn.running_mean = Var::from_tensor(&Tensor::zeros(3, DType::F64, &dev).unwrap()).unwrap();
    bn.running_var = Var::from_tensor(&Tensor::ones(3, DType::F64, &dev).unwrap()).unwrap();
    let x = common::uniform(&[2, 2, 4, 5], 6);
    check_grad("Conv+BN(train)+SiLU", &x, |t| {
        conv.forward(t, true).unwrap()
    });
}

#[test]
fn bn0_running_stats_after_one_train_forward_match_oracle() {
    let sd: HashMap<String, Tensor> = candle_core::safetensors::load(
        common::reference("yolov9-s.state_dict.subset.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let lb =
        candle_core::safetensors::load(common::reference("loss_batch.safetensors"), &Device::Cpu)
            .unwrap();
    let mut b = Builder::new(Some(&sd), None, &Device::Cpu, BuildMode::Train, 0);
    let conv = Conv::load(&mut b, "model.0", ConvSpec::new(3, 32, 3, 2)).unwrap();
    let bn = conv.bn.as_ref().unwrap();
    let before_m = &lb["bn0_running_mean_before"];
    let before_v = &lb["bn0_running_var_before"];
    assert_eq!(common::max_abs(bn.running_mean.as_tensor(), before_m), 0.0);
    assert_eq!(common::max_abs(bn.running_var.as_tensor(), before_v), 0.0);

    let x = (lb["images_u8"].to_dtype(DType::F32).unwrap() / 255.0).unwrap();
    let y = conv.forward(&x, true).unwrap();
    assert_eq!(y.dims(), &[2, 32, 320, 320]);
    let em = common::max_abs(bn.running_mean.as_tensor(), &lb["bn0_running_mean_after"]);
    let ev = common::max_abs(bn.running_var.as_tensor(), &lb["bn0_running_var_after"]);
    println!("bn0 after one train forward: running_mean err {em:.2e}, running_var err {ev:.2e}");
    assert!(em <= 1e-5 && ev <= 1e-5, "mean err {em}, var err {ev}");
}

#[test]
fn fresh_training_graph_exports_official_state_dict() {
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::reference("yolov9-s.state_dict.index.json")).unwrap(),
    )
    .unwrap();
    let entries = index["entries"].as_array().unwrap();
    let names: Vec<String> = (0..80).map(|i| format!("c{i}")).collect();
    let m = YoloV9Train::new(None, 80, names, &Device::Cpu, 0).unwrap();
    let sd = m.state_dict().unwrap();
    assert_eq!(sd.len(), entries.len(), "state_dict size");
    for e in entries {
        let name = e["name"].as_str().unwrap();
        let shape: Vec<usize> = e["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let t = sd
            .get(name)
            .unwrap_or_else(|| panic!("missing {name} in exported state_dict"));
        assert_eq!(t.dims(), &shape[..], "{name}");
        let want = if e["dtype"] == "int64" {
            DType::I64
        } else {
            DType::F32
        };
        assert_eq!(t.dtype(), want, "{name}");
    }
    // Parameter groups follow the names; bias_init of fresh heads.
    let mut counts = [0usize; 3];
    for v in m.vars() {
        let g = match v.group {
            ParamGroup::ConvWeight => 0,
            ParamGroup::BnWeight => 1,
            ParamGroup::Bias => 2,
        };
        counts[g] += 1;
        if v.name.ends_with(".bias") {
            assert_eq!(v.group, ParamGroup::Bias, "{}", v.name);
        } else if v.name.contains(".bn.") {
            assert_eq!(v.group, ParamGroup::BnWeight, "{}", v.name);
        } else {
            assert_eq!(v.group, ParamGroup::ConvWeight, "{}", v.name);
        }
    }
    println!("param groups (decay weights, bn weights, biases) = {counts:?}");
    assert_eq!(counts[1], 291, "291 BatchNorm layers (reference README)");
    assert_eq!(counts[1] + 12, counts[2]); // + 12 head conv biases
    let cls_bias: Vec<f32> = sd["model.29.cv5.0.2.bias"].to_vec1().unwrap();
    let want = (5.0f64 / 80.0 / (640.0f64 / 8.0).powi(2)).ln() as f32;
    assert!((cls_bias[0] - want).abs() < 1e-6);
    let box_bias: Vec<f32> = sd["model.29.cv2.2.2.bias"].to_vec1().unwrap();
    assert!(box_bias.iter().all(|v| *v == 1.0));
}

#[test]
fn training_graph_forward_shapes_and_gradients_reach_every_variable() {
    let m = YoloV9Train::new(None, 3, vec![], &Device::Cpu, 1).unwrap();
    let x = common::uniform(&[2, 3, 64, 96], 11)
        .to_dtype(DType::F32)
        .unwrap();
    let x = x.affine(0.5, 0.5).unwrap();
    let out = m.forward(&x, true).unwrap();
    let want = [[2, 67, 8, 12], [2, 67, 4, 6], [2, 67, 2, 3]];
    for (i, w) in want.iter().enumerate() {
        assert_eq!(out.aux[i].dims(), w);
        assert_eq!(out.main[i].dims(), w);
    }
    let mut loss = Tensor::new(0f32, &Device::Cpu).unwrap();
    for t in out.aux.iter().chain(&out.main) {
        loss = (loss + t.sqr().unwrap().mean_all().unwrap()).unwrap();
    }
    let grads = loss.backward().unwrap();
    let missing: Vec<&str> = m
        .vars()
        .iter()
        .filter(|v| grads.get(v.var.as_tensor()).is_none())
        .map(|v| v.name.as_str())
        .collect();
    assert!(missing.is_empty(), "no gradient for {missing:?}");
    assert_eq!(m.batches_tracked(), 1);
    let (ya, ym) = m.forward_eval_decoded(&x).unwrap();
    assert_eq!(ya.dims(), &[2, 7, 96 + 24 + 6]);
    assert_eq!(ym.dims(), &[2, 7, 126]);
    assert_eq!(
        m.batches_tracked(),
        1,
        "eval forward must not touch BN stats"
    );
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let m = YoloV9Train::new(None, 2, vec![], &Device::Cpu, 0).unwrap();
    for shape in [
        &[1usize, 3, 60, 64][..],
        &[1, 1, 64, 64],
        &[3, 64, 64],
        &[0, 3, 64, 64],
    ] {
        let x = Tensor::zeros(shape, DType::F32, &Device::Cpu).unwrap();
        let e = m.forward(&x, false).err().expect("must fail");
        println!("{shape:?}: {e:#}");
    }
    let x = Tensor::zeros((1, 3, 64, 64), DType::F64, &Device::Cpu).unwrap();
    assert!(m.forward(&x, false).is_err());
}

/// Mean of (N, C, H, W) over N, H and W → (1, C, 1, 1).
fn channel_mean(t: &Tensor) -> Tensor {
    t.mean_keepdim(3)
        .unwrap()
        .mean_keepdim(2)
        .unwrap()
        .mean_keepdim(0)
        .unwrap()
}

/// The fused train-mode BN + SiLU op against the composite of candle ops it replaces: outputs,
/// input gradients and γ/β gradients, in f64 and f32, with and without SiLU.
#[test]
fn fused_bn_act_matches_composite_bn_in_value_and_gradient() {
    let dev = Device::Cpu;
    for dtype in [DType::F64, DType::F32] {
        for silu in [true, false] {
            let gamma = Var::from_tensor(
                &(common::uniform(&[3], 4) + 1.5)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap(),
            )
            .unwrap();
            let beta =
                Var::from_tensor(&common::uniform(&[3], 5).to_dtype(dtype).unwrap()).unwrap();
            // Channel offsets and scales unlike 0/1, as conv outputs have.
            let shift = Tensor::new(&[0.5f64, -2.0, 7.0], &dev)
                .unwrap()
                .reshape((1, 3, 1, 1))
                .unwrap();
            let x0 = (common::uniform(&[2, 3, 5, 7], 6) * 3.0)
                .unwrap()
                .broadcast_add(&shift)
                .unwrap();
            let x = Var::from_tensor(&x0.to_dtype(dtype).unwrap()).unwrap();
            let r = common::uniform(&[2, 3, 5, 7], 9).to_dtype(dtype).unwrap();
            let bn_t = yolo9::internals::model::conv::BatchNorm2d {
                weight: gamma.as_tensor().clone(),
                bias: beta.as_tensor().clone(),
                running_mean: Var::from_tensor(&Tensor::zeros(3, dtype, &dev).unwrap()).unwrap(),
                running_var: Var::from_tensor(&Tensor::ones(3, dtype, &dev).unwrap()).unwrap(),
            };
            let fused = bn_t.forward_act(x.as_tensor(), true, silu).unwrap();
            let (comp, _, _) = bn_t.train_composite(x.as_tensor(), 70.0).unwrap();
            let comp = if silu { comp.silu().unwrap() } else { comp };
            let tol = if dtype == DType::F64 { 1e-12 } else { 2e-5 };
            let dy = common::max_abs(&fused, &comp);
            let grads = |y: &Tensor| {
                let g = (y * &r).unwrap().sum_all().unwrap().backward().unwrap();
                [x.as_tensor(), gamma.as_tensor(), beta.as_tensor()]
                    .map(|t| g.get(t).expect("gradient reaches x, γ and β").clone())
            };
            let (gf, gc) = (grads(&fused), grads(&comp));
            let errs: Vec<f64> = gf
                .iter()
                .zip(&gc)
                .map(|(a, b)| common::max_abs(a, b))
                .collect();
            println!(
                "{dtype:?} silu={silu}: y {dy:.1e}, dx {:.1e}, dγ {:.1e}, dβ {:.1e}",
                errs[0], errs[1], errs[2]
            );
            assert!(dy <= tol, "{dtype:?} silu={silu}: forward differs by {dy}");
            for (name, e) in ["dx", "dγ", "dβ"].iter().zip(&errs) {
                assert!(
                    *e <= tol * 10.0,
                    "{dtype:?} silu={silu}: {name} differs by {e}"
                );
            }
            // The running statistics of the fused path (momentum 0.03, unbiased variance).
            let mean = channel_mean(&x0);
            let var_b = channel_mean(&x0.broadcast_sub(&mean).unwrap().sqr().unwrap());
            let want_rm = (mean.flatten_all().unwrap() * 0.03).unwrap();
            let want_rv =
                ((var_b.flatten_all().unwrap() * (70.0 / 69.0 * 0.03)).unwrap() + 0.97).unwrap();
            let em = common::max_abs(bn_t.running_mean.as_tensor(), &want_rm);
            let ev = common::max_abs(bn_t.running_var.as_tensor(), &want_rv);
            assert!(
                em <= tol * 10.0 && ev <= tol * 10.0,
                "running stats err {em} {ev}"
            );
        }
    }
}

/// An eval-mode forward of the training graph (validation during training) must not record an
/// autograd graph: otherwise every activation of the batch stays alive until the outputs are
/// dropped and validation needs training-sized memory.
#[test]
fn eval_forward_of_training_graph_records_no_autograd_graph() {
    let m = YoloV9Train::new(None, 3, vec![], &Device::Cpu, 0).unwrap();
    let x = Tensor::rand(0f32, 1f32, (1, 3, 64, 64), &Device::Cpu).unwrap();
    let eval = m.forward(&x, false).unwrap();
    assert!(eval.main.iter().chain(&eval.aux).all(|t| !t.track_op()));
    let train = m.forward(&x, true).unwrap();
    assert!(train.main.iter().chain(&train.aux).all(|t| t.track_op()));
}

/// The tape (`yolo9::internals::model::tape`) against candle's autograd on the whole training graph: two
/// models from the same seed, one batch (2 images of 64×64, three boxes), the dual TAL loss;
/// every parameter gradient of the taped backward equals candle's (relative to the largest
/// entry of each tensor), the loss items and the BN running statistics agree.
#[test]
fn taped_backward_equals_candle_autograd_on_the_training_graph() -> anyhow::Result<()> {
    use yolo9::internals::loss::tal_loss::targets_tensor;
    use yolo9::internals::loss::DualTalLoss;
    use yolo9::model::arch::STRIDES;
    let dev = Device::Cpu;
    let plain = YoloV9Train::new(None, 3, Vec::new(), &dev, 5)?;
    let taped = YoloV9Train::new(None, 3, Vec::new(), &dev, 5)?;
    let loss = DualTalLoss::new(3, &STRIDES)?;
    let x = common::uniform(&[2, 3, 64, 64], 3)
        .affine(0.5, 0.5)?
        .to_dtype(DType::F32)?;
    let t = targets_tensor(
        &[
            [0.0, 0.0, 0.3, 0.4, 0.3, 0.25],
            [0.0, 2.0, 0.7, 0.6, 0.2, 0.3],
            [1.0, 1.0, 0.5, 0.5, 0.4, 0.4],
        ],
        &dev,
    )?;
    let raw = plain.forward(&x, true)?;
    let lo_a = loss.compute(&raw.aux, &raw.main, &t, (64, 64))?;
    let ga = lo_a.total.backward()?;
    let (raw, tape) = taped.forward_taped(&x)?;
    let nodes = tape.len();
    let lo_b = loss.compute(&raw.aux, &raw.main, &t, (64, 64))?;
    let mut gb = lo_b.total.backward()?;
    let gb = tape.backward(&mut gb)?;
    // The same forward values: the taped forward runs the training convolution, not the CPU
    // inference one, on its detached tensors.
    for (a, b) in lo_a.items.iter().zip(&lo_b.items) {
        assert_eq!(a, b, "loss items");
    }
    let mut worst = (0f32, String::new());
    for (pa, pb) in plain.vars().iter().zip(taped.vars()) {
        assert_eq!(pa.name, pb.name);
        let a = ga.get(pa.var.as_tensor());
        let b = gb.get(pb.var.as_tensor());
        let (a, b) = match (a, b) {
            (Some(a), Some(b)) => (a, b),
            (None, None) => continue,
            _ => panic!(
                "{}: gradient present on one side only (candle {}, tape {})",
                pa.name,
                a.is_some(),
                b.is_some()
            ),
        };
        assert_eq!(a.dims(), b.dims(), "{}", pa.name);
        let scale = a.abs()?.max_all()?.to_scalar::<f32>()?.max(1e-12);
        let d = (a - b)?.abs()?.max_all()?.to_scalar::<f32>()? / scale;
        if d > worst.0 {
            worst = (d, pa.name.clone());
        }
    }
    println!(
        "tape: {nodes} nodes; worst parameter gradient {:.2e} ({})",
        worst.0, worst.1
    );
    assert!(nodes > 300, "the taped forward recorded only {nodes} nodes");
    assert!(worst.0 < 1e-4, "worst gradient difference {worst:?}");
    let (ma, va) = plain.bn_running_stats("model.2.cv1.bn").unwrap();
    let (mb, vb) = taped.bn_running_stats("model.2.cv1.bn").unwrap();
    let dm = (ma - mb)?.abs()?.max_all()?.to_scalar::<f32>()?;
    let dv = (va - vb)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(dm == 0.0 && dv == 0.0, "BN running stats differ: {dm} {dv}");
    Ok(())
}

/// The one-op SPPELAN max pool of the tape (`pool::max_pool_same_op` and its backward) against the
/// composite of candle ops and candle's autograd on random data (no ties), and on a hand-worked
/// tie: with equal values every window's gradient goes to its first maximum, as PyTorch's.
#[test]
fn max_pool_op_equals_the_composite_and_routes_ties_to_the_first_maximum() -> anyhow::Result<()> {
    let x = common::uniform(&[2, 3, 9, 7], 21).to_dtype(DType::F32)?;
    let dy = common::uniform(&[2, 3, 9, 7], 22).to_dtype(DType::F32)?;
    let y_op = pool::max_pool_same_op(&x, 5)?;
    let y_ref = pool::max_pool_same(&x, 5)?;
    assert_eq!(
        (&y_op - &y_ref)?.abs()?.max_all()?.to_scalar::<f32>()?,
        0.0,
        "forward"
    );
    let dx_op = pool::max_pool_same_backward(&x, &dy, 5)?;
    let g = yolo9::internals::model::tape::vjp(
        |v| pool::max_pool_same(&v[0], 5).map_err(|e| candle_core::Error::Msg(e.to_string())),
        &[&x],
        &dy,
    )?;
    let d = (&dx_op - &g[0])?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(d < 1e-6, "backward differs from candle's by {d}");
    // Ties: one row [1, 1, 1], k = 3 (windows [0,1], [0,1,2], [1,2]) → first maxima 0, 0, 1.
    let t = Tensor::new(&[1f32, 1., 1.], &Device::Cpu)?.reshape((1, 1, 1, 3))?;
    let ones = t.ones_like()?;
    let dt = pool::max_pool_same_backward(&t, &ones, 3)?;
    assert_eq!(dt.flatten_all()?.to_vec1::<f32>()?, vec![2.0, 1.0, 0.0]);
    Ok(())
}

/// On the CPU the training step's CUDA-graph replay (`yolo9::internals::train::graphed`) does not apply and
/// its micro-step is the ordinary one: same loss items and gradients as `ordinary` on an identical
/// model, BN statistics counted once per micro-step.
#[test]
fn graphed_micro_step_on_the_cpu_is_the_ordinary_step() {
    use yolo9::internals::train::graphed::{ordinary, StepGraphs};
    let a = YoloV9Train::new(None, 3, vec![], &Device::Cpu, 5).unwrap();
    let b = YoloV9Train::new(None, 3, vec![], &Device::Cpu, 5).unwrap();
    let x = common::uniform(&[1, 3, 64, 64], 13)
        .to_dtype(DType::F32)
        .unwrap()
        .affine(0.5, 0.5)
        .unwrap();
    let t = Tensor::new(&[[0f32, 1., 0.5, 0.5, 0.4, 0.3]], &Device::Cpu).unwrap();
    let loss = yolo9::internals::loss::DualTalLoss::new(3, &[8, 16, 32]).unwrap();
    let pa: Vec<Tensor> = a.vars().iter().map(|v| v.var.as_tensor().clone()).collect();
    let pb: Vec<Tensor> = b.vars().iter().map(|v| v.var.as_tensor().clone()).collect();
    let mut sg = StepGraphs::new();
    assert!(!sg.applies(&x), "no CUDA graphs on the CPU");
    let want = ordinary(&a, &loss, &pa, &x, &t, (64, 64)).unwrap();
    let got = sg.micro_step(&b, &loss, &pb, &x, &t, (64, 64)).unwrap();
    assert_eq!(want.items, got.items);
    assert!(want.items.iter().all(|v| v.is_finite() && *v > 0.0));
    let (gw, gg) = (want.grads.unwrap(), got.grads.unwrap());
    for (p, q) in pa.iter().zip(&pb) {
        let (u, v) = (gw.get(p).unwrap(), gg.get(q).unwrap());
        assert_eq!(common::max_abs(u, v), 0.0);
    }
    assert_eq!(sg.counts(), (0, 0));
    assert_eq!((a.batches_tracked(), b.batches_tracked()), (1, 1));
}
