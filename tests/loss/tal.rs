//! Loss building blocks against hand-computed values (derived on paper and checked with
//! python3 + numpy in float64), and the dual TAL loss on small synthetic head outputs.

use candle_core::{DType, Device, Tensor, Var};
use yolo9::boxes::iou_eps as box_iou;
use yolo9::internals::loss::iou::{atan_with_grad, ciou_tensor, ciou_xyxy};
use yolo9::internals::loss::tal_loss::{
    bce_with_logits, dfl_expectation, dfl_loss, targets_tensor, DualTalLoss, REG_MAX,
};
use yolo9::internals::loss::targets::bbox2dist;
use yolo9::internals::loss::Anchors;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

/// Deterministic pseudo-random numbers in [lo, hi).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, lo: f32, hi: f32) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let u = ((self.0 >> 40) as f32) / ((1u64 << 24) as f32);
        lo + (hi - lo) * u
    }
}

/// CIoU values: `[0,0,4,2]` vs `[1,1,5,4]` by hand: inter 3, union 17, iou 3/17; enclosing box
/// 5x4 so c2 = 41; centres (2,1), (3,2.5) so rho2 = 3.25; v = 4/pi^2 (atan(4/3) - atan 2)^2 =
/// 0.013110, alpha = 0.015669; CIoU = 0.0969969. The others come from the same formula in numpy.
#[test]
fn ciou_hand_values_plain_and_tensor() {
    let cases: [([f32; 4], [f32; 4], f64); 4] = [
        ([0.0, 0.0, 4.0, 2.0], [1.0, 1.0, 5.0, 4.0], 0.0969968593),
        (
            [10.0, 10.0, 20.0, 30.0],
            [12.0, 8.0, 25.0, 28.0],
            0.43272832,
        ),
        ([0.0, 0.0, 1.0, 1.0], [3.0, 3.0, 5.0, 4.0], -0.519982143),
        ([2.0, 2.0, 6.0, 6.0], [2.0, 2.0, 6.0, 6.0], 0.999999944),
    ];
    for (a, b, want) in cases {
        let got = ciou_xyxy(a, b) as f64;
        assert!(
            close(got, want, 1e-6),
            "ciou({a:?}, {b:?}) = {got}, want {want}"
        );
        let got_sym = ciou_xyxy(b, a) as f64;
        assert!(close(got_sym, want, 1e-6), "ciou is symmetric");
    }
    assert!(close(
        box_iou([0.0, 0.0, 4.0, 2.0], [1.0, 1.0, 5.0, 4.0], 0.0) as f64,
        3.0 / 17.0,
        1e-7
    ));
    assert!(
        box_iou([1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], 0.0).is_nan(),
        "torchvision 0/0"
    );
    let dev = Device::Cpu;
    let b1: Vec<f32> = cases.iter().flat_map(|c| c.0).collect();
    let b2: Vec<f32> = cases.iter().flat_map(|c| c.1).collect();
    let t = ciou_tensor(
        &Tensor::from_vec(b1, (4, 4), &dev).unwrap(),
        &Tensor::from_vec(b2, (4, 4), &dev).unwrap(),
    )
    .unwrap();
    let v: Vec<f32> = t.to_vec1().unwrap();
    for (i, c) in cases.iter().enumerate() {
        assert!(
            close(v[i] as f64, c.2, 1e-6),
            "tensor ciou {i}: {} vs {}",
            v[i],
            c.2
        );
        assert_eq!(
            v[i],
            ciou_xyxy(c.0, c.1),
            "tensor and plain CIoU agree bit for bit"
        );
    }
}

