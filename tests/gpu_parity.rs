//! GPU parity (feature `cuda`, needs an NVIDIA GPU): the CUDA ops against the CPU
//! implementation on the same inputs. Built with `cargo test --release --features cuda --test
//! gpu_parity --no-run` and run on the GPU machine; needs no files.
//!
//! - fused train-mode BN + SiLU (`kernels/bn_act.cu`): output, dx, dγ, dβ, running statistics;
//! - cuDNN convolution: output, dx, dw (3×3 stride 1 and 2, 1×1, groups);
//! - one training step of the YOLOv9-s training graph with the dual TAL loss: loss items and the
//!   gradients of the first and last layers;
//! - the taped training step (`yolo9::internals::model::tape`, the default on CUDA) against candle's autograd
//!   on the GPU: loss items and every parameter gradient;
//! - the multi-tensor optimizer kernels (`kernels/optim.cu`): gradient norm, clip, SGD Nesterov
//!   with weight decay and the EMA against the candle ops of the CPU path (bit-exact updates).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor, Var};
use yolo9::internals::loss::DualTalLoss;
use yolo9::internals::model::bn_act;
use yolo9::internals::model::conv::conv2d_any;
use yolo9::model::YoloV9Train;

/// Tests that read or set the training-graph switch (`YOLO9_TRAIN_GRAPH`, process-wide) hold
/// this lock, so that one turning graphs off does not reach another running beside it.
fn graph_switch_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sets an environment switch until dropped (also when the test panics: a test that failed
/// with `YOLO9_TRAIN_GRAPH=0` still set turned graphs off for every test after it).
struct SwitchSet(&'static str);

impl SwitchSet {
    fn new(name: &'static str, value: &str) -> Self {
        std::env::set_var(name, value);
        SwitchSet(name)
    }
}

impl Drop for SwitchSet {
    fn drop(&mut self) {
        std::env::remove_var(self.0);
    }
}

fn gpu() -> Device {
    // Parity against the CPU is measured in strict f32 (no TF32 tensor cores).
    yolo9::internals::cuda::conv::set_strict_fp32(true);
    Device::new_cuda(0).expect("gpu_parity needs a CUDA device (run it on the GPU machine)")
}

/// f32 CPU tensor, uniform in [shift − scale, shift + scale).
fn rand(shape: &[usize], seed: u64, scale: f32, shift: f32) -> Tensor {
    ((common::uniform(shape, seed) * scale as f64).unwrap() + shift as f64)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
}

/// max |a − b| / max |b| (b = the CPU result).
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    common::max_abs(a, b) / common::abs_max(b).max(1e-30)
}

/// Backward of `sum(y · r)` for a bf16 `y` on the GPU, with the same random weighting `r` as
/// [`both`] (rounded to bf16) and the sum taken in f32.
fn weighted_backward_bf16(y: &Tensor) -> candle_core::backprop::GradStore {
    let r = rand(y.dims(), 77, 1.0, 0.0)
        .to_device(y.device())
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    (y * &r)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap()
}

/// Runs `f` on CPU and GPU copies of `inputs` with a random output weighting, returning the
/// outputs and the gradients of every input on both devices.
fn both(inputs: &[Tensor], f: impl Fn(&[Tensor]) -> Tensor) -> [(Tensor, Vec<Tensor>); 2] {
    [Device::Cpu, gpu()].map(|dev| {
        let vars: Vec<Var> = inputs
            .iter()
            .map(|t| Var::from_tensor(&t.to_device(&dev).unwrap()).unwrap())
            .collect();
        let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let y = f(&ts);
        let r = rand(y.dims(), 77, 1.0, 0.0).to_device(&dev).unwrap();
        let g = (&y * &r).unwrap().sum_all().unwrap().backward().unwrap();
        let grads = ts
            .iter()
            .map(|t| g.get(t).expect("gradient").clone())
            .collect();
        (y, grads)
    })
}

#[test]
fn fused_bn_silu_on_gpu_equals_cpu() {
    for (shape, silu) in [
        ([4, 64, 40, 40], true),
        ([2, 3, 7, 5], false),
        ([1, 256, 20, 20], true),
    ] {
        let c = shape[1];
        let x = rand(&shape, 1, 3.0, 0.7);
        let gamma = rand(&[c], 2, 0.5, 1.0);
        let beta = rand(&[c], 3, 0.5, 0.0);
        let [(yc, gc), (yg, gg)] = both(&[x, gamma, beta], |t| {
            let stats = bn_act::channel_stats(&t[0]).unwrap();
            bn_act::bn_act_train(&t[0], &t[1], &t[2], &stats, 1e-3, silu).unwrap()
        });
        let e = [
            rel(&yg, &yc),
            rel(&gg[0], &gc[0]),
            rel(&gg[1], &gc[1]),
            rel(&gg[2], &gc[2]),
        ];
        println!(
            "bn_act {shape:?} silu={silu}: y {:.1e} dx {:.1e} dγ {:.1e} dβ {:.1e}",
            e[0], e[1], e[2], e[3]
        );
        for (name, v) in ["y", "dx", "dγ", "dβ"].iter().zip(e) {
            assert!(v <= 1e-5, "{name} differs by {v:e} (relative)");
        }
        let sc = bn_act::channel_stats(&rand(&shape, 1, 3.0, 0.7)).unwrap();
        let sg =
            bn_act::channel_stats(&rand(&shape, 1, 3.0, 0.7).to_device(&gpu()).unwrap()).unwrap();
        assert!(rel(&sg, &sc) <= 1e-6, "stats differ by {:e}", rel(&sg, &sc));
    }
}

#[test]
fn cudnn_conv_forward_and_backward_equal_cpu() {
    // (x shape, w shape, padding, stride, groups)
    let cases = [
        ([2, 32, 24, 24], [64, 32, 3, 3], 1, 1, 1),
        ([2, 32, 24, 24], [64, 32, 3, 3], 1, 2, 1),
        ([2, 64, 12, 12], [48, 64, 1, 1], 0, 1, 1),
        ([2, 32, 12, 12], [32, 8, 3, 3], 1, 1, 4),
    ];
    for (xs, ws, p, s, g) in cases {
        let x = rand(&xs, 5, 1.0, 0.0);
        let w = rand(&ws, 6, 0.2, 0.0);
        let [(yc, gc), (yg, gg)] = both(&[x, w], |t| conv2d_any(&t[0], &t[1], p, s, g).unwrap());
        let e = [rel(&yg, &yc), rel(&gg[0], &gc[0]), rel(&gg[1], &gc[1])];
        println!(
            "conv {xs:?}*{ws:?} p{p} s{s} g{g}: y {:.1e} dx {:.1e} dw {:.1e}",
            e[0], e[1], e[2]
        );
        for (name, v) in ["y", "dx", "dw"].iter().zip(e) {
            assert!(v <= 1e-4, "{name} differs by {v:e} (relative)");
        }
    }
}

#[test]
fn one_training_step_on_gpu_matches_cpu() {
    let names: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    // Two 160×160 images, 3 boxes each (batch index, class, cx, cy, w, h normalized).
    let x = ((rand(&[2, 3, 160, 160], 11, 0.5, 0.5)).clamp(0f32, 1f32)).unwrap();
    let targets = Tensor::new(
        &[
            [0f32, 0., 0.30, 0.30, 0.20, 0.25],
            [0., 1., 0.60, 0.55, 0.35, 0.30],
            [0., 2., 0.80, 0.20, 0.10, 0.12],
            [1., 0., 0.50, 0.50, 0.40, 0.40],
            [1., 2., 0.20, 0.75, 0.15, 0.20],
            [1., 1., 0.70, 0.80, 0.25, 0.18],
        ],
        &Device::Cpu,
    )
    .unwrap();
    let loss = DualTalLoss::new(3, &[8, 16, 32]).unwrap();
    let run = |dev: &Device| {
        let m = YoloV9Train::new(None, 3, names.clone(), dev, 0).unwrap();
        let raw = m.forward(&x.to_device(dev).unwrap(), true).unwrap();
        let out = loss
            .compute(&raw.aux, &raw.main, &targets, (160, 160))
            .unwrap();
        let g = out.total.backward().unwrap();
        let pick = |name: &str| {
            let v = m.vars().iter().find(|v| v.name == name).expect(name);
            g.get(v.var.as_tensor()).expect("gradient").clone()
        };
        let grads = [
            "model.0.conv.weight",
            "model.0.bn.weight",
            "model.29.cv5.0.2.weight",
        ]
        .map(pick);
        (out.items, grads)
    };
    let (ic, gc) = run(&Device::Cpu);
    let (ig, gg) = run(&gpu());
    for k in 0..3 {
        let r = ((ig[k] - ic[k]) / ic[k]).abs();
        println!("loss item {k}: gpu {} cpu {} (rel {r:.1e})", ig[k], ic[k]);
        assert!(r <= 1e-4, "loss item {k} differs by {r:e} (relative)");
    }
    // The first convolution's gradient passes back through every train-mode BatchNorm of the
    // network. With the initialisation order of every-size models it differs from the CPU's by
    // about 1e-3 on the H200 (2026-12-02: layer 0 weight max 1.0e-3 / L2 9.2e-4, its BN weight
    // 1.0e-3 / 9.6e-4, the head's 3.1e-4 / 1.5e-4, loss items 1.8e-6); the growth towards the
    // input is not explained yet. The whole tensor is judged by the relative L2 error
    // (‖a − b‖ / ‖b‖), the worst entry by a wider bound.
    for (i, (a, b)) in gg.iter().zip(&gc).enumerate() {
        let r = rel(a, b);
        let a = &a.to_device(&Device::Cpu).unwrap();
        let l2 = ((a - b)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            / b.sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
                .max(1e-30))
        .sqrt();
        println!("gradient {i}: max rel {r:.1e}, L2 rel {l2:.1e}");
        assert!(l2 <= 1.5e-3, "gradient {i} differs by {l2:e} (relative L2)");
        assert!(
            r <= 3e-3,
            "gradient {i} differs by {r:e} (largest entry, relative)"
        );
    }
}

#[test]
fn taped_training_step_on_gpu_equals_candle_autograd() {
    let dev = gpu();
    let x = ((rand(&[2, 3, 160, 160], 12, 0.5, 0.5)).clamp(0f32, 1f32))
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let targets = Tensor::new(
        &[
            [0f32, 0., 0.30, 0.30, 0.20, 0.25],
            [0., 1., 0.60, 0.55, 0.35, 0.30],
            [1., 2., 0.50, 0.50, 0.40, 0.40],
        ],
        &Device::Cpu,
    )
    .unwrap();
    let loss = DualTalLoss::new(3, &[8, 16, 32]).unwrap();
    let plain = YoloV9Train::new(None, 3, Vec::new(), &dev, 3).unwrap();
    let taped = YoloV9Train::new(None, 3, Vec::new(), &dev, 3).unwrap();
    let raw = plain.forward(&x, true).unwrap();
    let la = loss
        .compute(&raw.aux, &raw.main, &targets, (160, 160))
        .unwrap();
    let ga = la.total.backward().unwrap();
    let (raw, tape) = taped.forward_taped(&x).unwrap();
    let lb = loss
        .compute(&raw.aux, &raw.main, &targets, (160, 160))
        .unwrap();
    let mut gb = lb.total.backward().unwrap();
    let gb = tape.backward(&mut gb).unwrap();
    assert_eq!(la.items, lb.items, "loss items");
    let mut worst = (0f64, String::new());
    let mut n = 0;
    for (pa, pb) in plain.vars().iter().zip(taped.vars()) {
        let (Some(a), Some(b)) = (ga.get(pa.var.as_tensor()), gb.get(pb.var.as_tensor())) else {
            panic!("{}: a gradient is missing", pa.name);
        };
        let r = rel(
            &b.to_device(&Device::Cpu).unwrap(),
            &a.to_device(&Device::Cpu).unwrap(),
        );
        n += 1;
        if r > worst.0 {
            worst = (r, pa.name.clone());
        }
    }
    println!(
        "taped vs candle autograd on the GPU: {n} gradients, worst rel {:.1e} ({})",
        worst.0, worst.1
    );
    assert!(worst.0 <= 1e-4, "worst gradient difference {worst:?}");
    // Running statistics: both forwards update them in the statistics kernel: equal bits.
    for layer in ["model.0.bn", "model.9.cv5.bn", "model.29.cv5.0.1.bn"] {
        let (ma, va) = plain.bn_running_stats(layer).expect(layer);
        let (mb, vb) = taped.bn_running_stats(layer).expect(layer);
        let cpu = |t: Tensor| t.to_device(&Device::Cpu).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(cpu(ma), cpu(mb), "{layer} running mean");
        assert_eq!(cpu(va), cpu(vb), "{layer} running var");
    }
}

#[test]
fn fused_bn_silu_in_bf16_stays_within_bf16_rounding_of_f32() {
    let shape = [4, 64, 40, 40];
    let x = rand(&shape, 1, 3.0, 0.7);
    let gamma = rand(&[64], 2, 0.5, 1.0);
    let beta = rand(&[64], 3, 0.5, 0.0);
    let [(yc, gc), _] = both(&[x.clone(), gamma.clone(), beta.clone()], |t| {
        let stats = bn_act::channel_stats(&t[0]).unwrap();
        bn_act::bn_act_train(&t[0], &t[1], &t[2], &stats, 1e-3, true).unwrap()
    });
    let dev = gpu();
    let xb = Var::from_tensor(&x.to_device(&dev).unwrap().to_dtype(DType::BF16).unwrap()).unwrap();
    let g = Var::from_tensor(&gamma.to_device(&dev).unwrap()).unwrap();
    let b = Var::from_tensor(&beta.to_device(&dev).unwrap()).unwrap();
    let stats = bn_act::channel_stats(xb.as_tensor()).unwrap();
    assert_eq!(stats.dtype(), DType::F32);
    let y = bn_act::bn_act_train(
        xb.as_tensor(),
        g.as_tensor(),
        b.as_tensor(),
        &stats,
        1e-3,
        true,
    )
    .unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    let grads = weighted_backward_bf16(&y);
    let e = [
        rel(&y, &yc),
        rel(grads.get(xb.as_tensor()).unwrap(), &gc[0]),
        rel(grads.get(g.as_tensor()).unwrap(), &gc[1]),
        rel(grads.get(b.as_tensor()).unwrap(), &gc[2]),
    ];
    println!(
        "bn_act bf16 vs f32: y {:.1e} dx {:.1e} dγ {:.1e} dβ {:.1e}",
        e[0], e[1], e[2], e[3]
    );
    // bf16 keeps 8 bits of mantissa: relative rounding 2^-8 ≈ 3.9e-3 per value.
    for (name, v) in ["y", "dx", "dγ", "dβ"].iter().zip(e) {
        assert!(v <= 2e-2, "{name} differs by {v:e} (relative)");
    }
}

/// At random init, the max-abs relative difference of whole-step weight gradients between bf16
/// and f32 is large (measured on the H200: 0.24 head, 0.39 layer 15, 1.5 layer 0) although the
/// loss items agree to 8e-4 and every bf16 op alone stays within bf16 rounding (tests above):
/// at random init the gradients are small differences of large terms, so bf16 rounding of the
/// activations changes them far beyond their own rounding. Kept (ignored) as a record; the
/// trained-model comparison below is the test of `--amp`.
#[test]
#[ignore]
fn mixed_precision_training_step_is_close_to_f32() {
    let x = ((rand(&[2, 3, 160, 160], 11, 0.5, 0.5)).clamp(0f32, 1f32)).unwrap();
    let targets = Tensor::new(
        &[
            [0f32, 0., 0.30, 0.30, 0.20, 0.25],
            [1., 2., 0.50, 0.50, 0.40, 0.40],
        ],
        &Device::Cpu,
    )
    .unwrap();
    // The host assigner, which returns the assignment for the second run.
    let loss = DualTalLoss::new(3, &[8, 16, 32])
        .unwrap()
        .with_device_assigner(false);
    let dev = gpu();
    // Both runs use the f32 run's assignments: at random init the anchors' alignment metrics
    // nearly tie, so bf16 rounding alone may pick other positives and change the gradient
    // far beyond rounding (seen: 1.6 relative at layer 0 with separate assignments).
    let assigned = std::cell::RefCell::new(None::<[yolo9::internals::loss::Assignment; 2]>);
    let run = |amp: bool| {
        let m = YoloV9Train::new(None, 3, vec![], &dev, 0).unwrap();
        m.set_amp(amp);
        assert_eq!(m.amp(), amp);
        let raw = m.forward(&x, true).unwrap();
        assert!(raw.main.iter().all(|t| t.dtype() == DType::F32));
        let mut a = assigned.borrow_mut();
        let out = match a.as_ref() {
            None => {
                let out = loss
                    .compute(&raw.aux, &raw.main, &targets, (160, 160))
                    .unwrap();
                *a = Some([
                    out.aux.assignment.clone().expect("host assignment"),
                    out.main.assignment.clone().expect("host assignment"),
                ]);
                out
            }
            Some([aa, am]) => loss
                .compute_with_assignments(&raw.aux, &raw.main, &targets, (160, 160), [aa, am])
                .unwrap(),
        };
        let g = out.total.backward().unwrap();
        let gw = LAYERS.map(|name| {
            let v = m.vars().iter().find(|v| v.name == name).unwrap();
            let gw = g
                .get(v.var.as_tensor())
                .expect("gradient reaches the f32 master weight")
                .clone();
            assert_eq!(gw.dtype(), DType::F32);
            gw
        });
        (out.items, gw)
    };
    let (i32_, g32) = run(false);
    let (ibf, gbf) = run(true);
    for k in 0..3 {
        let r = ((ibf[k] - i32_[k]) / i32_[k]).abs();
        println!(
            "AMP loss item {k}: bf16 {} f32 {} (rel {r:.1e})",
            ibf[k], i32_[k]
        );
        assert!(r <= 2e-2, "loss item {k} differs by {r:e}");
    }
    let r: Vec<f64> = gbf.iter().zip(&g32).map(|(a, b)| rel(a, b)).collect();
    for (name, r) in LAYERS.iter().zip(&r) {
        println!("AMP gradient of {name}: rel {r:.1e}");
    }
    // The head's weight gradient is one bf16 convolution away from the loss.
    assert!(r[2] <= 5e-2, "head gradient differs by {:e}", r[2]);
}

/// Layers whose gradients the AMP test compares: first, middle, head.
const LAYERS: [&str; 3] = [
    "model.0.conv.weight",
    "model.15.cv4.conv.weight",
    "model.29.cv5.0.2.weight",
];

#[test]
fn cudnn_conv_in_bf16_stays_within_bf16_rounding_of_f32() {
    let x = rand(&[2, 32, 24, 24], 5, 1.0, 0.0);
    let w = rand(&[64, 32, 3, 3], 6, 0.2, 0.0);
    let [(yc, gc), _] = both(&[x.clone(), w.clone()], |t| {
        conv2d_any(&t[0], &t[1], 1, 1, 1).unwrap()
    });
    let dev = gpu();
    let xb = Var::from_tensor(&x.to_device(&dev).unwrap().to_dtype(DType::BF16).unwrap()).unwrap();
    let wf = Var::from_tensor(&w.to_device(&dev).unwrap()).unwrap();
    let y = conv2d_any(
        xb.as_tensor(),
        &wf.as_tensor().to_dtype(DType::BF16).unwrap(),
        1,
        1,
        1,
    )
    .unwrap();
    let g = weighted_backward_bf16(&y);
    let e = [
        rel(&y, &yc),
        rel(g.get(xb.as_tensor()).unwrap(), &gc[0]),
        rel(g.get(wf.as_tensor()).unwrap(), &gc[1]),
    ];
    println!(
        "conv bf16 vs f32: y {:.1e} dx {:.1e} dw {:.1e}",
        e[0], e[1], e[2]
    );
    for (name, v) in ["y", "dx", "dw"].iter().zip(e) {
        assert!(v <= 2e-2, "{name} differs by {v:e} (relative)");
    }
}

#[test]
fn fused_sgd_clip_and_ema_equal_cpu() {
    use yolo9::internals::train::ema::Ema;
    use yolo9::internals::train::optimizer::Sgd;
    let g = gpu();
    let shapes: [&[usize]; 4] = [&[64, 32, 3, 3], &[64], &[70001], &[7, 5]];
    let names = ["a.conv.weight", "a.bn.weight", "b.conv.weight", "c.bias"];
    let mk = |dev: &Device| {
        let params: Vec<(String, Var)> = shapes
            .iter()
            .zip(names)
            .enumerate()
            .map(|(i, (s, n))| {
                let t = rand(s, 10 + i as u64, 0.5, 0.0).to_device(dev).unwrap();
                (n.to_string(), Var::from_tensor(&t).unwrap())
            })
            .collect();
        params
    };
    let (pc, pg) = (mk(&Device::Cpu), mk(&g));
    let mut oc = Sgd::new(pc.clone(), 0.01, 0.937, 5e-4);
    let mut og = Sgd::new(pg.clone(), 0.01, 0.937, 5e-4);
    oc.lr = [0.1, 0.01, 0.02];
    og.lr = oc.lr;
    let state = |p: &[(String, Var)]| -> Vec<(String, Tensor)> {
        p.iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect()
    };
    let mut ec = Ema::new(&state(&pc)).unwrap();
    let mut eg = Ema::new(&state(&pg)).unwrap();
    for step in 0..3u64 {
        // Gradients large enough for the clip to act (norm > 10).
        let grads = |p: &[(String, Var)], dev: &Device| {
            let loss = p
                .iter()
                .enumerate()
                .map(|(i, (_, v))| {
                    let c = rand(v.dims(), 100 + step * 10 + i as u64, 20.0, 0.0)
                        .to_device(dev)
                        .unwrap();
                    (v.as_tensor() * &c).unwrap().sum_all().unwrap()
                })
                .reduce(|a, b| (a + b).unwrap())
                .unwrap();
            loss.backward().unwrap()
        };
        let (mut gc, mut gg) = (grads(&pc, &Device::Cpu), grads(&pg, &g));
        let nc = oc.clip_grad_norm(&mut gc, 10.0).unwrap();
        let ng = og.clip_grad_norm(&mut gg, 10.0).unwrap();
        assert!(nc > 10.0, "the clip must act: norm {nc}");
        assert!((nc - ng).abs() <= 1e-5 * nc, "norm {ng} vs cpu {nc}");
        oc.step(&gc).unwrap();
        og.step(&gg).unwrap();
        ec.update(&state(&pc)).unwrap();
        eg.update(&state(&pg)).unwrap();
    }
    for ((n, vc), (_, vg)) in pc.iter().zip(&pg) {
        let r = rel(
            &vg.as_tensor().to_device(&Device::Cpu).unwrap(),
            vc.as_tensor(),
        );
        // The clip coefficient comes from norms summed in different orders (<= 1 ulp).
        assert!(r <= 1e-6, "{n}: weights differ by {r:e}");
    }
    for ((n, tc), (_, tg)) in ec.state.iter().zip(&eg.state) {
        let r = rel(&tg.to_device(&Device::Cpu).unwrap(), tc);
        assert!(r <= 1e-6, "EMA {n}: differs by {r:e}");
    }
    for ((n, bc), (_, bg)) in oc.state().iter().zip(og.state().iter()) {
        let r = rel(&bg.to_device(&Device::Cpu).unwrap(), bc);
        assert!(r <= 1e-6, "momentum {n}: differs by {r:e}");
    }
}

/// The gradient accumulation of the training step (`train::step::add_param_grads`, on CUDA one
/// multi-tensor launch into one new buffer) equals candle's per-tensor adds on the CPU, bit for
/// bit, over three micro-batches, and moves the parameters' gradients out of each store.
#[test]
fn fused_gradient_accumulation_equals_per_tensor_adds() {
    use yolo9::internals::train::optimizer::Sgd;
    use yolo9::internals::train::step::add_param_grads;
    let g = gpu();
    let shapes: [&[usize]; 4] = [&[64, 32, 3, 3], &[64], &[70001], &[7, 5]];
    let names = ["a.conv.weight", "a.bn.weight", "b.conv.weight", "c.bias"];
    let params: Vec<(String, Var)> = shapes
        .iter()
        .zip(names)
        .enumerate()
        .map(|(i, (s, n))| {
            let t = rand(s, 40 + i as u64, 0.5, 0.0).to_device(&g).unwrap();
            (n.to_string(), Var::from_tensor(&t).unwrap())
        })
        .collect();
    let opt = Sgd::new(params.clone(), 0.01, 0.937, 5e-4);
    let grads_of = |k: u64| {
        let loss = params
            .iter()
            .enumerate()
            .map(|(i, (_, v))| {
                let c = rand(v.dims(), 200 + k * 10 + i as u64, 3.0, -1.0)
                    .to_device(&g)
                    .unwrap();
                (v.as_tensor().sqr().unwrap() * &c)
                    .unwrap()
                    .sum_all()
                    .unwrap()
            })
            .reduce(|a, b| (a + b).unwrap())
            .unwrap();
        loss.backward().unwrap()
    };
    let mut acc = None;
    let mut want: Vec<Tensor> = Vec::new();
    for k in 0..3 {
        let mut gs = grads_of(k);
        let cpu: Vec<Tensor> = params
            .iter()
            .map(|(_, v)| {
                gs.get(v.as_tensor())
                    .unwrap()
                    .to_device(&Device::Cpu)
                    .unwrap()
            })
            .collect();
        want = if want.is_empty() {
            cpu
        } else {
            want.iter()
                .zip(&cpu)
                .map(|(a, b)| (a + b).unwrap())
                .collect()
        };
        add_param_grads(&mut acc, &mut gs, &opt).unwrap();
        for (_, v) in &params {
            assert!(
                gs.get(v.as_tensor()).is_none(),
                "gradient left in the store"
            );
        }
    }
    let acc = acc.unwrap();
    for ((n, v), w) in params.iter().zip(&want) {
        let got = acc.get(v.as_tensor()).unwrap();
        assert_eq!(got.dims(), w.dims(), "{n}");
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all()
                .unwrap()
                .to_device(&Device::Cpu)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .into_iter()
                .map(f32::to_bits)
                .collect()
        };
        assert_eq!(bits(got), bits(w), "{n}: accumulated gradient");
    }
}

