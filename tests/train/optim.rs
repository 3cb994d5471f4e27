//! Optimizer, EMA and schedule against hand-computed values (PyTorch SGD semantics).
use crate::common;

use candle_core::{Device, Tensor, Var};
use yolo9::internals::train::ema::Ema;
use yolo9::internals::train::optimizer::{group_of, ParamGroup, Sgd};
use yolo9::internals::train::schedule::{round_half_even, Schedule};

fn close(a: &[f32], b: &[f64]) {
    for (x, y) in a.iter().zip(b) {
        assert!((*x as f64 - y).abs() < 1e-5, "{a:?} vs {b:?}");
    }
}

#[test]
fn groups_follow_official_names() {
    assert_eq!(group_of("model.0.conv.weight"), ParamGroup::ConvWeight);
    assert_eq!(group_of("model.0.bn.weight"), ParamGroup::BnWeight);
    assert_eq!(group_of("model.0.bn.bias"), ParamGroup::Bias);
    assert_eq!(group_of("model.29.cv2.0.2.bias"), ParamGroup::Bias);
    assert_eq!(group_of("model.29.cv2.0.2.weight"), ParamGroup::ConvWeight);
}

/// Two Nesterov steps with weight decay, computed by hand (numpy, PyTorch's formula):
/// w0 = [1, -2], grad = [0.5, 0.5], wd 0.1, lr 0.5, momentum 0.9.
#[test]
fn sgd_nesterov_two_steps() -> anyhow::Result<()> {
    let dev = Device::Cpu;
    let w = Var::from_vec(vec![1f32, -2.0], 2, &dev)?;
    let b = Var::from_vec(vec![1f32, -2.0], 2, &dev)?;
    let c = Tensor::new(&[0.5f32, 0.5], &dev)?;
    let mut opt = Sgd::new(
        vec![
            ("m.conv.weight".into(), w.clone()),
            ("m.conv.bias".into(), b.clone()),
        ],
        0.5,
        0.9,
        0.1,
    );
    assert_eq!(opt.group_sizes(), [1, 1, 0]);
    for _ in 0..2 {
        let loss = ((w.as_tensor() * &c)?.sum_all()? + (b.as_tensor() * &c)?.sum_all()?)?;
        let grads = loss.backward()?;
        opt.step(&grads)?;
    }
    close(&w.as_tensor().to_vec1::<f32>()?, &[-0.32885, -2.664425]);
    // The bias group has no decay: buf = g, then 0.9*g + g; steps 0.5*1.9*0.5, 0.5*2.71*0.5.
    close(
        &b.as_tensor().to_vec1::<f32>()?,
        &[1.0 - 0.475 - 0.6775, -2.0 - 0.475 - 0.6775],
    );
    // Momentum buffers are plain values: no recorded op graph that would chain each step to
    // the previous one (a weight-decay term built from the variable used to leak ~20 parameter
    // copies per step).
    for (name, t) in opt.state() {
        assert!(!t.track_op(), "{name}: momentum buffer records an op graph");
    }
    // State round trip restores the momentum buffers exactly.
    let state = opt.state();
    assert_eq!(state.len(), 2);
    let mut opt2 = Sgd::new(
        vec![
            ("m.conv.weight".into(), w.clone()),
            ("m.conv.bias".into(), b.clone()),
        ],
        0.5,
        0.9,
        0.1,
    );
    opt2.load_state(&state)?;
    assert_eq!(
        opt2.state()[0].1.to_vec1::<f32>()?,
        state[0].1.to_vec1::<f32>()?
    );
    assert!(opt2
        .load_state(&[("nope".into(), state[0].1.clone())])
        .is_err());
    Ok(())
}

#[test]
fn momentum_buffers_never_hold_the_op_graph() -> anyhow::Result<()> {
    // d/dw of sum(w * v) is computed from the variable v, so candle returns it attached to the
    // graph; the optimizer must not keep that graph (it leaked ~1 GB per step on YOLOv9-s).
    let dev = Device::Cpu;
    let w = Var::from_vec(vec![1f32, -2.0], 2, &dev)?;
    let v = Var::from_vec(vec![0.5f32, 0.25], 2, &dev)?;
    let mut opt = Sgd::new(vec![("m.conv.weight".into(), w.clone())], 0.1, 0.9, 0.1);
    let grads = (w.as_tensor() * v.as_tensor())?.sum_all()?.backward()?;
    assert!(
        grads.get(w.as_tensor()).unwrap().track_op(),
        "premise: attached gradient"
    );
    opt.step(&grads)?;
    opt.step(&grads)?;
    for (name, t) in opt.state() {
        assert!(!t.track_op(), "{name}: momentum buffer records an op graph");
    }
    Ok(())
}

