//! Block-level tests that need no full checkpoint: BN folding, RepConvN fusion, PyTorch pooling
//! semantics, nearest upsampling, anchors and the DFL decode against the stored oracle.

use crate::common;

use candle_core::{DType, Device, IndexOp, Tensor};
use std::collections::HashMap;
use yolo9::internals::model::blocks::{AConv, Elan1, RepConvN, RepNBottleneck};
use yolo9::internals::model::conv::{Conv, ConvSpec, BN_EPS};
use yolo9::internals::model::head;
use yolo9::internals::model::params::{BuildMode, Builder};
use yolo9::internals::model::pool;

/// Deterministic pseudo-random values in [lo, hi).
pub fn rand_tensor(shape: &[usize], seed: u64, lo: f32, hi: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            lo + (hi - lo) * u
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn subset() -> HashMap<String, Tensor> {
    let p = common::reference("yolov9-s.state_dict.subset.safetensors");
    candle_core::safetensors::load(&p, &Device::Cpu)
        .unwrap_or_else(|e| panic!("loading {}: {e}", p.display()))
}

fn builders(sd: &HashMap<String, Tensor>) -> (Builder<'_>, Builder<'_>) {
    let cpu = Device::Cpu;
    (
        Builder::new(Some(sd), None, &cpu, BuildMode::Fused, 0),
        Builder::new(Some(sd), None, &cpu, BuildMode::Train, 0),
    )
}

#[test]
fn bn_folding_equals_conv_then_bn() {
    let sd = subset();
    let (mut bf, mut bt) = builders(&sd);
    let spec = ConvSpec::new(3, 32, 3, 2);
    let fused = Conv::load(&mut bf, "model.0", spec).unwrap();
    let unfused = Conv::load(&mut bt, "model.0", spec).unwrap();
    assert!(fused.bn.is_none() && fused.bias.is_some());
    assert!(unfused.bn.is_some() && unfused.bias.is_none());
    assert!(bt.initialized().is_empty(), "{:?}", bt.initialized());

    let x = rand_tensor(&[2, 3, 64, 96], 1, 0.0, 1.0);
    let a = fused.forward(&x, false).unwrap();
    let b = unfused.forward(&x, false).unwrap();
    assert_eq!(a.dims(), &[2, 32, 32, 48]);

    // Hand-written reference: conv, then (y - mean)/sqrt(var + 1e-3)*g + b, then SiLU.
    let w = &sd["model.0.conv.weight"];
    let y = x.conv2d(w, 1, 2, 1, 1).unwrap();
    let r = |n: &str| sd[n].reshape((1, 32, 1, 1)).unwrap();
    let y = y
        .broadcast_sub(&r("model.0.bn.running_mean"))
        .unwrap()
        .broadcast_div(
            &(r("model.0.bn.running_var") + BN_EPS)
                .unwrap()
                .sqrt()
                .unwrap(),
        )
        .unwrap()
        .broadcast_mul(&r("model.0.bn.weight"))
        .unwrap()
        .broadcast_add(&r("model.0.bn.bias"))
        .unwrap();
    let y = (&y * candle_nn::ops::sigmoid(&y).unwrap()).unwrap();
    let e_unf = common::max_abs(&b, &y) / common::abs_max(&y);
    let e_fused = common::max_abs(&a, &y) / common::abs_max(&y);
    println!("conv+BN: unfused rel err {e_unf:.2e}, fused rel err {e_fused:.2e}");
    assert!(e_unf < 1e-6, "unfused conv+BN differs: {e_unf}");
    assert!(e_fused < 1e-5, "folded conv differs: {e_fused}");
}

#[test]
fn repconvn_fused_equals_two_branches() {
    let sd = subset();
    let (mut bf, mut bt) = builders(&sd);
    let p = "model.4.cv2.0.m.0.cv1";
    let fused = RepConvN::load(&mut bf, p, 32, 32).unwrap();
    let unfused = RepConvN::load(&mut bt, p, 32, 32).unwrap();
    let RepConvN::Branches { conv1, conv2 } = &unfused else {
        panic!("training build must keep both branches")
    };
    assert!(matches!(fused, RepConvN::Fused(_)));
    assert_eq!(conv1.weight.dims(), &[32, 32, 3, 3]);
    assert_eq!(conv2.weight.dims(), &[32, 32, 1, 1]);
    assert_eq!(conv2.padding, 0);

    let x = rand_tensor(&[1, 32, 20, 28], 2, -2.0, 3.0);
    let a = fused.forward(&x, false).unwrap();
    let sum = (conv1.forward(&x, false).unwrap() + conv2.forward(&x, false).unwrap()).unwrap();
    let want = sum.silu().unwrap();
    let b = unfused.forward(&x, false).unwrap();
    let e = common::max_abs(&a, &want) / common::abs_max(&want);
    println!("RepConvN fused vs branches: rel err {e:.2e}");
    assert!(e < 1e-5, "fused RepConvN differs: {e}");
    assert!(common::max_abs(&b, &want) == 0.0);

    // Whole bottleneck (RepConvN + Conv + residual), fused vs unfused.
    let (mut bf, mut bt) = builders(&sd);
    let f = RepNBottleneck::load(&mut bf, "model.4.cv2.0.m.0", 32, 32).unwrap();
    let u = RepNBottleneck::load(&mut bt, "model.4.cv2.0.m.0", 32, 32).unwrap();
    assert!(f.add);
    let (a, b) = (f.forward(&x, false).unwrap(), u.forward(&x, false).unwrap());
    let e = common::max_abs(&a, &b) / common::abs_max(&b);
    println!("RepNBottleneck fused vs unfused: rel err {e:.2e}");
    assert!(e < 1e-5);
}

#[test]
fn elan1_and_aconv_fused_equal_unfused() {
    let sd = subset();
    let (mut bf, mut bt) = builders(&sd);
    let f2 = Elan1::load(&mut bf, "model.2", [64, 64, 64, 32]).unwrap();
    let u2 = Elan1::load(&mut bt, "model.2", [64, 64, 64, 32]).unwrap();
    let f3 = AConv::load(&mut bf, "model.3", 64, 128).unwrap();
    let u3 = AConv::load(&mut bt, "model.3", 64, 128).unwrap();
    let x = rand_tensor(&[1, 64, 16, 24], 3, -1.0, 2.0);
    let a = f3.forward(&f2.forward(&x, false).unwrap(), false).unwrap();
    let b = u3.forward(&u2.forward(&x, false).unwrap(), false).unwrap();
    assert_eq!(a.dims(), &[1, 128, 8, 12]);
    let e = common::max_abs(&a, &b) / common::abs_max(&b);
    println!("ELAN1+AConv fused vs unfused: rel err {e:.2e}");
    assert!(e < 1e-5);
}

#[test]
fn fused_build_rejects_missing_and_misshaped_tensors() {
    let sd = subset();
    let (mut bf, _) = builders(&sd);
    let err = Conv::load(&mut bf, "model.1", ConvSpec::new(32, 64, 3, 2))
        .err()
        .expect("model.1 is not in the subset");
    let msg = format!("{err:#}");
    assert!(msg.contains("model.1.conv.weight"), "{msg}");
    let err = Conv::load(&mut bf, "model.0", ConvSpec::new(3, 16, 3, 2))
        .err()
        .expect("wrong width must fail");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("model.0.conv.weight") && msg.contains("[32, 3, 3, 3]"),
        "{msg}"
    );
}