/// Gradient of the CIoU (alpha held constant) against central finite differences in f64.
#[test]
fn ciou_tensor_gradient_matches_finite_differences() {
    let dev = Device::Cpu;
    let target = [12.0f64, 8.0, 25.0, 28.0];
    let pred = [10.0f64, 10.0, 20.0, 30.0];
    let var = Var::from_vec(pred.to_vec(), (1, 4), &dev).unwrap();
    let tgt = Tensor::from_vec(target.to_vec(), (1, 4), &dev).unwrap();
    let out = ciou_tensor(var.as_tensor(), &tgt)
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = out.backward().unwrap();
    let g: Vec<f64> = grads
        .get(var.as_tensor())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    // f(x) with alpha frozen at its value for `pred`, computed independently in f64.
    let f = |p: [f64; 4], alpha: Option<f64>| -> (f64, f64) {
        let eps = 1e-7;
        let (w1, h1) = (p[2] - p[0], p[3] - p[1] + eps);
        let (w2, h2) = (target[2] - target[0], target[3] - target[1] + eps);
        let inter = (p[2].min(target[2]) - p[0].max(target[0])).max(0.0)
            * (p[3].min(target[3]) - p[1].max(target[1])).max(0.0);
        let iou = inter / (w1 * h1 + w2 * h2 - inter + eps);
        let cw = p[2].max(target[2]) - p[0].min(target[0]);
        let ch = p[3].max(target[3]) - p[1].min(target[1]);
        let c2 = cw * cw + ch * ch + eps;
        let rho2 = ((target[0] + target[2] - p[0] - p[2]).powi(2)
            + (target[1] + target[3] - p[1] - p[3]).powi(2))
            / 4.0;
        let v = 4.0 / std::f64::consts::PI.powi(2) * ((w2 / h2).atan() - (w1 / h1).atan()).powi(2);
        let a = alpha.unwrap_or(v / (v - iou + 1.0 + eps));
        (iou - (rho2 / c2 + v * a), a)
    };
    let alpha = f(pred, None).1;
    for i in 0..4 {
        let h = 1e-5;
        let mut p1 = pred;
        let mut p2 = pred;
        p1[i] += h;
        p2[i] -= h;
        let fd = (f(p1, Some(alpha)).0 - f(p2, Some(alpha)).0) / (2.0 * h);
        assert!(
            (g[i] - fd).abs() <= 1e-7 + 1e-5 * fd.abs(),
            "d ciou / d x{i}: {} vs fd {fd}",
            g[i]
        );
    }
    // atan itself.
    let r = Var::from_vec(vec![0.3f64, 2.0], 2, &dev).unwrap();
    let y = atan_with_grad(r.as_tensor()).unwrap();
    let yv: Vec<f64> = y.to_vec1().unwrap();
    assert!(close(yv[0], 0.3f64.atan(), 1e-15) && close(yv[1], 2f64.atan(), 1e-15));
    let gr: Vec<f64> = y
        .sum_all()
        .unwrap()
        .backward()
        .unwrap()
        .get(r.as_tensor())
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(close(gr[0], 1.0 / 1.09, 1e-14) && close(gr[1], 0.2, 1e-14));
}

/// DFL by hand: for logits `lg` and target t with l = floor(t),
/// `CE(l) * (l + 1 - t) + CE(l + 1) * (t - l)`; numpy f64 gives 2.31806476 (t = 2.3),
/// 3.29306476 (t = 0), 0.823064758 (t = 14.99); the mean of the 4 sides [2.3, 0, 14.99, 2.3] is
/// 2.18806476. The softmax expectation of `lg` is 9.52490498 bins.
#[test]
fn dfl_hand_values() {
    let lg: [f32; 16] = [
        0.5, -1.0, 2.0, 0.25, 1.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -2.0, 0.0, 0.0, 3.0,
    ];
    assert!(close(dfl_expectation(&lg) as f64, 9.52490498, 1e-6));
    let dev = Device::Cpu;
    let logits = Tensor::from_vec([lg; 4].concat(), (1, 4, REG_MAX), &dev).unwrap();
    let v: Vec<f32> = dfl_loss(&logits, &[[2.3, 0.0, 14.99, 2.3]])
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(close(v[0] as f64, 2.18806476, 1e-6), "dfl = {}", v[0]);
    let one_side = |t: f32| -> f64 {
        let v: Vec<f32> = dfl_loss(&logits, &[[t, t, t, t]])
            .unwrap()
            .to_vec1()
            .unwrap();
        v[0] as f64
    };
    assert!(close(one_side(2.3), 2.31806476, 1e-6));
    assert!(close(one_side(0.0), 3.29306476, 1e-6));
    assert!(close(one_side(14.99), 0.823064758, 1e-5));
    assert!(
        dfl_loss(&logits, &[[15.0, 0.0, 0.0, 0.0]]).is_err(),
        "target 15 has no right bin"
    );
    assert!(dfl_loss(&logits, &[[-0.1, 0.0, 0.0, 0.0]]).is_err());
    // bbox2dist clamps to [0, 14.99].
    assert_eq!(
        bbox2dist([5.5, 5.5], [0.5, 6.0, 30.0, 7.5]),
        [5.0, 0.0, 14.99, 2.0]
    );
}