/// The folded-BN inference epilogue (`kernels/bias_act.cu`) against its CPU op, f32 exactly up to
/// `expf` rounding and f16 within f16 rounding, with and without SiLU, on a shape with more
/// rows than one grid dimension covers in one step.
#[test]
fn bias_act_kernel_equals_cpu() {
    use yolo9::internals::model::bias_act::bias_act;
    let dev = gpu();
    for (shape, seed) in [(vec![2usize, 5, 7, 9], 1u64), (vec![3, 70, 3, 3], 2)] {
        let c = shape[1];
        let x = rand(&shape, seed, 4.0, 0.0);
        let b = rand(&[c], seed + 10, 1.0, 0.0);
        for silu in [true, false] {
            let want = bias_act(&x, &b, silu).unwrap();
            let got = bias_act(
                &x.to_device(&dev).unwrap(),
                &b.to_device(&dev).unwrap(),
                silu,
            )
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap();
            let r = rel(&got, &want);
            println!("bias_act {shape:?} silu {silu}: f32 rel {r:.2e}");
            assert!(r < 1e-6, "f32 rel {r}");
            let (xh, bh) = (
                x.to_dtype(DType::F16).unwrap(),
                b.to_dtype(DType::F16).unwrap(),
            );
            let want_h = bias_act(&xh, &bh, silu)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
            let got_h = bias_act(
                &xh.to_device(&dev).unwrap(),
                &bh.to_device(&dev).unwrap(),
                silu,
            )
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap();
            let rh = rel(&got_h, &want_h);
            println!("bias_act {shape:?} silu {silu}: f16 rel {rh:.2e}");
            assert!(rh < 2e-3, "f16 rel {rh}");
        }
    }
}