#[test]
fn clip_grad_norm_scales_to_max() -> anyhow::Result<()> {
    let dev = Device::Cpu;
    let w = Var::from_vec(vec![0f32, 0.0], 2, &dev)?;
    let c = Tensor::new(&[30f32, 40.0], &dev)?; // |grad| = 50
    let opt = Sgd::new(vec![("x.weight".into(), w.clone())], 0.1, 0.9, 0.0);
    let mut grads = (w.as_tensor() * &c)?.sum_all()?.backward()?;
    let n = opt.clip_grad_norm(&mut grads, 10.0)?;
    assert!((n - 50.0).abs() < 1e-9);
    let g = grads.get(w.as_tensor()).unwrap().to_vec1::<f32>()?;
    close(&g, &[6.0, 8.0]);
    Ok(())
}

#[test]
fn ema_ramped_decay() -> anyhow::Result<()> {
    let dev = Device::Cpu;
    let s0 = vec![("a".to_string(), Tensor::new(&[0f32, 10.0], &dev)?)];
    let mut ema = Ema::new(&s0)?;
    let d1 = 0.9999 * (1.0 - (-1.0f64 / 2000.0).exp());
    assert!((ema.decay_at(1) - 4.998_250_333e-4).abs() < 1e-12);
    let s1 = vec![("a".to_string(), Tensor::new(&[1f32, 0.0], &dev)?)];
    ema.update(&s1)?;
    assert_eq!(ema.updates, 1);
    close(&ema.state[0].1.to_vec1::<f32>()?, &[1.0 - d1, 10.0 * d1]);
    assert!(ema.update(&[("b".to_string(), s1[0].1.clone())]).is_err());
    Ok(())
}

#[test]
fn schedule_matches_train_dual() {
    let s = Schedule::scratch_high(50);
    assert_eq!(s.lf(0), 1.0);
    assert!((s.lf(50) - 0.01).abs() < 1e-12);
    assert!((s.lf(25) - 0.505).abs() < 1e-12);
    assert_eq!(s.accumulate(16), 4);
    assert_eq!(s.accumulate(64), 1);
    assert_eq!(s.accumulate(128), 1);
    assert_eq!(s.accumulate(24), 3); // round(2.667)
    assert!((s.scaled_weight_decay(5e-4, 16) - 5e-4).abs() < 1e-15);
    assert!((s.scaled_weight_decay(5e-4, 24) - 5e-4 * 72.0 / 64.0).abs() < 1e-15);
    assert_eq!(s.warmup_iters(13), 100);
    assert_eq!(s.warmup_iters(50), 150);
    assert_eq!(round_half_even(2.5), 2.0);
    assert_eq!(round_half_even(3.5), 4.0);
    // Start of warmup: bias LR 0.1, others 0, momentum 0.8, accumulate 1.
    let a = s.at(0, 0, 13, 16);
    assert_eq!(a.lr, [0.1, 0.0, 0.0]);
    assert_eq!(a.momentum, 0.8);
    assert_eq!(a.accumulate, 1);
    // Half-way through 100 warmup iterations in epoch 3 (lf = 1 - 3/50 * 0.99).
    let h = s.at(50, 3, 13, 16);
    let t = 0.01 * (1.0 - 3.0 / 50.0 * 0.99);
    assert!((h.lr[0] - (0.1 + (t - 0.1) * 0.5)).abs() < 1e-12);
    assert!((h.lr[1] - t * 0.5).abs() < 1e-12);
    assert!((h.momentum - 0.8685).abs() < 1e-12);
    assert_eq!(h.accumulate, 2); // round(2.5) = 2 (half to even)
    let after = s.at(200, 20, 13, 16);
    assert_eq!(after.accumulate, 4);
    assert!((after.lr[2] - 0.01 * s.lf(20)).abs() < 1e-15);
    let mut c = s.clone();
    c.cos_lr = true;
    assert!((c.lf(0) - 1.0).abs() < 1e-12 && (c.lf(50) - 0.01).abs() < 1e-12);
}