/// Reference max-pool: window clipped to the image (same as −∞ padding).
fn maxpool_ref(x: &[f32], h: usize, w: usize, k: usize) -> Vec<f32> {
    let p = k as isize / 2;
    let mut out = vec![0f32; h * w];
    for y in 0..h as isize {
        for xx in 0..w as isize {
            let mut m = f32::NEG_INFINITY;
            for dy in -p..=p {
                for dx in -p..=p {
                    let (yy, xq) = (y + dy, xx + dx);
                    if yy >= 0 && yy < h as isize && xq >= 0 && xq < w as isize {
                        m = m.max(x[(yy * w as isize + xq) as usize]);
                    }
                }
            }
            out[(y * w as isize + xx) as usize] = m;
        }
    }
    out
}

#[test]
fn max_pool_pads_with_negative_infinity() {
    // All-negative input: zero padding would put 0 on the border, −∞ padding never wins.
    let (h, w) = (6, 7);
    let x = rand_tensor(&[1, 2, h, w], 4, -5.0, -1.0);
    let y = pool::max_pool_same(&x, 5).unwrap();
    assert_eq!(y.dims(), &[1, 2, h, w]);
    let xv: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
    let yv: Vec<f32> = y.flatten_all().unwrap().to_vec1().unwrap();
    for c in 0..2 {
        let want = maxpool_ref(&xv[c * h * w..(c + 1) * h * w], h, w, 5);
        assert_eq!(&yv[c * h * w..(c + 1) * h * w], &want[..]);
    }
    assert!(
        yv.iter().all(|v| *v < -1.0 + 1e-6),
        "border picked up padding"
    );
    // Same as candle's max_pool2d over the −∞-padded tensor.
    let xp = pool::pad_neg_inf(&x, 2).unwrap();
    let c = xp.max_pool2d_with_stride((5, 5), (1, 1)).unwrap();
    assert_eq!(common::max_abs(&c, &y), 0.0);
}