/// The inference forward replayed from a CUDA graph (`yolo9::internals::model::graphs`) equals the forward
/// launched kernel by kernel, on the shipped weights, in f32 and f16: the third forward of a
/// shape captures, later ones replay, each replay sees its own input.
#[test]
fn inference_forward_replayed_from_a_cuda_graph_equals_launched() {
    let dev = yolo9::device::select(yolo9::device::DeviceSpec::Cuda(0)).unwrap();
    let w =
        yolo9::Weights::load(std::path::Path::new("weights/yolov9-s-bccd.safetensors")).unwrap();
    for dtype in [DType::F32, DType::F16] {
        let m = yolo9::internals::model::yolov9::YoloV9::load_dtype(&w, &dev, dtype).unwrap();
        let x1 = rand(&[2, 3, 256, 320], 5, 0.5, 0.5)
            .to_device(&dev)
            .unwrap();
        let x2 = rand(&[2, 3, 256, 320], 6, 0.5, 0.5)
            .to_device(&dev)
            .unwrap();
        let want1 = m.forward_launched(&x1).unwrap();
        let want2 = m.forward_launched(&x2).unwrap();
        let a = m.forward(&x1).unwrap(); // first sighting: launched
        let _ = m.forward(&x1).unwrap(); // second: launched
        let b = m.forward(&x1).unwrap(); // third: capture, first replay
        let c = m.forward(&x2).unwrap(); // replay on a new input
        let d = m.forward(&x1).unwrap(); // and back
        assert_eq!(m.graph_counts(), (1, 2), "{dtype:?}");
        let cpu = |t: &Tensor| t.to_device(&Device::Cpu).unwrap();
        let (w1, w2) = (cpu(&want1), cpu(&want2));
        let r = [
            rel(&cpu(&a), &w1),
            rel(&cpu(&b), &w1),
            rel(&cpu(&c), &w2),
            rel(&cpu(&d), &w1),
        ];
        println!("graph replay {dtype:?}: rel {r:?}");
        assert!(r.iter().all(|&v| v <= 1e-6), "{dtype:?}: {r:?}");
        assert!(
            rel(&w1, &w2) > 1e-3,
            "different inputs give different outputs"
        );
        // Another shape is launched the first time, then captured too.
        let x3 = rand(&[1, 3, 224, 288], 7, 0.5, 0.5)
            .to_device(&dev)
            .unwrap();
        let e1 = m.forward(&x3).unwrap();
        let _ = m.forward(&x3).unwrap();
        let e2 = m.forward(&x3).unwrap();
        assert_eq!(m.graph_counts(), (2, 2), "{dtype:?}");
        assert!(rel(&cpu(&e2), &cpu(&e1)) <= 1e-6);
    }
}

/// The training micro-step replayed from CUDA graphs (`yolo9::internals::train::graphed`) equals the
/// ordinary taped step: loss items and every parameter gradient, at the capture and at later
/// replays (new targets each time, GT rows padded to the capture's capacity), again after a
/// batch with more GT rows than that capacity made it capture again, with the BN running
/// statistics and `num_batches_tracked`
/// of two models driven the same way equal too.
#[test]
fn graphed_training_step_equals_ordinary() {
    use yolo9::internals::train::graphed::{ordinary, StepGraphs};
    let _graphs = graph_switch_lock();
    let dev = yolo9::device::select(yolo9::device::DeviceSpec::Cuda(0)).unwrap();
    // Strict f32 whatever ran before in this process: with TF32 convolutions two ordinary steps
    // differed by 9e-4 (this test run alone on the H200, 2026-12-04), beyond the bound below.
    yolo9::internals::cuda::conv::set_strict_fp32(true);
    let x = ((rand(&[2, 3, 160, 160], 21, 0.5, 0.5)).clamp(0f32, 1f32))
        .unwrap()
        .to_device(&dev)
        .unwrap();
    // Three rows, or 20 more in image 0 (more than the capture's first GT capacity of 16 rows
    // per image: the step captures again with room for 32).
    let tg = |k: f32, extra: usize| {
        let mut rows = vec![
            [0f32, 0., 0.30 + k, 0.30, 0.20, 0.25],
            [0., 1., 0.60, 0.55 - k, 0.35, 0.30],
            [1., 2., 0.50, 0.50, 0.40 + k, 0.40],
        ];
        for j in 0..extra {
            let f = j as f32 / extra as f32;
            rows.push([
                0.,
                (j % 3) as f32,
                0.1 + 0.8 * f,
                0.9 - 0.8 * f,
                0.08,
                0.1 + k,
            ]);
        }
        let n = rows.len();
        Tensor::from_vec(rows.concat(), (n, 6), &Device::Cpu).unwrap()
    };
    let loss = DualTalLoss::new(3, &[8, 16, 32]).unwrap();
    let a = YoloV9Train::new(None, 3, Vec::new(), &dev, 3).unwrap();
    let b = YoloV9Train::new(None, 3, Vec::new(), &dev, 3).unwrap();
    let pa: Vec<Tensor> = a.vars().iter().map(|v| v.var.as_tensor().clone()).collect();
    let pb: Vec<Tensor> = b.vars().iter().map(|v| v.var.as_tensor().clone()).collect();
    let mut sg = StepGraphs::new();
    assert!(sg.applies(&x));
    let steps = [
        (0.0f32, 0),
        (0.02, 0),
        (0.05, 0),
        (-0.03, 0),
        (0.01, 20),
        (0.0, 20),
        (0.03, 20),
    ];
    for (i, (k, extra)) in steps.into_iter().enumerate() {
        let t = tg(k, extra);
        let want = ordinary(&a, &loss, &pa, &x, &t, (160, 160)).unwrap();
        let got = sg.micro_step(&b, &loss, &pb, &x, &t, (160, 160)).unwrap();
        assert_eq!(want.items, got.items, "step {i}: loss items");
        let (gw, gg) = (want.grads.unwrap(), got.grads.unwrap());
        let mut worst = 0f64;
        for (p, q) in pa.iter().zip(&pb) {
            let r = rel(
                &gg.get(q)
                    .expect("graphed gradient")
                    .to_device(&Device::Cpu)
                    .unwrap(),
                &gw.get(p)
                    .expect("ordinary gradient")
                    .to_device(&Device::Cpu)
                    .unwrap(),
            );
            worst = worst.max(r);
        }
        println!(
            "graphed step {i} (counts {:?}): worst gradient rel {worst:.1e}",
            sg.counts()
        );
        // Two ordinary steps differ by a few 1e-6 (cuDNN's weight-gradient algorithms add with
        // atomics); a replay reading a stale or wrong buffer is off by far more.
        assert!(worst <= 1e-4, "step {i}: worst gradient difference {worst}");
    }
    // Steps 0 and 4 ran ordinarily (a new key), 1 and 5 captured, the others replayed.
    assert_eq!(sg.counts(), (2, 3));
    assert_eq!(a.batches_tracked(), b.batches_tracked());
    for layer in ["model.0.bn", "model.29.cv5.0.1.bn"] {
        let (ma, va) = a.bn_running_stats(layer).expect(layer);
        let (mb, vb) = b.bn_running_stats(layer).expect(layer);
        let cpu = |t: Tensor| t.to_device(&Device::Cpu).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(cpu(ma), cpu(mb), "{layer} running mean");
        assert_eq!(cpu(va), cpu(vb), "{layer} running var");
    }
}