/// BCE-with-logits by hand (numpy `max(x,0) - x t + log1p(exp(-|x|))`), including the extremes
/// where a naive `log(1 + exp)` loses everything, and its gradient `sigmoid(x) - t`.
#[test]
fn bce_hand_values_and_gradient() {
    let dev = Device::Cpu;
    let xs = [-30.0f32, -3.0, 0.0, 2.5, 40.0];
    let ts = [0.0f32, 1.0, 0.5, 0.25, 1.0];
    let want = [
        9.35762296884e-14,
        3.04858735157,
        std::f64::consts::LN_2,
        1.95388973429,
        4.24835425529e-18,
    ];
    let want_grad = [9.35762297e-14, -0.952574127, 0.0, 0.67414182, 0.0];
    let x = Var::from_vec(xs.to_vec(), 5, &dev).unwrap();
    let t = Tensor::from_vec(ts.to_vec(), 5, &dev).unwrap();
    let l = bce_with_logits(x.as_tensor(), &t).unwrap();
    let lv: Vec<f32> = l.to_vec1().unwrap();
    for i in 0..5 {
        assert!(
            (lv[i] as f64 - want[i]).abs() <= 1e-6 * want[i].abs() + 1e-30,
            "bce({}, {}) = {} want {}",
            xs[i],
            ts[i],
            lv[i],
            want[i]
        );
    }
    let g: Vec<f32> = l
        .sum_all()
        .unwrap()
        .backward()
        .unwrap()
        .get(x.as_tensor())
        .unwrap()
        .to_vec1()
        .unwrap();
    for i in 0..5 {
        if xs[i] == 0.0 {
            continue; // relu'(0) / sign(0) convention; sigmoid(0) - t is not reproduced at exactly 0
        }
        assert!(
            (g[i] as f64 - want_grad[i]).abs() <= 1e-6 * want_grad[i].abs() + 1e-12,
            "grad at {}: {} want {}",
            xs[i],
            g[i],
            want_grad[i]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The dual loss on synthetic head outputs: image 64 x 96 (h x w), nc = 3, strides 8/16/32.

const NC: usize = 3;
const HW: (usize, usize) = (64, 96);
const LEVELS: [(usize, usize); 3] = [(8, 12), (4, 6), (2, 3)];
const STRIDES: [u32; 3] = [8, 16, 32];

fn head(bs: usize, seed: u64, dtype: DType) -> (Vec<Var>, Vec<Tensor>) {
    let mut rng = Lcg(seed);
    let no = 64 + NC;
    let mut vars = Vec::new();
    for &(h, w) in &LEVELS {
        let mut v = Vec::with_capacity(bs * no * h * w);
        for _b in 0..bs {
            for c in 0..no {
                for _ in 0..h * w {
                    v.push(if c < 64 {
                        rng.next(-2.0, 2.0)
                    } else {
                        rng.next(-6.0, 2.0)
                    });
                }
            }
        }
        let t = Tensor::from_vec(v, (bs, no, h, w), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        vars.push(Var::from_tensor(&t).unwrap());
    }
    let ts = vars.iter().map(|v| v.as_tensor().clone()).collect();
    (vars, ts)
}

fn sample_targets() -> Vec<[f32; 6]> {
    vec![
        [0.0, 1.0, 0.3, 0.4, 0.35, 0.5],
        [0.0, 2.0, 0.7, 0.6, 0.3, 0.6],
        [1.0, 0.0, 0.5, 0.5, 0.8, 0.9],
        [0.0, 0.0, 0.45, 0.45, 0.2, 0.3],
    ]
}

fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// Host replica of one branch (f64) from the assignment the loss reports: checks the gather
/// indices, decoding, weights and normalisation of the tensor implementation.
fn host_branch(levels: &[Tensor], asg: &yolo9::internals::loss::Assignment) -> [f64; 3] {
    let bs = levels[0].dims()[0];
    let no = 64 + NC;
    let anchors = Anchors::new(&LEVELS, &STRIDES).unwrap();
    let na = anchors.len();
    // (B, no, A) on the host.
    let mut host = vec![0f32; bs * no * na];
    let mut off = 0;
    for l in levels {
        let (_, _, h, w) = l.dims4().unwrap();
        let v: Vec<f32> = l
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for b in 0..bs {
            for c in 0..no {
                for p in 0..h * w {
                    host[(b * no + c) * na + off + p] = v[(b * no + c) * h * w + p];
                }
            }
        }
        off += h * w;
    }
    let tss = (asg.target_score.iter().map(|&v| v as f64).sum::<f64>()).max(1.0);
    let mut cls = 0.0;
    for b in 0..bs {
        for c in 0..NC {
            for a in 0..na {
                let x = host[(b * no + 64 + c) * na + a] as f64;
                let i = b * na + a;
                let t = if asg.fg_mask[i] && asg.target_labels[i] as usize == c {
                    asg.target_score[i] as f64
                } else {
                    0.0
                };
                cls += softplus(x) - x * t;
            }
        }
    }
    let (mut bx, mut dfl) = (0.0, 0.0);
    for i in asg.fg_indices() {
        let (b, a) = (i / na, i % na);
        let st = anchors.strides[a];
        let [ax, ay] = anchors.points[a];
        let mut d = [0f32; 4];
        let mut side_ce = 0.0;
        let tb = asg.target_bboxes[i].map(|v| v / st);
        let tl = bbox2dist([ax, ay], tb);
        for s in 0..4 {
            let mut bins = [0f32; 16];
            for k in 0..16 {
                bins[k] = host[(b * no + s * 16 + k) * na + a];
            }
            d[s] = dfl_expectation(&bins);
            let m = bins.iter().fold(f32::MIN, |x, &y| x.max(y)) as f64;
            let lse = m + bins.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
            let t = tl[s] as f64;
            let l = t.floor() as usize;
            side_ce += (lse - bins[l] as f64) * (l as f64 + 1.0 - t)
                + (lse - bins[l + 1] as f64) * (t - l as f64);
        }
        let pb = [ax - d[0], ay - d[1], ax + d[2], ay + d[3]];
        let w = asg.target_score[i] as f64;
        bx += (1.0 - ciou_xyxy(pb, tb) as f64) * w;
        dfl += side_ce / 4.0 * w;
    }
    [bx / tss, cls / tss, dfl / tss]
}

#[test]
fn dual_loss_matches_host_replica_and_official_combination() {
    let bs = 2;
    let (_va, aux) = head(bs, 1, DType::F32);
    let (_vm, main) = head(bs, 2, DType::F32);
    let targets = targets_tensor(&sample_targets(), &Device::Cpu).unwrap();
    let loss = DualTalLoss::new(NC, &STRIDES).unwrap();
    let out = loss.compute(&aux, &main, &targets, HW).unwrap();

    let n_aux = out
        .aux
        .assignment
        .as_ref()
        .expect("CPU assignment")
        .fg_indices()
        .len();
    let n_main = out
        .main
        .assignment
        .as_ref()
        .expect("CPU assignment")
        .fg_indices()
        .len();
    println!(
        "fg anchors aux {n_aux}, main {n_main}; items {:?}",
        out.items
    );
    assert!(
        n_aux >= 10 && n_main >= 10,
        "the case must have foreground anchors"
    );

    for (name, levels, br) in [("aux", &aux, &out.aux), ("main", &main, &out.main)] {
        let want = host_branch(levels, br.assignment.as_ref().expect("CPU assignment"));
        let got = [br.box_loss as f64, br.cls_loss as f64, br.dfl_loss as f64];
        for k in 0..3 {
            assert!(
                close(got[k], want[k], 2e-6),
                "{name} item {k}: {} vs host {}",
                got[k],
                want[k]
            );
        }
    }
    let g = [7.5f64, 0.5, 1.5];
    let a = &out.aux;
    let m = &out.main;
    let items = [
        (0.25 * a.box_loss as f64 + m.box_loss as f64) * g[0],
        (0.25 * a.cls_loss as f64 + m.cls_loss as f64) * g[1],
        (0.25 * a.dfl_loss as f64 + m.dfl_loss as f64) * g[2],
    ];
    for (got, want) in out.items.iter().zip(&items) {
        assert!(close(*got as f64, *want, 1e-6));
    }
    let total: f32 = out.total.to_scalar().unwrap();
    assert!(close(
        total as f64,
        items.iter().sum::<f64>() * bs as f64,
        1e-6
    ));
}

/// d total / d class logit = batch * 0.5 * branch_weight * (sigmoid(x) - t) / S.
#[test]
fn dual_loss_class_gradient_is_sigmoid_minus_target() {
    let bs = 2;
    let (va, aux) = head(bs, 3, DType::F32);
    let (vm, main) = head(bs, 4, DType::F32);
    let targets = targets_tensor(&sample_targets(), &Device::Cpu).unwrap();
    let loss = DualTalLoss::new(NC, &STRIDES).unwrap();
    let out = loss.compute(&aux, &main, &targets, HW).unwrap();
    let grads = out.total.backward().unwrap();
    let na = LEVELS.iter().map(|(h, w)| h * w).sum::<usize>();
    for (vars, br, bw) in [(&va, &out.aux, 0.25f64), (&vm, &out.main, 1.0)] {
        let mut off = 0;
        let mut max_err = 0f64;
        for (lvl, v) in vars.iter().enumerate() {
            let (h, w) = LEVELS[lvl];
            let x: Vec<f32> = v.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            let g: Vec<f32> = grads
                .get(v.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            for b in 0..bs {
                for c in 0..NC {
                    for p in 0..h * w {
                        let j = (b * (64 + NC) + 64 + c) * h * w + p;
                        let i = b * na + off + p;
                        let asg = br.assignment.as_ref().expect("CPU assignment");
                        let t = if asg.fg_mask[i] && asg.target_labels[i] as usize == c {
                            asg.target_score[i] as f64
                        } else {
                            0.0
                        };
                        let sig = 1.0 / (1.0 + (-(x[j] as f64)).exp());
                        let want = bs as f64 * 0.5 * bw * (sig - t) / br.target_scores_sum as f64;
                        max_err = max_err.max((g[j] as f64 - want).abs() / want.abs().max(1e-3));
                    }
                }
            }
            off += h * w;
        }
        assert!(max_err < 1e-5, "class gradient relative error {max_err}");
    }
}

/// No targets: the loss is finite, box/dfl are 0, cls is the BCE against zeros (S = 1), and
/// gradients are finite.
#[test]
fn dual_loss_without_targets_is_finite() {
    let bs = 2;
    let (va, aux) = head(bs, 5, DType::F32);
    let (_vm, main) = head(bs, 6, DType::F32);
    let empty = Tensor::zeros((0, 6), DType::F32, &Device::Cpu).unwrap();
    let out = DualTalLoss::new(NC, &STRIDES)
        .unwrap()
        .compute(&aux, &main, &empty, HW)
        .unwrap();
    assert_eq!(out.items[0], 0.0);
    assert_eq!(out.items[2], 0.0);
    let sum_sp = |levels: &[Tensor]| -> f64 {
        levels
            .iter()
            .map(|l| {
                let v: Vec<f32> = l
                    .narrow(1, 64, NC)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                v.iter().map(|&x| softplus(x as f64)).sum::<f64>()
            })
            .sum()
    };
    let want = 0.5 * (0.25 * sum_sp(&aux) + sum_sp(&main));
    assert!(
        close(out.items[1] as f64, want, 1e-6),
        "{} vs {want}",
        out.items[1]
    );
    let total: f32 = out.total.to_scalar().unwrap();
    assert!(total.is_finite() && close(total as f64, want * bs as f64, 1e-6));
    let grads = out.total.backward().unwrap();
    let g: Vec<f32> = grads
        .get(va[0].as_tensor())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(g.iter().all(|v| v.is_finite()));
    // Images without targets inside a batch with targets are fine too.
    let one = targets_tensor(&[[1.0, 2.0, 0.5, 0.5, 0.5, 0.5]], &Device::Cpu).unwrap();
    let out = DualTalLoss::new(NC, &STRIDES)
        .unwrap()
        .compute(&aux, &main, &one, HW)
        .unwrap();
    assert!(out.items.iter().all(|v| v.is_finite()) && out.items[0] > 0.0);
}

/// f64 (or f16) head outputs are accepted: the loss is computed in f32 and the gradient flows
/// back to the original dtype.
#[test]
fn dual_loss_accepts_other_float_dtypes() {
    let (va, aux) = head(1, 7, DType::F64);
    let (_vm, main) = head(1, 8, DType::F64);
    let targets = targets_tensor(&[[0.0, 1.0, 0.5, 0.5, 0.5, 0.5]], &Device::Cpu).unwrap();
    let out = DualTalLoss::new(NC, &STRIDES)
        .unwrap()
        .compute(&aux, &main, &targets, HW)
        .unwrap();
    let g = out.total.backward().unwrap();
    assert_eq!(g.get(va[0].as_tensor()).unwrap().dtype(), DType::F64);
}

#[test]
fn dual_loss_bad_inputs_are_errors() {
    let (_va, aux) = head(2, 9, DType::F32);
    let (_vm, main) = head(2, 10, DType::F32);
    let dev = Device::Cpu;
    let ok_t = targets_tensor(&sample_targets(), &dev).unwrap();
    let loss = DualTalLoss::new(NC, &STRIDES).unwrap();
    let err = |r: anyhow::Result<yolo9::internals::loss::LossOutput>| {
        r.expect_err("must fail").to_string()
    };

    // Wrong class count.
    let e = err(DualTalLoss::new(4, &STRIDES)
        .unwrap()
        .compute(&aux, &main, &ok_t, HW));
    assert!(e.contains("channels"), "{e}");
    // Wrong number of levels.
    let e = err(loss.compute(&aux[..2], &main, &ok_t, HW));
    assert!(e.contains("levels"), "{e}");
    // Image size inconsistent with the levels.
    let e = err(loss.compute(&aux, &main, &ok_t, (96, 64)));
    assert!(e.contains("img_hw"), "{e}");
    // Targets: image index >= batch, bad class, NaN, wrong width.
    for rows in [
        vec![[2.0f32, 0.0, 0.5, 0.5, 0.1, 0.1]],
        vec![[0.0f32, 3.0, 0.5, 0.5, 0.1, 0.1]],
        vec![[0.0f32, 0.0, f32::NAN, 0.5, 0.1, 0.1]],
    ] {
        let t = targets_tensor(&rows, &dev).unwrap();
        assert!(loss.compute(&aux, &main, &t, HW).is_err(), "{rows:?}");
    }
    let t5 = Tensor::zeros((3, 5), DType::F32, &dev).unwrap();
    assert!(err(loss.compute(&aux, &main, &t5, HW)).contains("(N, 6)"));
    // A non-finite head output.
    let mut bad = aux.clone();
    bad[1] = (bad[1].clone() * f64::NAN).unwrap();
    let e = err(loss.compute(&bad, &main, &ok_t, HW));
    assert!(e.contains("non-finite"), "{e}");
    // Constructor.
    assert!(DualTalLoss::new(0, &STRIDES).is_err());
    assert!(DualTalLoss::new(3, &[8, 0, 32]).is_err());
}

/// The fused loss terms (`yolo9::internals::loss::terms`, the default) against the composite of candle ops
/// differentiated by candle's autograd: the same assignment, loss items within 1e-6 and every
/// head-output gradient (box bins, class logits, both branches) within 1e-4 of the largest.
#[test]
fn fused_loss_terms_equal_the_composite_and_its_autograd() {
    let bs = 2;
    let targets = targets_tensor(&sample_targets(), &Device::Cpu).unwrap();
    let run = |fused: bool| {
        let (va, aux) = head(bs, 11, DType::F32);
        let (vm, main) = head(bs, 12, DType::F32);
        let loss = DualTalLoss::new(NC, &STRIDES)
            .unwrap()
            .with_fused_terms(fused);
        let out = loss.compute(&aux, &main, &targets, HW).unwrap();
        let g = out.total.backward().unwrap();
        let grads: Vec<Vec<f32>> = va
            .iter()
            .chain(&vm)
            .map(|v| {
                g.get(v.as_tensor())
                    .expect("gradient")
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            })
            .collect();
        (
            out.items,
            out.aux
                .assignment
                .as_ref()
                .expect("CPU assignment")
                .fg_indices(),
            grads,
        )
    };
    let (items_f, fg_f, g_f) = run(true);
    let (items_c, fg_c, g_c) = run(false);
    assert_eq!(fg_f, fg_c, "assignments differ");
    assert!(fg_f.len() >= 10, "the case must have foreground anchors");
    for (a, b) in items_f.iter().zip(&items_c) {
        assert!(
            close(*a as f64, *b as f64, 1e-6),
            "loss items {items_f:?} vs {items_c:?}"
        );
    }
    let mut worst = 0f32;
    for (a, b) in g_f.iter().zip(&g_c) {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((x - y).abs() / scale);
        }
    }
    println!("fused vs composite: items {items_f:?} vs {items_c:?}; worst gradient {worst:.2e}");
    assert!(
        worst < 1e-4,
        "worst head-output gradient difference {worst}"
    );
}