#[test]
fn avg_pool_and_upsample_match_reference() {
    let x = rand_tensor(&[2, 3, 5, 6], 5, -1.0, 1.0);
    let a = pool::avg_pool_2x2_s1(&x, false).unwrap();
    let b = pool::avg_pool_2x2_s1(&x, true).unwrap();
    assert_eq!(a.dims(), &[2, 3, 4, 5]);
    let xv: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
    let bv: Vec<f32> = b.flatten_all().unwrap().to_vec1().unwrap();
    // Hand check at (n=1, c=2, y=3, x=4).
    let at = |y: usize, xx: usize| xv[((3 + 2) * 5 + y) * 6 + xx];
    let want = (at(3, 4) + at(3, 5) + at(4, 4) + at(4, 5)) / 4.0;
    assert!((bv[((3 + 2) * 4 + 3) * 5 + 4] - want).abs() < 1e-6);
    assert!(common::max_abs(&a, &b) < 1e-6);

    let u = pool::upsample_nearest_2x(&x).unwrap();
    let c = x.upsample_nearest2d(10, 12).unwrap();
    assert_eq!(u.dims(), &[2, 3, 10, 12]);
    assert_eq!(common::max_abs(&u, &c), 0.0);
}

#[test]
fn anchors_are_cell_centres_row_major() {
    let (pts, st) = head::make_anchors(&[(2, 3), (1, 2)], &[8, 16], &Device::Cpu).unwrap();
    assert_eq!(pts.dims(), &[8, 2]);
    let p: Vec<Vec<f32>> = pts.to_vec2().unwrap();
    assert_eq!(p[0], vec![0.5, 0.5]);
    assert_eq!(p[1], vec![1.5, 0.5]);
    assert_eq!(p[3], vec![0.5, 1.5]);
    assert_eq!(p[5], vec![2.5, 1.5]);
    assert_eq!(p[7], vec![1.5, 0.5]);
    let s: Vec<Vec<f32>> = st.to_vec2().unwrap();
    assert_eq!(s[5][0], 8.0);
    assert_eq!(s[6][0], 16.0);
}

#[test]
fn dfl_decode_of_p5_matches_oracle() {
    let p = common::reference("forward_horses.safetensors");
    let t = candle_core::safetensors::load(&p, &Device::Cpu).unwrap();
    let raw = &t["head_main_p5"];
    assert_eq!(raw.dims(), &[1, 144, 14, 20]);
    let y = head::decode(std::slice::from_ref(raw), &[32]).unwrap();
    assert_eq!(y.dims(), &[1, 84, 280]);
    assert_eq!(y.dtype(), DType::F32);
    let y_main = &t["y_main"];
    let want = y_main.narrow(2, 5880 - 280, 280).unwrap();
    let eb = common::max_abs(&y.narrow(1, 0, 4).unwrap(), &want.narrow(1, 0, 4).unwrap());
    let es = common::max_abs(
        &y.narrow(1, 4, 80).unwrap(),
        &want.narrow(1, 4, 80).unwrap(),
    );
    println!("P5 decode: box max abs err {eb:.2e} px, score max abs err {es:.2e}");
    // ~1e-4 px: 2 f32 ulps at 512..640 px (the oracle notes 1.1e-4 for its own check).
    assert!(eb <= 2e-4, "box error {eb}");
    assert!(es <= 1e-6, "score error {es}");
}