/// The TAL assigner kernels (`kernels/tal_assign.cu`) against the same op on the CPU (the host
/// assigner): owner rows, labels, target boxes and DFL distances exact, target scores within
/// 1e-6, on synthetic head-layout batches (640x640 with 30 GT rows per image and 80 classes,
/// the top-k fallback, zero overlaps, padding; one class and one row; no GT rows at all).
#[test]
fn tal_assigner_on_gpu_equals_cpu() {
    use yolo9::internals::loss::assign_op::{assign_dense, ScoreLayout};
    use yolo9::internals::loss::TaskAlignedAssigner;
    let dev = gpu();
    for (img, bs, m, nc, seed) in [(640, 8, 30, 80, 1u64), (320, 3, 1, 1, 2), (320, 2, 0, 4, 3)] {
        let (anchors, pbox, logits, gt) = common::assigner_batch(img, bs, m, nc, seed);
        let assigner = TaskAlignedAssigner::new(nc);
        let layout = ScoreLayout::HeadLogits {
            channels: 64 + nc,
            offset: 64,
        };
        let cpu = assign_dense(&assigner, &pbox, &logits, layout, &anchors, &gt).unwrap();
        let (pg, lg) = (
            pbox.to_device(&dev).unwrap(),
            logits.to_device(&dev).unwrap(),
        );
        let on_gpu = assign_dense(&assigner, &pg, &lg, layout, &anchors, &gt)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap();
        let c: Vec<f32> = cpu.flatten_all().unwrap().to_vec1().unwrap();
        let g: Vec<f32> = on_gpu.flatten_all().unwrap().to_vec1().unwrap();
        let ba = bs * anchors.len();
        let fg = c[10 * ba..].iter().filter(|&&o| o >= 0.0).count();
        let d0 = c[..ba]
            .iter()
            .zip(&g[..ba])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let exact = c[ba..] == g[ba..];
        println!("assigner {img}px b{bs} m{m} nc{nc}: {fg} fg, scores max|diff| {d0:e}, rest exact {exact}");
        assert!(exact, "owner, label, box or DFL planes differ");
        assert!(d0 <= 1e-6, "target scores differ by {d0}");
        if m > 0 {
            assert!(fg > 0, "the case has positives");
        }
        // The GT rows padded to a larger capacity (what the replayed training step uploads):
        // the padding rows are never valid, so the planes are the same, bit for bit.
        let dg =
            yolo9::internals::loss::DeviceGt::new(anchors.clone(), &gt, m + 13, nc, &dev).unwrap();
        let padded =
            yolo9::internals::loss::assign_op::assign_device(&assigner, &pg, &lg, layout, &dg)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
        assert!(
            padded == g,
            "{img}px b{bs} m{m}: padded GT rows change the planes"
        );
    }
}

/// Cosine similarity of two gradients (f64 sums on the host).
fn cosine(a: &Tensor, b: &Tensor) -> f64 {
    let v = |t: &Tensor| -> Vec<f64> {
        t.to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let (a, b) = (v(a), v(b));
    let dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb).max(1e-300)
}

/// Mixed precision (`--amp true`, bf16, the default on CUDA) on a trained model (the shipped
/// BCCD weights, BCCD-like boxes): the same step in bf16 and in strict f32, with the f32 step's
/// assignments for both. Loss items within 5e-3 (measured on the H200: 1.0e-3, 7.5e-4, 1.8e-4);
/// the gradient points the way the f32 one does: cosine ≥ 0.97 for the whole gradient (measured
/// 0.979) and ≥ 0.975 for the first, a middle and the head layer (0.985, 0.982, 0.9999). That is
/// bf16 rounding (8 significant bits, about 0.4% per value, compounding through ~50 layers of
/// bf16 activations in the backward), far below the noise of a mini-batch gradient; the
/// 50-epoch BCCD run with AMP reached test mAP50-95 0.536 against 0.523 in f32
/// (docs/training.md).
/// A collapse of these figures means a broken cast, not rounding.
#[test]
fn mixed_precision_step_of_a_trained_model_follows_f32() {
    let w = yolo9::model::weights::Weights::load(std::path::Path::new(
        "weights/yolov9-s-bccd.safetensors",
    ))
    .expect("run from the repository root (weights/yolov9-s-bccd.safetensors)");
    let x = ((rand(&[4, 3, 320, 320], 5, 0.5, 0.5)).clamp(0f32, 1f32)).unwrap();
    let mut rows = Vec::new();
    for b in 0..4 {
        for k in 0..6 {
            let f = (b * 6 + k) as f32;
            rows.push([
                b as f32,
                (k % 3) as f32,
                0.15 + 0.7 * ((f * 0.37) % 1.0),
                0.15 + 0.7 * ((f * 0.61) % 1.0),
                0.05 + 0.15 * ((f * 0.23) % 1.0),
                0.05 + 0.15 * ((f * 0.41) % 1.0),
            ]);
        }
    }
    let targets = yolo9::internals::loss::tal_loss::targets_tensor(&rows, &Device::Cpu).unwrap();
    let loss = DualTalLoss::new(3, &[8, 16, 32])
        .unwrap()
        .with_device_assigner(false);
    let dev = gpu();
    let x = x.to_device(&dev).unwrap();
    let assigned = std::cell::RefCell::new(None::<[yolo9::internals::loss::Assignment; 2]>);
    let run = |amp: bool| {
        let m = YoloV9Train::new(Some(&w), 3, vec![], &dev, 0).unwrap();
        m.set_amp(amp);
        let raw = m.forward(&x, true).unwrap();
        let mut a = assigned.borrow_mut();
        let out = match a.as_ref() {
            None => {
                let out = loss
                    .compute(&raw.aux, &raw.main, &targets, (320, 320))
                    .unwrap();
                *a = Some([
                    out.aux.assignment.clone().unwrap(),
                    out.main.assignment.clone().unwrap(),
                ]);
                out
            }
            Some([aa, am]) => loss
                .compute_with_assignments(&raw.aux, &raw.main, &targets, (320, 320), [aa, am])
                .unwrap(),
        };
        let g = out.total.backward().unwrap();
        let grads: Vec<(String, Tensor)> = m
            .vars()
            .iter()
            .filter_map(|v| {
                g.get(v.var.as_tensor())
                    .map(|t| (v.name.clone(), t.to_device(&Device::Cpu).unwrap()))
            })
            .collect();
        (out.items, grads)
    };
    let (i32_, g32) = run(false);
    let (ibf, gbf) = run(true);
    for k in 0..3 {
        let r = ((ibf[k] - i32_[k]) / i32_[k]).abs();
        println!(
            "trained AMP loss item {k}: bf16 {} f32 {} (rel {r:.1e})",
            ibf[k], i32_[k]
        );
        assert!(r <= 5e-3, "loss item {k} differs by {r:e}");
    }
    let flat = |g: &[(String, Tensor)]| {
        Tensor::cat(
            &g.iter()
                .map(|(_, t)| t.flatten_all().unwrap().to_dtype(DType::F64).unwrap())
                .collect::<Vec<_>>(),
            0,
        )
        .unwrap()
    };
    assert_eq!(g32.len(), gbf.len());
    let whole = cosine(&flat(&gbf), &flat(&g32));
    let mut worst = (1f64, String::new());
    for ((n, a), (_, b)) in gbf.iter().zip(&g32) {
        let c = cosine(a, b);
        if c < worst.0 {
            worst = (c, n.clone());
        }
    }
    println!(
        "trained AMP gradients: whole cosine {whole:.5}, worst tensor cosine {:.4} ({})",
        worst.0, worst.1
    );
    for name in LAYERS {
        let (a, b) = (
            &gbf.iter().find(|(n, _)| n == name).unwrap().1,
            &g32.iter().find(|(n, _)| n == name).unwrap().1,
        );
        let (c, r) = (cosine(a, b), rel(a, b));
        println!("trained AMP gradient of {name}: cosine {c:.5}, rel {r:.1e}");
        assert!(c >= 0.975, "{name}: cosine {c}");
    }
    assert!(whole >= 0.97, "whole-gradient cosine {whole}");
}

/// Packed batch-NMS rows `[x1, y1, x2, y2, conf, cls, anchor]` of `pred` on the GPU and on the
/// CPU, asserted bit-equal; returns the GPU rows.
fn nms_gpu_equals_cpu(
    pred: &Tensor,
    o: &yolo9::internals::detect::nms::NmsOptions,
    xyxy: bool,
    what: &str,
) -> Vec<Vec<[f32; 7]>> {
    use yolo9::internals::detect::device_nms::{batch_nms_packed, unpack};
    let cpu = unpack(&batch_nms_packed(pred, o, xyxy).unwrap()).unwrap();
    let gpu_in = pred.to_device(&gpu()).unwrap();
    let gpu = unpack(&batch_nms_packed(&gpu_in, o, xyxy).unwrap()).unwrap();
    assert_eq!(gpu.len(), cpu.len(), "{what}: images");
    for (i, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
        assert_eq!(g.len(), c.len(), "{what}, image {i}: kept rows");
        for (k, (gr, cr)) in g.iter().zip(c).enumerate() {
            let same = gr.iter().zip(cr).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{what}, image {i}, row {k}: GPU {gr:?} CPU {cr:?}");
        }
    }
    let kept: Vec<usize> = gpu.iter().map(Vec::len).collect();
    println!("{what}: kept {kept:?}, GPU = CPU bit for bit");
    gpu
}