/// The name rule of the optimizer gives the model's structural groups for every parameter of
/// the real training graph (303 decayed conv weights, 291 BN weights, 303 biases).
#[test]
fn name_groups_equal_model_groups() -> anyhow::Result<()> {
    let names = vec!["a".to_string(), "b".to_string(), "c".to_string()];
    let m = yolo9::model::YoloV9Train::new(None, 3, names, &Device::Cpu, 0)?;
    for v in m.vars() {
        assert_eq!(group_of(&v.name), v.group, "{}", v.name);
    }
    let params = m
        .vars()
        .iter()
        .map(|v| (v.name.clone(), v.var.clone()))
        .collect();
    let opt = Sgd::new(params, 0.01, 0.937, 5e-4);
    assert_eq!(opt.group_sizes(), [303, 303, 291]);
    Ok(())
}

/// A hyp yaml sets schedule and augmentation keys at one level; missing keys keep scratch-high
/// values and unknown official keys (obj, anchor_t, ...) are ignored.
#[test]
fn hyp_yaml_reads_augmentation_keys() -> anyhow::Result<()> {
    let p = std::env::temp_dir().join(format!("yolo9-hyp-{}.yaml", std::process::id()));
    std::fs::write(
        &p,
        "lr0: 0.02\nmosaic: 0.0\nhsv_s: 0.5\nanchor_t: 5.0\nobj: 0.7\n",
    )?;
    let h = yolo9::train::trainer::Hyp::load(&p)?;
    std::fs::remove_file(&p).ok();
    assert_eq!(h.lr0, 0.02);
    assert_eq!(h.augment().mosaic, 0.0);
    assert_eq!(h.augment().hsv_s, 0.5);
    assert_eq!(h.augment().mixup, 0.15);
    assert_eq!(h.momentum, 0.937);
    Ok(())
}

/// Learning, deterministically: one SGD step along the gradient of the dual TAL loss lowers that
/// loss on the same batch (first-order descent: the step is sized for a predicted decrease of 0.1%
/// of the loss, far above f32 noise and far below the second-order term; fails if a gradient or
/// the update's sign is wrong). YOLOv9-s training graph, CPU, 2 seeded 64x64 images with boxes.
#[test]
fn sgd_step_on_the_training_graph_lowers_the_loss() -> anyhow::Result<()> {
    use yolo9::internals::loss::tal_loss::targets_tensor;
    use yolo9::internals::loss::DualTalLoss;
    use yolo9::model::arch::STRIDES;
    use yolo9::model::YoloV9Train;
    let dev = Device::Cpu;
    let model = YoloV9Train::new(None, 3, Vec::new(), &dev, 7)?;
    let loss = DualTalLoss::new(3, &STRIDES)?;
    let x = common::uniform(&[2, 3, 64, 64], 11)
        .affine(0.5, 0.5)?
        .to_dtype(candle_core::DType::F32)?;
    let t = targets_tensor(
        &[
            [0.0, 0.0, 0.3, 0.4, 0.3, 0.25],
            [0.0, 2.0, 0.7, 0.6, 0.2, 0.3],
            [1.0, 1.0, 0.5, 0.5, 0.4, 0.4],
        ],
        &dev,
    )?;
    let params = model
        .vars()
        .iter()
        .map(|v| (v.name.clone(), v.var.clone()))
        .collect();
    let eval = |m: &YoloV9Train| -> anyhow::Result<(f32, candle_core::backprop::GradStore)> {
        let raw = m.forward(&x, true)?;
        let lo = loss.compute(&raw.aux, &raw.main, &t, (64, 64))?;
        let v = lo.total.to_scalar::<f32>()?;
        Ok((v, lo.total.backward()?))
    };
    let (l0, g) = eval(&model)?;
    assert!(l0.is_finite() && l0 > 0.0, "loss {l0}");
    let mut opt = Sgd::new(params, 0.0, 0.0, 0.0);
    let norm = opt.grad_norm(&g)?;
    // Plain gradient descent (momentum 0): predicted change -lr * |g|^2 = -0.1% of the loss.
    opt.lr = [1e-3 * l0 as f64 / (norm * norm); 3];
    opt.step(&g)?;
    let (l1, _) = eval(&model)?;
    let predicted = 1e-3 * l0;
    // The TAL targets (assignment and aligned scores) depend on the predictions but are
    // detached, as in the official loss, so the step moves the loss by more than the gradient's
    // first-order prediction (about 5x at this initialisation); it must still go down.
    assert!(
        l1 < l0 - 0.5 * predicted && l1 > l0 - 8.0 * predicted,
        "an SGD step of predicted decrease {predicted} changed the loss {l0} -> {l1}"
    );
    Ok(())
}