#[test]
fn models_are_send_and_sync() {
    // Compile-time check: a detector service shares one model across threads.
    fn ok<T: Send + Sync>() {}
    ok::<yolo9::model::YoloV9>();
    ok::<yolo9::model::YoloV9Train>();
}

/// The CPU inference convolution (`model::cpu_conv`) gives candle's conv2d result (to f32
/// rounding) for the shapes of YOLOv9: 3×3 stride 1 and 2 with padding 1, 1×1, 1×1 with stride,
/// odd sizes, batch > 1, a 5×5 kernel, a kernel wider than the image, no padding with stride
/// 2, and padding so wide that border outputs see no pixel at all.
#[test]
fn cpu_inference_conv_equals_candle_conv2d() {
    let rand = |shape: &[usize], seed| {
        (common::uniform(shape, seed) * 0.5)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    };
    for (xs, ws, p, s) in [
        ([2, 5, 9, 7], [6, 5, 3, 3], 1, 1),
        ([1, 3, 16, 16], [8, 3, 3, 3], 1, 2),
        ([3, 8, 6, 5], [4, 8, 1, 1], 0, 1),
        ([1, 8, 6, 6], [4, 8, 1, 1], 0, 2),
        ([1, 4, 5, 5], [2, 4, 5, 5], 2, 1),
        ([1, 3, 3, 3], [2, 3, 5, 5], 2, 1),
        ([1, 2, 9, 9], [3, 2, 3, 3], 0, 2),
        ([2, 3, 7, 8], [4, 3, 3, 3], 3, 2),
        ([1, 2, 4, 6], [2, 2, 3, 3], 4, 1),
    ] {
        let x = rand(&xs, 1);
        let w = rand(&ws, 2);
        let want = x.conv2d(&w, p, s, 1, 1).unwrap();
        let got = yolo9::internals::model::cpu_conv::conv2d(&x, &w, p, s).unwrap();
        let d = common::max_abs(&got, &want);
        assert!(d < 1e-5, "{xs:?} * {ws:?} p{p} s{s}: max diff {d}");
    }
}

/// The folded-BN inference epilogue `act(x + b)` (`yolo9::internals::model::bias_act`) against candle's
/// broadcast add and SiLU, with a hand-computed element; a bias of the wrong length is an error.
#[test]
fn bias_act_equals_broadcast_add_then_silu() {
    use yolo9::internals::model::bias_act::bias_act;
    let x = rand_tensor(&[2, 3, 4, 5], 11, -4.0, 4.0);
    let b = Tensor::new(&[0.5f32, -1.0, 2.0], &Device::Cpu).unwrap();
    let want_lin = x.broadcast_add(&b.reshape((1, 3, 1, 1)).unwrap()).unwrap();
    let want = want_lin.silu().unwrap();
    let got = bias_act(&x, &b, true).unwrap();
    assert!(common::max_abs(&got, &want) < 1e-6);
    let lin = bias_act(&x, &b, false).unwrap();
    assert_eq!(common::max_abs(&lin, &want_lin), 0.0);
    // Element (1, 2, 3, 4): z = x + 2, silu(z) = z / (1 + e^-z).
    let at = |t: &Tensor| t.i((1, 2, 3, 4)).unwrap().to_scalar::<f32>().unwrap();
    let z = at(&x) + 2.0;
    assert!((at(&got) - z / (1.0 + (-z).exp())).abs() < 1e-6);
    // Non-contiguous input is made contiguous first.
    let xt = x.transpose(2, 3).unwrap();
    let want_t = xt
        .broadcast_add(&b.reshape((1, 3, 1, 1)).unwrap())
        .unwrap()
        .silu()
        .unwrap();
    assert!(common::max_abs(&bias_act(&xt, &b, true).unwrap(), &want_t) < 1e-6);
    let bad = Tensor::new(&[1f32, 2.0], &Device::Cpu).unwrap();
    assert!(bias_act(&x, &bad, true).is_err());
}