#[test]
fn nms_kernel_equals_host_nms() {
    use yolo9::internals::detect::nms::NmsOptions;
    // torchvision's cases as box lists (keep indices = anchors of the kept rows).
    let t =
        candle_core::safetensors::load(common::reference("nms_cases.safetensors"), &Device::Cpu)
            .unwrap();
    let bx = |k: &str| -> Vec<[f32; 4]> {
        t[k].to_vec2::<f32>()
            .unwrap()
            .into_iter()
            .map(|r| [r[0], r[1], r[2], r[3]])
            .collect()
    };
    let keep = |k: &str| -> Vec<usize> {
        t[k].to_vec1::<i64>()
            .unwrap()
            .into_iter()
            .map(|v| v as usize)
            .collect()
    };
    let all = |thr: f64, agnostic: bool| NmsOptions {
        conf_thres: f32::NEG_INFINITY,
        iou_thres: thr,
        agnostic,
        max_det: 1000,
        ..Default::default()
    };
    let c3 = keep("case3_idxs");
    for (b, s, c, o, want) in [
        (
            "case1_boxes",
            "case1_scores",
            None,
            all(0.5, false),
            "case1_keep",
        ),
        (
            "case1_boxes",
            "case1_scores",
            None,
            all(0.3, false),
            "case1_keep_thr_0_3",
        ),
        (
            "case2_boxes",
            "case2_scores",
            None,
            all(0.45, false),
            "case2_keep_iou_0_45",
        ),
        (
            "case2_boxes",
            "case2_scores",
            None,
            all(0.7, false),
            "case2_keep_iou_0_7",
        ),
        (
            "case3_boxes",
            "case3_scores",
            Some(&c3[..]),
            all(0.6, false),
            "case3_keep_batched_iou_0_6",
        ),
        (
            "case3_boxes",
            "case3_scores",
            Some(&c3[..]),
            all(0.6, true),
            "case3_keep_agnostic_iou_0_6",
        ),
    ] {
        let pred = common::box_list_output(&bx(b), &t[s].to_vec1::<f32>().unwrap(), c);
        let got = nms_gpu_equals_cpu(&pred, &o, true, want);
        let anchors: Vec<usize> = got[0].iter().map(|r| r[6] as usize).collect();
        assert_eq!(anchors, keep(want), "{want}");
    }
    // The official output of horses.jpg at the detect and val settings (the multi-label one
    // has more than 30000 candidates: the max_nms cut), and random batches with many ties.
    let f = candle_core::safetensors::load(
        common::reference("forward_horses.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let y = &f["y_main"];
    let val = NmsOptions {
        conf_thres: 0.001,
        iou_thres: 0.7,
        max_det: 300,
        ..Default::default()
    };
    let val_ml = NmsOptions {
        multi_label: true,
        ..val.clone()
    };
    let filtered = NmsOptions {
        classes: Some(vec![0, 17, 45]),
        agnostic: true,
        max_det: 7,
        ..Default::default()
    };
    for (o, what) in [
        (NmsOptions::default(), "horses, detect"),
        (val.clone(), "horses, val"),
        (val_ml.clone(), "horses, val multi-label"),
        (filtered.clone(), "horses, classes + agnostic + max_det 7"),
    ] {
        nms_gpu_equals_cpu(y, &o, false, what);
    }
    let r80 = common::random_output(4, 80, 8400, 11);
    nms_gpu_equals_cpu(
        &r80,
        &val_ml,
        false,
        "random 4x84x8400, val multi-label (cut)",
    );
    nms_gpu_equals_cpu(
        &r80,
        &NmsOptions::default(),
        false,
        "random 4x84x8400, detect",
    );
    let r3 = common::random_output(3, 3, 5880, 12);
    nms_gpu_equals_cpu(&r3, &val_ml, false, "random 3x7x5880, val multi-label");
    nms_gpu_equals_cpu(&r3, &filtered, false, "random 3x7x5880, filtered");
    // Through the public entry point: the same rows as on the CPU.
    let host = yolo9::internals::detect::postprocess::non_max_suppression(y, &val_ml).unwrap();
    let dev = yolo9::internals::detect::postprocess::non_max_suppression(
        &y.to_device(&gpu()).unwrap(),
        &val_ml,
    )
    .unwrap();
    assert_eq!(host, dev);
}

/// The channels-last inference forward (`YoloV9::with_channels_last`; on CUDA the default for
/// one image in f16): on a letterboxed BCCD example and a random batch, against the CPU's f32
/// forward. Strict
/// f32 channels-last equals the CPU to f32 rounding; f16 channels-last stays within the bounds
/// the NCHW f16 forward meets, and both detect the same boxes as the CPU.
#[test]
fn channels_last_forward_equals_nchw_and_cpu() {
    use yolo9::internals::model::yolov9::YoloV9;
    let dev = gpu();
    let w =
        yolo9::Weights::load(std::path::Path::new("weights/yolov9-s-bccd.safetensors")).unwrap();
    let det = yolo9::Detector::from_weights(&w, Device::Cpu, DType::F32).unwrap();
    let img =
        yolo9::data::image::load_rgb8(std::path::Path::new("examples/images/BloodImage_00007.jpg"))
            .unwrap();
    let (lb, _) = det.preprocess(&img).unwrap();
    let real = yolo9::internals::detect::letterbox::to_tensor(&[&lb], &Device::Cpu).unwrap();
    let random = rand(&[3, 3, 256, 320], 9, 0.5, 0.5);
    let cpu_model = YoloV9::load(&w, &Device::Cpu).unwrap();
    let split = |y: &Tensor| {
        let rows = y.dim(1).unwrap();
        (
            y.narrow(1, 0, 4).unwrap(),
            y.narrow(1, 4, rows - 4).unwrap(),
        )
    };
    for (name, x) in [("BloodImage_00007", &real), ("random 3x256x320", &random)] {
        let want = cpu_model.forward(x).unwrap();
        let (wb, ws) = split(&want);
        let xg = x.to_device(&dev).unwrap();
        for (dtype, nhwc, box_px, score) in [
            (DType::F32, true, 2e-3, 1e-5),
            (DType::F16, true, 2.0, 1e-2),
            (DType::F16, false, 2.0, 1e-2),
        ] {
            let m = YoloV9::load_dtype(&w, &dev, dtype)
                .unwrap()
                .with_channels_last(nhwc);
            assert_eq!(m.channels_last_for(x.dim(0).unwrap()), nhwc);
            let got = m
                .forward_launched(&xg)
                .unwrap()
                .to_device(&Device::Cpu)
                .unwrap();
            let (gb, gs) = split(&got);
            let (db, ds) = (common::max_abs(&gb, &wb), common::max_abs(&gs, &ws));
            println!("{name} {dtype:?} nhwc {nhwc}: boxes {db:.3e} px, scores {ds:.3e}");
            assert!(
                db <= box_px && ds <= score,
                "{name} {dtype:?} nhwc {nhwc}: {db} px, {ds}"
            );
        }
    }
    // The same detections as the CPU on the real image, channels-last f16 (the default for one
    // image) through the Detector.
    assert_eq!(
        YoloV9::load_dtype(&w, &dev, DType::F16)
            .unwrap()
            .channels_last_for(1),
        std::env::var("YOLO9_NHWC").as_deref() != Ok("0")
    );
    let gdet = yolo9::Detector::from_weights(&w, dev.clone(), DType::F16).unwrap();
    let dimg = image::DynamicImage::ImageRgb8(img.clone());
    let dg = gdet.detect(&dimg).unwrap();
    let dc = det.detect(&dimg).unwrap();
    assert_eq!(dg.len(), dc.len(), "detections: GPU f16 NHWC vs CPU f32");
    for (a, b) in dg.iter().zip(&dc) {
        assert_eq!(a.class_id, b.class_id);
        let d = a
            .bbox
            .iter()
            .zip(b.bbox)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(d <= 2.0, "box moved {d} px");
    }
}

/// The inference kernels of the channels-last and NCHW forwards against their CPU forms: the
/// pools (`InferPoolOp`: exact in f32, the same arithmetic), the head's DFL (strided logits read in
/// place) and the channels-last bias + SiLU in its 16-byte-vector form (C a multiple of the
/// width) and its scalar form (C = 5); f16 within f16 rounding.
#[test]
fn inference_pools_dfl_and_channels_last_bias_act_equal_cpu() {
    use yolo9::internals::model::bias_act::{bias_act, bias_act_nhwc};
    use yolo9::internals::model::pool::infer_pool;
    use yolo9::internals::op_args::InferPool;
    let dev = gpu();
    let cpu = |t: &Tensor| {
        t.to_dtype(DType::F32)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap()
    };
    let x = rand(&[2, 16, 9, 11], 5, 3.0, 0.0);
    let xl = x.permute((0, 2, 3, 1)).unwrap().contiguous().unwrap();
    for (p, input) in [
        (InferPool::Avg2Nchw, &x),
        (InferPool::Avg2Nhwc, &xl),
        (InferPool::MaxSameNhwc(5), &xl),
        (InferPool::MaxSameNhwc(3), &xl),
    ] {
        let want = infer_pool(input, p).unwrap();
        let got = cpu(&infer_pool(&input.to_device(&dev).unwrap(), p).unwrap());
        assert_eq!(common::max_abs(&got, &want), 0.0, "{p:?} f32");
        let h = input.to_dtype(DType::F16).unwrap();
        let want_h = infer_pool(&h.to_dtype(DType::F32).unwrap(), p).unwrap();
        let got_h = cpu(&infer_pool(&h.to_device(&dev).unwrap(), p).unwrap());
        let r = rel(&got_h, &want_h);
        println!("{p:?}: f16 rel {r:.2e}");
        assert!(r < 1e-3, "{p:?} f16 rel {r}");
    }
    // DFL of a (B, 64 + 3, A) head output's first 64 rows, read through the narrow's strides.
    let head = rand(&[2, 67, 50], 9, 6.0, 0.0);
    let logits = head.narrow(1, 0, 64).unwrap();
    let want = yolo9::internals::model::head::dfl(&logits).unwrap();
    let got = cpu(&yolo9::internals::model::head::dfl(
        &head.to_device(&dev).unwrap().narrow(1, 0, 64).unwrap(),
    )
    .unwrap());
    let r = rel(&got, &want);
    println!("dfl f32 rel {r:.2e}");
    assert!(r < 1e-5, "dfl f32 rel {r}");
    let hh = head.to_dtype(DType::F16).unwrap();
    let want_h = yolo9::internals::model::head::dfl(
        &hh.to_dtype(DType::F32).unwrap().narrow(1, 0, 64).unwrap(),
    )
    .unwrap();
    let got_h = cpu(&yolo9::internals::model::head::dfl(
        &hh.to_device(&dev).unwrap().narrow(1, 0, 64).unwrap(),
    )
    .unwrap());
    let r = rel(&got_h, &want_h);
    println!("dfl f16 rel {r:.2e}");
    assert!(r < 2e-3, "dfl f16 rel {r}");
    // Channels-last bias + SiLU: vector form (C = 16) and scalar form (C = 5).
    for c in [16usize, 5] {
        let x = rand(&[2, 6, 7, c], 11 + c as u64, 4.0, 0.0);
        let b = rand(&[c], 12, 1.0, 0.0);
        let xn = x.permute((0, 3, 1, 2)).unwrap().contiguous().unwrap();
        let want = bias_act(&xn, &b, true)
            .unwrap()
            .permute((0, 2, 3, 1))
            .unwrap()
            .contiguous()
            .unwrap();
        let got = cpu(&bias_act_nhwc(
            &x.to_device(&dev).unwrap(),
            &b.to_device(&dev).unwrap(),
            true,
        )
        .unwrap());
        let r = rel(&got, &want);
        println!("bias_act_nhwc C {c}: f32 rel {r:.2e}");
        assert!(r < 1e-6, "C {c} f32 rel {r}");
        let (xh, bh) = (
            x.to_dtype(DType::F16).unwrap(),
            b.to_dtype(DType::F16).unwrap(),
        );
        let got_h = cpu(&bias_act_nhwc(
            &xh.to_device(&dev).unwrap(),
            &bh.to_device(&dev).unwrap(),
            true,
        )
        .unwrap());
        let r = rel(&got_h, &want);
        println!("bias_act_nhwc C {c}: f16 rel {r:.2e}");
        assert!(r < 3e-3, "C {c} f16 rel {r}");
    }
}

/// NCCL with a group of one (issue 38; run alone: it sets `YOLO9_TRAIN_GRAPH` for the process,
/// `cargo test --features cuda --test gpu_parity nccl -- --test-threads 1`, needs NCCL and the
/// BCCD images of `YOLO9_SHARED`): the group's operations run through NCCL on the GPU and give
/// back exactly what went in (host buffers, a 10M-element tensor, agreement, barrier); and a
/// tiny training run as rank 0 of 1 (gradients exchanged through NCCL) ends with the weights of
/// the same run without a group, within what two runs without a group differ by (cuDNN's
/// weight gradients add with atomics). Once with the ordinary step, once replayed from CUDA graphs
/// (issue 56: a group without --sync-bn replays its step as one GPU does).
#[test]
fn nccl_group_of_one_gives_back_its_input_and_trains_as_one_gpu() {
    use std::collections::HashMap;
    use std::time::Duration;
    use yolo9::device::DeviceSpec;
    use yolo9::internals::train::checkpoint::load_state;
    use yolo9::internals::train::dist::local::local_group;
    use yolo9::internals::train::dist::nccl::{version, NcclRank};
    use yolo9::internals::train::dist::Collective;
    use yolo9::train::trainer::{train_group, train_with, StopFlag, TrainEvent, TrainObserver};
    struct Quiet;
    impl TrainObserver for Quiet {
        fn event(&mut self, _: &TrainEvent<'_>) {}
    }
    let dev = yolo9::device::select(DeviceSpec::Cuda(0)).unwrap();
    let group = || {
        let ctl = local_group(1, Duration::from_secs(120)).unwrap().remove(0);
        NcclRank::new(Box::new(ctl), &dev).expect("an NCCL group of one on GPU 0")
    };
    println!("NCCL {}", version().unwrap());
    let mut c = group();
    let v0: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
    let mut v = v0.clone();
    c.all_reduce_sum(&mut v).unwrap();
    assert_eq!(v, v0, "all-reduce of one rank");
    c.broadcast(&mut v).unwrap();
    assert_eq!(v, v0, "broadcast of one rank");
    c.barrier().unwrap();
    assert_eq!(c.agree(5).unwrap().flags, vec![5]);
    let t = rand(&[10_000_000], 3, 1.0, 0.0).to_device(&dev).unwrap();
    let s = c.all_reduce_sum_tensor(&t).unwrap();
    assert!(s.device().same_device(&dev));
    let cpu = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().to_vec1::<f32>().unwrap();
    assert!(cpu(&s) == cpu(&t), "the tensor all-reduce of one rank");
    let b = c.broadcast_tensor(&t).unwrap();
    assert!(cpu(&b) == cpu(&t), "the tensor broadcast of one rank");
    drop(c);

    let _graphs = graph_switch_lock();
    // The ordinary step (graphs off), then the step replayed from CUDA graphs (the default,
    // also in a group without --sync-bn).
    for graphs in ["0", "1"] {
        let dir = common::tmpdir(&format!("nccl1-graphs{graphs}"));
        let mut o = common::tiny_run_options(&dir, "solo");
        let switch = SwitchSet::new(yolo9::internals::train::graphed::TRAIN_GRAPH_ENV, graphs);
        o.device = DeviceSpec::Cuda(0);
        o.batch = 2;
        o.epochs = 2;
        o.noplots = true;
        let stop = StopFlag::install().unwrap();
        let a = train_with(&o, &stop, &mut Quiet).unwrap();
        o.name = "solo2".into();
        let a2 = train_with(&o, &stop, &mut Quiet).unwrap();
        o.name = "group".into();
        let g = train_group(&o, &stop, &mut Quiet, Box::new(group())).unwrap();
        drop(switch);
        let state = |s: &yolo9::train::trainer::TrainSummary| {
            load_state(&s.run_dir.join("weights/state.safetensors")).unwrap()
        };
        let (sa, sa2, sg) = (state(&a), state(&a2), state(&g));
        assert_eq!(sg.meta.iterations, sa.meta.iterations);
        // The largest difference of any tensor relative to the largest value of any tensor (the
        // model's scale: a per-tensor ratio would be dominated by tensors of values near zero).
        let max_rel = |x: &HashMap<String, Tensor>, y: &HashMap<String, Tensor>| {
            let (mut diff, mut scale) = (0f64, 0f64);
            for (k, tx) in x {
                diff = diff.max(common::max_abs(tx, &y[k]));
                scale = scale.max(common::abs_max(tx));
            }
            diff / scale.max(1e-12)
        };
        let (noise, d) = (
            max_rel(&sa.model, &sa2.model),
            max_rel(&sa.model, &sg.model),
        );
        println!(
            "graphs {graphs}: group of one vs without a group: {d:e} relative; two runs without \
             a group: {noise:e} (train loss {:?} / {:?})",
            g.epochs[1].train_loss, a.epochs[1].train_loss
        );
        // Bitwise when the GPU repeats itself, else within a few times its spread. Two runs are
        // not bitwise (cuDNN's weight gradients add with atomics) and the spread of one pair
        // varies ~100x between launches: two runs without a group differed by 1.6e-3 on
        // 2026-12-03 and by 1.6e-5 on 2026-12-04, when the group of one differed by 1.6e-3. So
        // the bound is the larger of this launch's spread and the largest one measured; a wrong
        // sum or a missing broadcast moves the weights by far more.
        const SPREAD: f64 = 1.6e-3;
        assert!(
            d <= 4.0 * noise.max(SPREAD),
            "graphs {graphs}: {d:e} > 4 x max({noise:e}, {SPREAD:e})"
        );
    }
}

/// A cache cap (`MemoryProbe::cap_cache`, what `--budget` sets after sizing) holds for probes of
/// the same pool created later: the CUDA-graph capture of the training step makes one, and it
/// used to raise the pool's release threshold back to unlimited.
#[test]
fn a_cache_cap_survives_a_new_probe() {
    let dev = gpu();
    let a = yolo9::internals::memory::MemoryProbe::new(&dev).unwrap();
    a.cap_cache(3 << 30);
    assert_eq!(a.cache_cap(), 3 << 30);
    let b = yolo9::internals::memory::MemoryProbe::new(&dev).unwrap();
    assert_eq!(b.cache_cap(), 3 << 30, "a new probe lifted the cap");
    b.cap_cache(u64::MAX);
    assert_eq!(a.cache_cap(), u64::MAX);
}

#[test]
fn row_kernels_add_and_copy_channel_slices_as_candle() {
    use yolo9::internals::model::ew;
    let dev = gpu();
    // (shape, slice start, slice length): H·W = 1600 takes the 16-byte vector path, 7·5 the
    // scalar one; the last case slices one image (contiguous again).
    for (shape, start, len) in [
        ([4, 24, 40, 40], 8, 8),
        ([3, 10, 7, 5], 3, 4),
        ([1, 6, 8, 8], 2, 3),
    ] {
        let x = rand(&shape, 11, 2.0, 0.1);
        let mut small = shape;
        small[1] = len;
        let y = rand(&small, 12, 2.0, -0.3);
        for dtype in [DType::F32, DType::BF16] {
            let xg = x.to_dtype(dtype).unwrap().to_device(&dev).unwrap();
            let yg = y.to_dtype(dtype).unwrap().to_device(&dev).unwrap();
            let s = xg.narrow(1, start, len).unwrap();
            let t = xg.narrow(1, 0, len).unwrap();
            for (a, b) in [(&s, &yg), (&yg, &s), (&s, &t), (&yg, &yg)] {
                let got = ew::add(a, b).unwrap();
                assert!(got.is_contiguous());
                let want = (a + b).unwrap();
                let d = common::max_abs(
                    &got.to_dtype(DType::F32).unwrap(),
                    &want.to_dtype(DType::F32).unwrap(),
                );
                println!("ew add {shape:?} [{start}, +{len}) {dtype:?}: max |diff| {d:e}");
                // f32 is the same sum; bf16 may differ by one rounding step where candle rounds
                // the bf16 sum differently (values here are below 8, so an ulp is ≤ 2^-5).
                let tol = if dtype == DType::F32 { 0.0 } else { 1.0 / 32.0 };
                assert!(d <= tol, "{dtype:?} add differs by {d}");
            }
            let got = ew::contiguous(&s).unwrap();
            assert!(got.is_contiguous());
            let d = common::max_abs(
                &got.to_dtype(DType::F32).unwrap(),
                &s.contiguous().unwrap().to_dtype(DType::F32).unwrap(),
            );
            assert_eq!(d, 0.0, "{dtype:?} copy of the slice differs");
        }
    }
    // The avg-pool backward kernel against its CPU version (f32 exactly; bf16 rounds once).
    let dy = rand(&[2, 5, 9, 7], 14, 2.0, 0.0);
    let want = yolo9::internals::model::pool::avg_pool_2x2_s1_backward(&dy).unwrap();
    for dtype in [DType::F32, DType::BF16] {
        let got = yolo9::internals::model::pool::avg_pool_2x2_s1_backward(
            &dy.to_dtype(dtype).unwrap().to_device(&dev).unwrap(),
        )
        .unwrap();
        assert_eq!(got.dims(), &[2, 5, 10, 8]);
        let d = common::max_abs(&got.to_dtype(DType::F32).unwrap(), &want);
        let tol = if dtype == DType::F32 { 0.0 } else { 2.0 / 64.0 };
        assert!(d <= tol, "{dtype:?} avg-pool backward differs by {d}");
    }
    // Tensors candle's autograd tracks keep candle's ops, so their gradients still flow.
    let v = Var::from_tensor(&rand(&[2, 4, 8, 8], 13, 1.0, 0.0).to_device(&dev).unwrap()).unwrap();
    let s = v.as_tensor().narrow(1, 1, 2).unwrap();
    let z = ew::add(&s, &ew::contiguous(&s).unwrap()).unwrap();
    let g = z.sum_all().unwrap().backward().unwrap();
    let gv = g
        .get(v.as_tensor())
        .expect("gradient through ew::add")
        .narrow(1, 1, 2)
        .unwrap();
    assert_eq!(
        common::abs_max(&(gv - 2.0).unwrap()),
        0.0,
        "d(s + s)/ds is 2"
    );
}

#[test]
fn pinned_upload_equals_from_slice() {
    let dev = gpu();
    let bytes: Vec<u8> = (0..2 * 3 * 8 * 8).map(|i| (i * 7 % 251) as u8).collect();
    // Twice per size (the staging buffer is reused) and a second size (a last partial batch).
    for n in [2usize, 2, 1, 2] {
        let part = &bytes[..n * 3 * 8 * 8];
        let got = yolo9::internals::cuda::upload::upload_u8(part, (n, 3, 8, 8), &dev).unwrap();
        let want = Tensor::from_slice(part, (n, 3, 8, 8), &dev).unwrap();
        assert_eq!(got.dims(), want.dims());
        assert_eq!(
            got.flatten_all().unwrap().to_vec1::<u8>().unwrap(),
            want.flatten_all().unwrap().to_vec1::<u8>().unwrap()
        );
    }
    assert!(yolo9::internals::cuda::upload::upload_u8(&bytes[..10], (1, 3, 8, 8), &dev).is_err());
}

/// The BN snapshot taken before every training batch (one multi-tensor copy on CUDA) holds the
/// statistics as they were: a train-mode forward changes them, restoring gives them back
/// bitwise (and the snapshot is not a view of the live buffers).
#[test]
fn bn_snapshot_restores_the_statistics_bitwise() {
    let dev = gpu();
    let m = YoloV9Train::new(None, 3, Vec::new(), &dev, 3).unwrap();
    let x = rand(&[2, 3, 64, 64], 11, 0.5, 0.5).to_device(&dev).unwrap();
    m.forward(&x, true).unwrap();
    let before = m.bn_flat().unwrap();
    let snap = m.snapshot_bn().unwrap();
    m.forward(&x, true).unwrap();
    let changed = m.bn_flat().unwrap();
    let moved = before.iter().zip(&changed).filter(|(a, b)| a != b).count();
    assert!(
        moved > before.len() / 2,
        "the forward moved {moved} of {} values",
        before.len()
    );
    m.restore_bn(&snap).unwrap();
    assert!(m.bn_flat().unwrap() == before, "restored statistics differ");
}

/// The training step's overlapped upload: a replayed step given the next batch's bytes returns
/// them on the device (bitwise), and a step given its images on the device trains on those, not
/// on its host bytes: with zeroed host bytes it gives the loss of a twin model fed the real
/// bytes (within the GPU's run-to-run spread).
#[test]
fn step_uploads_the_next_batch_and_trains_on_device_images() {
    let _graphs = graph_switch_lock();
    use yolo9::internals::train::graphed::StepGraphs;
    use yolo9::internals::train::guard::Faults;
    use yolo9::internals::train::optimizer::Sgd;
    use yolo9::internals::train::step::{step, StepInput, StepParts, StepTimes};
    // As the trainer opens it (CUDA event tracking off: a capture needs that), strict f32.
    let dev = yolo9::device::select(yolo9::device::DeviceSpec::Cuda(0)).unwrap();
    yolo9::internals::cuda::conv::set_strict_fp32(true);
    let img = 160;
    let bytes = |seed: u64| -> Vec<u8> {
        let t = rand(&[2 * 3 * img * img], seed, 127.0, 128.0);
        t.to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|v| *v as u8)
            .collect()
    };
    let targets = [
        [0f32, 0., 0.30, 0.30, 0.20, 0.25],
        [1., 2., 0.50, 0.50, 0.40, 0.40],
    ];
    let loss = DualTalLoss::new(3, &[8, 16, 32]).unwrap();
    let models = [0, 1].map(|_| YoloV9Train::new(None, 3, Vec::new(), &dev, 3).unwrap());
    let opts = models.each_ref().map(|m| {
        let named = m.vars().iter().map(|v| (v.name.clone(), v.var.clone()));
        Sgd::new(named.collect(), 0.01, 0.937, 5e-4)
    });
    let graphs = [0, 1].map(|_| std::cell::RefCell::new(StepGraphs::new()));
    let parts = |i: usize| StepParts {
        model: &models[i],
        loss: &loss,
        opt: &opts[i],
        device: &dev,
        graphs: Some(&graphs[i]),
    };
    let run = |i: usize, input: &StepInput| {
        step(
            &parts(i),
            input,
            2,
            &Faults::default(),
            0,
            &mut StepTimes::off(),
        )
        .unwrap()
    };
    let zeros = vec![0u8; 2 * 3 * img * img];
    let mut pending = None;
    // Steps 0 and 1 run ordinarily and capture; 2 and 3 replay.
    for k in 0..4u64 {
        let (now, next) = (bytes(k), bytes(k + 1));
        let on_device: Option<Tensor> = pending.take();
        let a = run(
            0,
            &StepInput {
                images: if on_device.is_some() { &zeros } else { &now },
                targets: &targets,
                len: 2,
                img,
                on_device: on_device.as_ref(),
                next: Some(&next),
                masks: &[],
            },
        );
        let b = run(
            1,
            &StepInput {
                images: &now,
                targets: &targets,
                len: 2,
                img,
                on_device: None,
                next: None,
                masks: &[],
            },
        );
        for (x, y) in a.items.iter().zip(b.items) {
            assert!(
                (x - y).abs() <= 1e-5 * y.abs().max(1e-3),
                "step {k}: {:?} vs {:?}",
                a.items,
                b.items
            );
        }
        assert!(b.next_images.is_none());
        if k >= 2 {
            let t = a
                .next_images
                .expect("a replayed step uploads the next batch");
            assert_eq!(t.dims(), &[2, 3, img, img]);
            let got = t.flatten_all().unwrap().to_vec1::<u8>().unwrap();
            assert!(got == next, "step {k}: uploaded bytes differ");
            pending = Some(t);
        }
    }
    assert_eq!(graphs[0].borrow().counts(), (1, 2));
}

/// `device::to_host` of a view copies the view's elements only (candle's `to_device` copies the
/// whole storage: a checkpoint of the gradient window, ~900 views of one buffer, took 17.8 s),
/// with the values of the view.
#[test]
fn to_host_copies_a_views_elements_only() {
    let dev = gpu();
    let flat = rand(&[1 << 20], 9, 1.0, 0.0).to_device(&dev).unwrap();
    let view = flat.narrow(0, 1000, 60).unwrap().reshape((6, 10)).unwrap();
    let h = yolo9::device::to_host(&view).unwrap();
    let (storage, layout) = h.storage_and_layout();
    let candle_core::Storage::Cpu(c) = &*storage else {
        panic!("not on the CPU")
    };
    assert_eq!(c.as_slice::<f32>().unwrap().len(), 60);
    assert_eq!(layout.start_offset(), 0);
    drop(storage);
    let want = flat
        .to_device(&Device::Cpu)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()[1000..1060]
        .to_vec();
    assert_eq!(h.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want);
}

/// The segmentation graphs on the GPU (`tests/model/seg_oracle/`, made by the official code on
/// the CPU): `forward_seg` in strict f32, NCHW and channels-last, against the official eval
/// outputs, and the segmentation loss on the GPU against the official one.
#[test]
fn segmentation_forward_and_loss_on_gpu_equal_the_official() {
    use std::collections::HashMap;
    let dev = gpu();
    for name in ["tiny-seg", "tiny-dseg"] {
        let (w, t) = common::seg_oracle_weights(name);
        for nhwc in [false, true] {
            let m = yolo9::model::YoloV9::load(&w, &dev)
                .unwrap()
                .with_channels_last(nhwc);
            let (pred, proto) = m.forward_seg(&t["x"]).unwrap();
            let (pred, proto) = (
                pred.to_device(&Device::Cpu).unwrap(),
                proto.to_device(&Device::Cpu).unwrap(),
            );
            let want = &t["pred"];
            let boxes = common::max_abs(
                &pred.narrow(1, 0, 4).unwrap(),
                &want.narrow(1, 0, 4).unwrap(),
            );
            let scores = common::max_abs(
                &pred.narrow(1, 4, 3).unwrap(),
                &want.narrow(1, 4, 3).unwrap(),
            );
            let coeffs = rel(
                &pred.narrow(1, 7, 8).unwrap(),
                &want.narrow(1, 7, 8).unwrap(),
            );
            let protos = rel(&proto, &t["proto"]);
            println!("{name} on the GPU (channels-last {nhwc}): boxes {boxes:.2e} px, scores {scores:.2e}, coefficients rel {coeffs:.2e}, prototypes rel {protos:.2e}");
            assert!(boxes <= 1e-2 && scores <= 1e-5 && coeffs <= 1e-4 && protos <= 1e-4);
        }
        // The loss on the GPU.
        use yolo9::internals::loss::seg::{seg_loss, GtMasks, SegBranch};
        let l: HashMap<String, Tensor> = candle_core::safetensors::load(
            common::seg_oracle(&format!("{name}.loss.safetensors")),
            &dev,
        )
        .unwrap();
        let dual = name == "tiny-dseg";
        let levels =
            |b: &str| -> Vec<Tensor> { (3..6).map(|k| l[&format!("{b}_p{k}")].clone()).collect() };
        let aux_l = if dual { levels("aux") } else { Vec::new() };
        let main_l = levels("main");
        let det = DualTalLoss::new(3, &[8, 16, 32]).unwrap();
        let out = seg_loss(
            &det,
            dual.then(|| SegBranch {
                levels: &aux_l,
                coeffs: &l["aux_coeffs"],
                proto: &l["aux_proto"],
            }),
            SegBranch {
                levels: &main_l,
                coeffs: &l["main_coeffs"],
                proto: &l["main_proto"],
            },
            &l["targets"],
            GtMasks::Overlap(&l["overlap_masks"]),
            (64, 96),
        )
        .unwrap();
        let want = l["overlap_items"]
            .to_device(&Device::Cpu)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        println!("{name} loss on the GPU: {:?} official {want:?}", out.items);
        for (o, w) in out.items.iter().zip(&want) {
            assert!((o - w).abs() / w.abs().max(1e-6) < 1e-4, "{o} vs {w}");
        }
    }
}

/// The channels-last layout kernels (`kernels/layout.cu`) equal candle's ops on the CPU: the f32
/// NCHW input to NHWC f16 (each value rounded once, the same rounding as `to_dtype`), an NHWC f16
/// tensor to NCHW f32 (exact), and the nearest 2x upsampling (a copy), on shapes whose pixels are
/// and are not a multiple of 16 bytes and with a batch of 2.
#[test]
fn layout_kernels_equal_the_cpu_ops() {
    use yolo9::internals::model::layout;
    let dev = gpu();
    let cpu = |t: &Tensor| t.to_device(&Device::Cpu).unwrap();
    let x = rand(&[2, 3, 37, 53], 11, 2.0, 0.0);
    let want = x
        .to_dtype(DType::F16)
        .unwrap()
        .permute((0, 2, 3, 1))
        .unwrap()
        .contiguous()
        .unwrap();
    let got = cpu(&layout::nhwc_from_nchw(&x.to_device(&dev).unwrap(), DType::F16, 8).unwrap());
    assert_eq!(got.dims(), [2, 37, 53, 8]);
    let got3 = got.narrow(3, 0, 3).unwrap().contiguous().unwrap();
    let diff = |a: &Tensor, b: &Tensor| {
        common::max_abs(
            &a.to_dtype(DType::F32).unwrap(),
            &b.to_dtype(DType::F32).unwrap(),
        )
    };
    assert_eq!(diff(&got3, &want), 0.0, "input cast and transposition");
    if got.dim(3).unwrap() > 3 {
        let pad = got.narrow(3, 3, got.dim(3).unwrap() - 3).unwrap();
        assert_eq!(
            common::abs_max(&pad.to_dtype(DType::F32).unwrap()),
            0.0,
            "padding"
        );
    }
    for c in [144, 5] {
        let t = rand(&[2, 9, 11, c], 12, 3.0, 0.0)
            .to_dtype(DType::F16)
            .unwrap();
        let want = t
            .permute((0, 3, 1, 2))
            .unwrap()
            .contiguous()
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let got = cpu(&layout::nchw_f32_from_nhwc(&t.to_device(&dev).unwrap()).unwrap());
        assert_eq!(
            common::max_abs(&got, &want),
            0.0,
            "output transposition, {c} channels"
        );
        let want = layout::upsample2_nhwc(&t).unwrap().contiguous().unwrap();
        let got = cpu(&layout::upsample2_nhwc(&t.to_device(&dev).unwrap()).unwrap());
        assert_eq!(diff(&got, &want), 0.0, "upsampling, {c} channels");
    }
}

/// The f16 channels-last forward of the trained BCCD weights on a real image, with the
/// convolution epilogues fused into cuDNN graphs (`YOLO9_CUDNN_FUSED=all`, the default) and
/// without (`off`), against the strict-f32 forward: both within f16 rounding of it (scores within
/// 0.02, boxes within 2 px where a score is above 0.25), the fused one no further than the
/// unfused one by more than a quarter.
#[test]
fn fused_half_forward_follows_f32() {
    use yolo9::internals::cuda::fused_conv::{fused, set_fused, Fused};
    let _g = graph_switch_lock();
    let dev = gpu();
    let w =
        yolo9::Weights::load(std::path::Path::new("weights/yolov9-s-bccd.safetensors")).unwrap();
    let img = image::open("examples/images/BloodImage_00007.jpg")
        .unwrap()
        .to_rgb8();
    let (h, wd) = (img.height() as usize, img.width() as usize);
    let x = Tensor::from_vec(img.into_raw(), (h, wd, 3), &Device::Cpu)
        .unwrap()
        .permute((2, 0, 1))
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .affine(1.0 / 255.0, 0.0)
        .unwrap()
        .unsqueeze(0)
        .unwrap()
        .to_device(&dev)
        .unwrap();
    let load =
        |dtype| yolo9::internals::model::yolov9::YoloV9::load_dtype(&w, &dev, dtype).unwrap();
    let exact = load(DType::F32).forward_launched(&x).unwrap();
    let exact = exact.to_device(&Device::Cpu).unwrap();
    let mode = fused();
    let mut errs = vec![];
    for m in [Fused::Off, Fused::All] {
        set_fused(m);
        let y = load(DType::F16)
            .forward_launched(&x)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap();
        let rows = y.dim(1).unwrap();
        let score = common::max_abs(
            &y.narrow(1, 4, rows - 4).unwrap(),
            &exact.narrow(1, 4, rows - 4).unwrap(),
        );
        // Box error where the f32 forward is confident.
        let conf = exact.narrow(1, 4, rows - 4).unwrap().max(1).unwrap(); // (1, A)
        let mask = conf
            .ge(0.25)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .unsqueeze(1)
            .unwrap();
        let dbox = (y.narrow(1, 0, 4).unwrap() - exact.narrow(1, 0, 4).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .broadcast_mul(&mask)
            .unwrap();
        let dbox = common::abs_max(&dbox);
        println!("{m:?}: score {score:.3e}, confident boxes {dbox:.3e} px");
        assert!(
            score <= 0.02 && dbox <= 2.0,
            "{m:?}: score {score}, box {dbox}"
        );
        errs.push((score, dbox));
    }
    set_fused(mode);
    assert!(
        errs[1].0 <= errs[0].0 * 1.25 + 1e-3,
        "fused scores {errs:?}"
    );
    assert!(errs[1].1 <= errs[0].1 * 1.25 + 0.05, "fused boxes {errs:?}");
}

/// The first convolution straight from the f32 NCHW input (`kernels/first_conv.cu`) against
/// candle's f32 convolution on the CPU, bias and SiLU added, on odd sizes (the padded right and
/// bottom edges): within one f16 rounding of the f32 result (2⁻¹¹ relative, plus 1e-4 for
/// values near zero). Then the products of a concatenation's parts summed into a channel slot of
/// a larger tensor with bias + SiLU in place (`gemm::pointwise_parts_into`,
/// `bias_act::bias_act_slot_in_place`) against the new-tensor products and epilogue: the same
/// values within f16 rounding, and the slot's neighbours untouched (bitwise).
#[test]
fn first_conv_and_slot_products_equal_the_composites() {
    use yolo9::internals::cuda::{bias_act, first_conv, gemm};
    let dev = gpu();
    let cpu = |t: &Tensor| t.to_device(&Device::Cpu).unwrap();
    let f32_of = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    for (c, silu) in [(16usize, true), (32, false), (48, true)] {
        let x = rand(&[2, 3, 37, 50], 21, 2.0, 0.3);
        let w = rand(&[c, 3, 3, 3], 22, 0.4, 0.0);
        let b = rand(&[c], 23, 0.5, 0.0);
        let z = x
            .conv2d(&w, 1, 2, 1, 1)
            .unwrap()
            .broadcast_add(&b.reshape((1, c, 1, 1)).unwrap())
            .unwrap();
        let z = if silu {
            candle_nn::ops::silu(&z).unwrap()
        } else {
            z
        };
        let want = z.permute((0, 2, 3, 1)).unwrap().contiguous().unwrap();
        let w_t = w
            .reshape((c, 27))
            .unwrap()
            .t()
            .unwrap()
            .contiguous()
            .unwrap();
        let got = first_conv::first_conv(
            &x.to_device(&dev).unwrap(),
            &w_t.to_device(&dev).unwrap(),
            &b.to_device(&dev).unwrap(),
            silu,
            DType::F16,
        )
        .unwrap();
        assert_eq!(got.dims(), [2, 19, 25, c]);
        let got = f32_of(&cpu(&got));
        let err = (&got - &want).unwrap().abs().unwrap();
        let bound = ((want.abs().unwrap() * (2f64).powi(-11)).unwrap() + 1e-4).unwrap();
        let over = err.gt(&bound).unwrap().to_dtype(DType::F32).unwrap();
        assert_eq!(
            common::abs_max(&over),
            0.0,
            "first convolution, {c} channels, silu {silu}: max error {}",
            common::max_abs(&got, &want)
        );
    }
    // Two parts (24 + 40 channels) → 32 channels into channels 16..48 of a 64-channel tensor.
    let h = |shape: &[usize], seed| rand(shape, seed, 1.0, 0.0).to_dtype(DType::F16).unwrap();
    let (p1, p2) = (h(&[2, 5, 7, 24], 31), h(&[2, 5, 7, 40], 32));
    let (w, b) = (h(&[32, 64], 33), h(&[32], 34));
    let out = h(&[2, 5, 7, 64], 35);
    let g = |t: &Tensor| t.to_device(&dev).unwrap();
    let (gp1, gp2, gw, gb, gout) = (g(&p1), g(&p2), g(&w), g(&b), g(&out));
    gemm::pointwise_parts_into(&[&gp1, &gp2], None, &gw, (&gout, 16)).unwrap();
    assert!(bias_act::bias_act_slot_in_place(&gout, 16, &gb, true, None).unwrap());
    let want = gemm::pointwise_parts(&[&gp1, &gp2], &gw).unwrap();
    let want = f32_of(&cpu(&yolo9::internals::model::bias_act::bias_act_nhwc(
        &want, &gb, true,
    )
    .unwrap()));
    assert_slot(&cpu(&gout), &out, &want, 16, "slot products");
}

/// `got` (f16, `(…, C_total)`, on the host) holds `want` (f32, `K` channels) in channels
/// `c_off .. c_off + K` within f16 rounding, and elsewhere exactly what `before` held.
fn assert_slot(got: &Tensor, before: &Tensor, want: &Tensor, c_off: usize, what: &str) {
    let f32_of = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let (k, ctot) = (want.dim(3).unwrap(), got.dim(3).unwrap());
    let slot = f32_of(&got.narrow(3, c_off, k).unwrap());
    let d = common::max_abs(&slot, want);
    assert!(d <= 2e-3 * common::abs_max(want).max(1.0), "{what}: {d}");
    for (lo, n) in [(0, c_off), (c_off + k, ctot - c_off - k)] {
        let a = f32_of(&got.narrow(3, lo, n).unwrap());
        let e = f32_of(&before.narrow(3, lo, n).unwrap());
        assert_eq!(
            common::max_abs(&a, &e),
            0.0,
            "{what}: channels {lo}..{} touched",
            lo + n
        );
    }
}

/// The product of a concatenation's upsampled part taken before the nearest 2× upsampling
/// (`gemm::pointwise_part_at`) and upsampled inside the in-place bias + SiLU
/// (`bias_act::bias_act_slot_in_place` with the low-resolution term), beside the other part's
/// product at its columns (`gemm::pointwise_parts_into` with `cols`): within f16 rounding of
/// upsampling first, then the products and epilogue of the whole concatenation; the slot's
/// neighbours untouched (bitwise). Also the shapes it refuses.
#[test]
fn low_resolution_part_products_equal_upsampling_first() {
    use yolo9::internals::cuda::{bias_act, gemm};
    let dev = gpu();
    let cpu = |t: &Tensor| t.to_device(&Device::Cpu).unwrap();
    let f32_of = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let g = |t: &Tensor| t.to_device(&dev).unwrap();
    let h = |shape: &[usize], seed| rand(shape, seed, 1.0, 0.0).to_dtype(DType::F16).unwrap();
    // cat(up(low) (16 channels at 3x5 → 6x10), full (24 channels at 6x10)) → 32 channels into
    // channels 8..40 of a 48-channel tensor.
    let (low, full) = (h(&[2, 3, 5, 16], 41), h(&[2, 6, 10, 24], 42));
    let (w, b) = (h(&[32, 40], 43), h(&[32], 44));
    let out = h(&[2, 6, 10, 48], 45);
    let (glow, gfull, gw, gb, gout) = (g(&low), g(&full), g(&w), g(&b), g(&out));
    let low_prod = gemm::pointwise_part_at(&glow, 0, &gw).unwrap();
    assert_eq!(low_prod.dims(), [2, 3, 5, 32]);
    gemm::pointwise_parts_into(&[&gfull], Some(&[16]), &gw, (&gout, 8)).unwrap();
    assert!(bias_act::bias_act_slot_in_place(&gout, 8, &gb, true, Some(&low_prod)).unwrap());
    let up = low
        .reshape((2, 3, 1, 5, 1, 16))
        .unwrap()
        .broadcast_as((2, 3, 2, 5, 2, 16))
        .unwrap()
        .reshape((2, 6, 10, 16))
        .unwrap();
    let want = gemm::pointwise_parts(&[&g(&up), &gfull], &gw).unwrap();
    let want = f32_of(&cpu(&yolo9::internals::model::bias_act::bias_act_nhwc(
        &want, &gb, true,
    )
    .unwrap()));
    assert_slot(&cpu(&gout), &out, &want, 8, "low-resolution products");
    // A low-resolution term of the wrong size is refused, the slot untouched.
    let before = cpu(&gout);
    let wrong = g(&h(&[2, 3, 4, 32], 46));
    assert!(!bias_act::bias_act_slot_in_place(&gout, 8, &gb, true, Some(&wrong)).unwrap());
    assert_eq!(common::max_abs(&f32_of(&cpu(&gout)), &f32_of(&before)), 0.0);
    // Columns beyond the kernel's, or not one per part, are errors.
    assert!(gemm::pointwise_part_at(&glow, 30, &gw).is_err());
    assert!(gemm::pointwise_parts_into(&[&gfull], Some(&[16, 0]), &gw, (&gout, 8)).is_err());
}

/// Letterboxed images to the network's input on the GPU (upload, then one kernel: cast, / 255,
/// transposition) equal the CPU's conversion bitwise, for two images of odd size.
#[test]
fn images_to_input_on_gpu_equal_the_cpu() {
    use yolo9::internals::detect::letterbox::to_tensor;
    let dev = gpu();
    let img = |seed: u32| {
        image::RgbImage::from_fn(37, 21, |x, y| {
            let v = (x * 31 + y * 17 + seed * 101) % 256;
            image::Rgb([v as u8, (255 - v) as u8, ((v * 7) % 256) as u8])
        })
    };
    let (a, b) = (img(1), img(2));
    let want = to_tensor(&[&a, &b], &Device::Cpu).unwrap();
    let got = to_tensor(&[&a, &b], &dev)
        .unwrap()
        .to_device(&Device::Cpu)
        .unwrap();
    assert_eq!(got.dims(), [2, 3, 21, 37]);
    assert_eq!(common::max_abs(&got, &want), 0.0);
}
