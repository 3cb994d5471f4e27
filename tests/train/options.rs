//! The training options users reach for (issue 15): `--optimizer Adam|AdamW` against the
//! formula, `--label-smoothing` against hand-computed BCE values, `--cache ram` against the
//! uncached loader, fine-tuning from weights of another class count, and tiny CPU runs with
//! `--single-cls --freeze --optimizer AdamW --cache ram --label-smoothing` (frozen parameters
//! unchanged bit for bit, Adam state resumed) and with `--time` (stops after the first epoch,
//! saved).

use crate::common;

use candle_core::{DType, Device, Tensor, Var};
use std::sync::Arc;
use yolo9::internals::data::loader::{DecodeFn, Loader, LoaderConfig, TrainItem};
use yolo9::internals::loss::tal_loss::{targets_tensor, DualTalLoss, REG_MAX};
use yolo9::internals::model::yolov9::{training_arch, YoloV9Train};
use yolo9::internals::train::cache::{cache_bytes, check_fits, RamCache};
use yolo9::internals::train::checkpoint::load_state;
use yolo9::internals::train::optimizer::{Optimizer, OptimizerKind, Sgd, ADAM_BETA2, ADAM_EPS};
use yolo9::model::weights::Weights;
use yolo9::train::options::{freeze_prefixes, ImageCache};
use yolo9::train::trainer::{train_with, StopFlag, TrainEvent, TrainObserver};

fn close(a: &[f32], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((*x as f64 - y).abs() < tol, "{a:?} vs {b:?}");
    }
}

/// One Adam/AdamW step of PyTorch's formula in f64 (`m`, `v` the moments, `t` the new step).
#[allow(clippy::too_many_arguments)]
fn adam_ref(
    w: &mut [f64],
    g: &[f64],
    m: &mut [f64],
    v: &mut [f64],
    t: i32,
    (lr, b1, wd): (f64, f64, f64),
    decoupled: bool,
) {
    for i in 0..w.len() {
        let gi = if decoupled {
            w[i] *= 1.0 - lr * wd;
            g[i]
        } else {
            g[i] + wd * w[i]
        };
        m[i] = b1 * m[i] + (1.0 - b1) * gi;
        v[i] = ADAM_BETA2 * v[i] + (1.0 - ADAM_BETA2) * gi * gi;
        let bc1 = 1.0 - b1.powi(t);
        let bc2 = 1.0 - ADAM_BETA2.powi(t);
        w[i] -= lr / bc1 * m[i] / (v[i].sqrt() / bc2.sqrt() + ADAM_EPS);
    }
}

/// Two Adam and two AdamW steps on a decayed conv weight and an undecayed bias, lr 0.1,
/// betas (0.937, 0.999), weight decay 0.1. The first step is `lr · sign(g')` by hand (the bias
/// corrections make `m̂ = g'`, `v̂ = g'²`): Adam's L2 decay gives `g' = g + 0.1·w`, AdamW shrinks
/// the weight by `1 − lr·wd` first. The second step follows the formula in f64.
#[test]
fn adam_and_adamw_steps_follow_the_formula() -> anyhow::Result<()> {
    let dev = Device::Cpu;
    let (lr, b1, wd) = (0.1, 0.937, 0.1);
    let grads = [[0.5f32, 0.5], [0.5, -1.0]];
    for kind in [OptimizerKind::Adam, OptimizerKind::AdamW] {
        let w = Var::from_vec(vec![1f32, -2.0], 2, &dev)?;
        let b = Var::from_vec(vec![1f32, -2.0], 2, &dev)?;
        let mut opt = Optimizer::with_kind(
            kind,
            vec![
                ("m.conv.weight".into(), w.clone()),
                ("m.conv.bias".into(), b.clone()),
            ],
            lr,
            b1,
            wd,
        );
        assert_eq!(opt.kind(), kind);
        let (mut rw, mut rb) = (vec![1f64, -2.0], vec![1f64, -2.0]);
        let (mut mw, mut vw, mut mb, mut vb) =
            (vec![0.0; 2], vec![0.0; 2], vec![0.0; 2], vec![0.0; 2]);
        let decoupled = kind == OptimizerKind::AdamW;
        for (t, g) in grads.iter().enumerate() {
            let c = Tensor::new(g, &dev)?;
            let loss = ((w.as_tensor() * &c)?.sum_all()? + (b.as_tensor() * &c)?.sum_all()?)?;
            opt.step(&loss.backward()?)?;
            let g64: Vec<f64> = g.iter().map(|&x| x as f64).collect();
            adam_ref(
                &mut rw,
                &g64,
                &mut mw,
                &mut vw,
                t as i32 + 1,
                (lr, b1, wd),
                decoupled,
            );
            adam_ref(
                &mut rb,
                &g64,
                &mut mb,
                &mut vb,
                t as i32 + 1,
                (lr, b1, 0.0),
                decoupled,
            );
            if t == 0 {
                let by_hand = match kind {
                    // g' = [0.5 + 0.1, 0.5 - 0.2] > 0: w - 0.1.
                    OptimizerKind::Adam => [0.9, -2.1],
                    // w·0.99 - 0.1.
                    _ => [0.89, -2.08],
                };
                close(&w.as_tensor().to_vec1::<f32>()?, &by_hand, 1e-6);
                close(&b.as_tensor().to_vec1::<f32>()?, &[0.9, -2.1], 1e-6);
            }
            close(&w.as_tensor().to_vec1::<f32>()?, &rw, 2e-6);
            close(&b.as_tensor().to_vec1::<f32>()?, &rb, 2e-6);
        }
        // The two kinds differ after two steps (decoupled vs L2 decay).
        eprintln!("{kind:?}: w = {:?}", w.as_tensor().to_vec1::<f32>()?);

        // State round trip: a fresh optimizer given the state continues bit for bit.
        let state = opt.state();
        assert_eq!(
            state.len(),
            6,
            "exp_avg, exp_avg_sq and step of two parameters"
        );
        let w2 = Var::from_tensor(&w.as_tensor().copy()?)?;
        let b2 = Var::from_tensor(&b.as_tensor().copy()?)?;
        let mut opt2 = Optimizer::with_kind(
            kind,
            vec![
                ("m.conv.weight".into(), w2.clone()),
                ("m.conv.bias".into(), b2.clone()),
            ],
            lr,
            b1,
            wd,
        );
        opt2.load_state(&state)?;
        let c = Tensor::new(&[0.25f32, 0.75], &dev)?;
        for (o, (wv, bv)) in [(&mut opt, (&w, &b)), (&mut opt2, (&w2, &b2))] {
            let loss = ((wv.as_tensor() * &c)?.sum_all()? + (bv.as_tensor() * &c)?.sum_all()?)?;
            o.step(&loss.backward()?)?;
        }
        assert_eq!(
            w.as_tensor().to_vec1::<f32>()?,
            w2.as_tensor().to_vec1::<f32>()?
        );
        assert_eq!(
            b.as_tensor().to_vec1::<f32>()?,
            b2.as_tensor().to_vec1::<f32>()?
        );

        // A state of the other kind is refused, naming both.
        let mut sgd = Sgd::new(vec![("m.conv.weight".into(), w.clone())], lr, b1, wd);
        let e = format!("{:#}", sgd.load_state(&state).unwrap_err());
        assert!(e.contains("Adam") && e.contains("SGD"), "{e}");
    }
    Ok(())
}

/// Head outputs of one branch: levels of a 64x64 input (8x8, 4x4, 2x2 cells), box channels 0,
/// every class logit `x`.
fn head(nc: usize, x: f32) -> Vec<Tensor> {
    [8usize, 4, 2]
        .iter()
        .map(|&s| {
            let boxes = Tensor::zeros((1, 4 * REG_MAX, s, s), DType::F32, &Device::Cpu).unwrap();
            let cls = Tensor::full(x, (1, nc, s, s), &Device::Cpu).unwrap();
            Tensor::cat(&[&boxes, &cls], 1).unwrap()
        })
        .collect()
}

fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// `--label-smoothing 0.1` (official `smooth_BCE`: targets 0.95 / 0.05): without any box every
/// target is 0 → 0.05 and `S = 1`, so each branch's class loss is
/// `84 anchors · 2 classes · BCE(x, 0.05)` with `BCE(x, t) = softplus(x) − x·t`, by hand. With a
/// box the class loss is `(1 − eps)·cls₀ + eps·Σ BCE(x, ½)/S` (BCE is linear in its target) and
/// the box and DFL items are unchanged. eps 0 is the unsmoothed loss exactly.
#[test]
fn label_smoothing_gives_the_smooth_bce_targets() -> anyhow::Result<()> {
    let nc = 2;
    let (xa, xm) = (0.3f32, -1.2f32);
    let (aux, main) = (head(nc, xa), head(nc, xm));
    let plain = DualTalLoss::new(nc, &[8, 16, 32])?;
    let smooth = DualTalLoss::new(nc, &[8, 16, 32])?.with_label_smoothing(0.1)?;
    assert!(DualTalLoss::new(nc, &[8, 16, 32])?
        .with_label_smoothing(1.0)
        .is_err());
    let none = targets_tensor(&[], &Device::Cpu)?;
    let out = smooth.compute(&aux, &main, &none, (64, 64))?;
    let n = 84.0 * nc as f64;
    let bce = |x: f64, t: f64| softplus(x) - x * t;
    let want = (0.25 * n * bce(xa as f64, 0.05) + n * bce(xm as f64, 0.05)) * 0.5;
    assert!(
        (out.items[1] as f64 - want).abs() < 1e-4 * want,
        "cls {} vs {want}",
        out.items[1]
    );
    assert_eq!((out.items[0], out.items[2]), (0.0, 0.0));

    // With a box: the linear form, the other items untouched; eps 0 is the plain loss exactly.
    let t = targets_tensor(&[[0.0, 1.0, 0.5, 0.5, 0.4, 0.3]], &Device::Cpu)?;
    let p = plain.compute(&aux, &main, &t, (64, 64))?;
    let z = DualTalLoss::new(nc, &[8, 16, 32])?
        .with_label_smoothing(0.0)?
        .compute(&aux, &main, &t, (64, 64))?;
    assert_eq!(p.items, z.items);
    let s = smooth.compute(&aux, &main, &t, (64, 64))?;
    assert_eq!((s.items[0], s.items[2]), (p.items[0], p.items[2]));
    assert!(p.items[0] > 0.0, "the box has foreground anchors");
    let half = |x: f32, tss: f32| n * bce(x as f64, 0.5) / (tss as f64).max(1.0);
    let branch = |c0: f32, x: f32, tss: f32| 0.9 * c0 as f64 + 0.1 * half(x, tss);
    let want = (0.25 * branch(p.aux.cls_loss, xa, p.aux.target_scores_sum)
        + branch(p.main.cls_loss, xm, p.main.target_scores_sum))
        * 0.5;
    assert!(
        (s.items[1] as f64 - want).abs() < 1e-4 * want,
        "cls {} vs {want} (unsmoothed {})",
        s.items[1],
        p.items[1]
    );
    assert!(s.items[1] != p.items[1]);
    Ok(())
}

/// `--freeze` names layers as the official trainer: one number N is `model.0.` … `model.N-1.`,
/// several numbers are those layers, 0 or nothing freezes nothing.
#[test]
fn freeze_prefixes_follow_the_official_rule() {
    assert_eq!(freeze_prefixes(&[3]), ["model.0.", "model.1.", "model.2."]);
    assert!(freeze_prefixes(&[0]).is_empty() && freeze_prefixes(&[]).is_empty());
    assert_eq!(freeze_prefixes(&[2, 5]), ["model.2.", "model.5."]);
}

/// The shipped BCCD weights (3 classes) into a 5-class training graph: every backbone tensor as
/// in the file (bit for bit after f16 → f32), and exactly the last class convs of the main head
/// (its three levels, weight and bias) re-initialised because of their shape, with both shapes
/// (the auxiliary head, absent from these inference weights, is initialised as absent).
#[test]
fn weights_of_another_class_count_reinitialise_the_class_convs() -> anyhow::Result<()> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors");
    let w = Weights::load(&path)?;
    assert_eq!(w.meta.nc, 3);
    let arch = training_arch(&w.meta.arch)?;
    let names: Vec<String> = (0..5).map(|i| format!("c{i}")).collect();
    let m = YoloV9Train::build(&arch, Some(&w), 5, names, &Device::Cpu, 0)?;
    let reshaped = m.reshaped();
    assert_eq!(reshaped.len(), 6, "{reshaped:?}");
    assert!(
        m.initialized().len() > reshaped.len(),
        "the auxiliary head is initialised too"
    );
    for (name, from, to) in reshaped {
        assert!(
            // The class branch of the main head (`cv5` of DualDDetect; the auxiliary head's
            // `cv3` is not in these inference weights at all).
            name.contains(".cv5.") && (name.ends_with(".2.weight") || name.ends_with(".2.bias")),
            "{name}"
        );
        assert_eq!((from[0], to[0]), (3, 5), "{name}");
        assert_eq!(&from[1..], &to[1..], "{name}");
    }
    // Backbone: the first layers of both graphs carry the same names.
    let vars = m.vars();
    let mut checked = 0;
    for v in vars.iter().filter(|v| {
        v.name.starts_with("model.0.")
            || v.name.starts_with("model.1.")
            || v.name.starts_with("model.2.")
    }) {
        let src = w.tensors[&v.name].to_dtype(DType::F32)?;
        assert_eq!(
            v.var.as_tensor().flatten_all()?.to_vec1::<f32>()?,
            src.flatten_all()?.to_vec1::<f32>()?,
            "{}",
            v.name
        );
        checked += 1;
    }
    assert!(checked >= 6, "{checked} backbone tensors compared");
    // A re-initialised class conv has the new shape.
    let (name, _, _) = &reshaped[0];
    let v = vars.iter().find(|v| &v.name == name).unwrap();
    assert_eq!(v.var.as_tensor().dims()[0], 5);
    Ok(())
}

/// `--cache ram` gives the loader's batches byte for byte (mosaic on, an undecodable image among
/// the items: skipped the same way), and the memory check refuses what does not fit.
#[test]
fn ram_cache_gives_the_uncached_batches() -> anyhow::Result<()> {
    let tmp = common::tmpdir("cache");
    common::tiny_dataset(&tmp, 3);
    let dir = tmp.join("images/train");
    let mut files: Vec<_> = std::fs::read_dir(&dir)?
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let bad = dir.join("broken.jpg");
    std::fs::write(&bad, b"not a jpeg")?;
    let mut items: Vec<TrainItem> = files
        .iter()
        .enumerate()
        .map(|(i, p)| TrainItem {
            path: p.clone(),
            labels: vec![(i as u32 % 3, [0.5, 0.5, 0.2 + 0.1 * i as f32, 0.3])],
            outlines: Vec::new(),
        })
        .collect();
    items.insert(
        1,
        TrainItem {
            path: bad,
            labels: vec![(0, [0.5, 0.5, 0.1, 0.1])],
            outlines: Vec::new(),
        },
    );
    let decode: Arc<DecodeFn> = Arc::new(|p: &std::path::Path| yolo9::data::image::load_rgb8(p));
    let cfg = LoaderConfig {
        img_size: 96,
        batch: 2,
        seed: 3,
        workers: 1,
        prefetch: 1,
        augment: Default::default(),
        shuffle: true,
        mask_ratio: None,
    };
    assert!(cfg.augment.mosaic > 0.0);
    let paths: Vec<_> = items.iter().map(|i| i.path.clone()).collect();
    let cache = RamCache::fill(
        &paths,
        decode.as_ref(),
        96,
        1,
        &yolo9::cancel::Cancel::never(),
    )?;
    assert_eq!(cache.len(), 3, "the broken image is not cached");
    let plain = Loader::new(items.clone(), decode.clone(), cfg.clone())?;
    let cached = Loader::new(items, cache.decode_fn(decode, 96), cfg)?.with_resized_source();
    for (epoch, b) in [(0, 0), (0, 1), (1, 0)] {
        let (x, y) = (plain.batch(epoch, b), cached.batch(epoch, b));
        assert_eq!(x.len, y.len);
        assert!(
            x.images == y.images,
            "epoch {epoch} batch {b}: images differ"
        );
        assert_eq!(x.targets, y.targets);
        assert_eq!(x.skipped.len(), y.skipped.len());
    }
    // The estimate: 640x480 at --img 320 is 320x240 RGB; a 10% margin.
    assert_eq!(
        cache_bytes(&[(640, 480), (100, 200)], 320),
        3 * 320 * 240 + 3 * 160 * 320
    );
    assert!(check_fits(1000, 2000).is_ok());
    let e = check_fits(1000, 1050).unwrap_err();
    assert!(
        e.contains("not caching images") && e.contains("available"),
        "{e}"
    );
    Ok(())
}

/// Records the lines of a run.
#[derive(Default)]
struct Lines(Vec<String>);

impl TrainObserver for Lines {
    fn event(&mut self, e: &TrainEvent<'_>) {
        if !matches!(e, TrainEvent::Text(_)) {
            if let Some(m) = e.message() {
                self.0.push(m.to_string());
            }
        }
    }
}

impl Lines {
    fn find(&self, needle: &str) -> &str {
        self.0
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with `{needle}` in {:#?}", self.0))
    }
}

/// Fine-tuning the BCCD weights with `--single-cls --freeze 3 --optimizer AdamW --cache ram
/// --label-smoothing 0.1` for one epoch, then resuming for a second: the model has one class
/// `item`; the head's class convs are re-initialised with a line saying why; the parameters of
/// layers 0-2 are those of the weights bit for bit in the model and in the EMA (no update, no
/// weight decay, no averaging) while layer 3 moved; the options are in args.yaml; the AdamW
/// state is saved without the frozen parameters and restored on `--resume` (its step count goes
/// on).
#[test]
fn fine_tune_single_class_frozen_adamw_cached_and_resumed() -> anyhow::Result<()> {
    let tmp = common::tmpdir("finetune");
    let mut o = common::tiny_run_options(&tmp, "ft");
    let weights =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors");
    o.weights = Some(weights.clone());
    o.cfg = None; // the model of the weights
    o.epochs = 1;
    o.noplots = true;
    o.verbose = true;
    o.single_cls = true;
    o.freeze = vec![3];
    o.optimizer = OptimizerKind::AdamW;
    o.cache = ImageCache::Ram;
    o.label_smoothing = 0.1;
    let mut lines = Lines::default();
    let s = train_with(&o, &StopFlag::install()?, &mut lines)?;
    eprintln!("{}", lines.0.join("\n"));
    assert_eq!(s.epochs.len(), 1);
    assert!(s.epochs[0].train_loss.iter().all(|v| v.is_finite()));
    let l = lines.find("re-initialised");
    assert!(
        l.contains("6 tensors")
            && l.contains("the weights have 3 classes, this model 1")
            && l.contains("[3, 128, 1, 1] -> [1, 128, 1, 1]"),
        "{l}"
    );
    let l = lines.find("--freeze:");
    assert!(
        l.contains("of 3 layers frozen: model.0, model.1, model.2"),
        "{l}"
    );
    let l = lines.find("--cache ram:");
    assert!(l.contains("2 of 2 training images cached"), "{l}");
    lines.find("optimizer: AdamW(lr=0.1, betas=(0.937, 0.999))");
    lines.find("--single-cls: training the 3 classes");

    let args = std::fs::read_to_string(s.run_dir.join("args.yaml"))?;
    for want in [
        "single_cls: true",
        "optimizer: AdamW",
        "cache: ram",
        "label_smoothing: 0.1",
        "time: null",
    ] {
        assert!(args.contains(want), "args.yaml lacks `{want}`:\n{args}");
    }
    assert!(args.contains("freeze:\n- 3"), "{args}");

    let last = Weights::load(&s.last)?;
    assert_eq!(
        (last.meta.nc, last.meta.names.clone()),
        (1, vec!["item".to_string()])
    );
    // The reference: the same weights in a 1-class graph, before any step.
    let w = Weights::load(&weights)?;
    let arch = training_arch(&w.meta.arch)?;
    let start = YoloV9Train::build(&arch, Some(&w), 1, vec!["item".into()], &Device::Cpu, 0)?;
    let st = load_state(&s.run_dir.join("weights/state.safetensors"))?;
    let bits = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let (mut frozen, mut moved) = (0, 0);
    for v in start.vars() {
        let model = &st.model[&v.name];
        let ema = &last.tensors[&v.name].to_dtype(DType::F32)?;
        let before = bits(v.var.as_tensor());
        if ["model.0.", "model.1.", "model.2."]
            .iter()
            .any(|p| v.name.starts_with(p))
        {
            assert_eq!(
                bits(model),
                before,
                "{}: frozen parameter changed in the model",
                v.name
            );
            assert_eq!(
                bits(ema),
                before,
                "{}: frozen parameter changed in the EMA",
                v.name
            );
            assert!(
                !st.optim
                    .iter()
                    .any(|(n, _)| n.starts_with(&format!("{}#", v.name))),
                "{}: frozen parameter has optimizer state",
                v.name
            );
            frozen += 1;
        } else if v.name.starts_with("model.3.") && bits(model) != before {
            moved += 1;
        }
    }
    assert!(frozen >= 9, "{frozen} frozen tensors checked");
    assert!(moved > 0, "no parameter of layer 3 moved");
    let steps = |st: &yolo9::internals::train::checkpoint::TrainState| -> f64 {
        let (_, t) = st
            .optim
            .iter()
            .find(|(n, _)| n.starts_with("model.3.") && n.ends_with("#step"))
            .expect("AdamW step count of layer 3 saved");
        t.flatten_all().unwrap().to_vec1::<f64>().unwrap()[0]
    };
    let t1 = steps(&st);
    assert!(st.optim.iter().any(|(n, _)| n.ends_with("#exp_avg_sq")));
    assert!(t1 >= 1.0);

    // Resume for one more epoch: the AdamW state goes on from its step count.
    let mut r = yolo9::train::trainer::TrainOptions::new(std::path::PathBuf::new());
    r.resume = Some(s.run_dir.clone());
    r.extend_epochs = Some(2);
    r.verbose = false;
    let s2 = train_with(&r, &StopFlag::install()?, &mut Lines::default())?;
    assert_eq!(s2.epochs.len(), 1);
    let st2 = load_state(&s.run_dir.join("weights/state.safetensors"))?;
    assert!(
        steps(&st2) > t1,
        "step count {} after resume, {t1} before",
        steps(&st2)
    );
    for v in start
        .vars()
        .iter()
        .filter(|v| v.name.starts_with("model.0."))
    {
        assert_eq!(
            bits(&st2.model[&v.name]),
            bits(v.var.as_tensor()),
            "{}",
            v.name
        );
    }
    Ok(())
}

/// `--time` with a limit far below one epoch: the run stops cleanly after its first epoch (of
/// 3), says why, and has saved everything; the re-estimated count is what the state keeps, so
/// `--resume` says the run is finished.
#[test]
fn time_limit_stops_after_the_first_epoch_saved() -> anyhow::Result<()> {
    let tmp = common::tmpdir("time");
    let mut o = common::tiny_run_options(&tmp, "t");
    o.noplots = true;
    o.time = Some(1e-7);
    let mut lines = Lines::default();
    let s = train_with(&o, &StopFlag::install()?, &mut lines)?;
    assert_eq!(s.epochs.len(), 1);
    assert!(!s.interrupted);
    let l = lines.find("stopping: the --time limit");
    assert!(l.contains("after epoch 1"), "{l}");
    assert!(s.last.is_file() && s.best.is_file());
    let csv = std::fs::read_to_string(s.run_dir.join("results.csv"))?;
    assert_eq!(csv.lines().count(), 2, "{csv}");
    let st = load_state(&s.run_dir.join("weights/state.safetensors"))?;
    assert_eq!((st.meta.epoch, st.meta.next_batch), (1, 0));
    assert_eq!(st.meta.args["epochs"], 1);
    let mut r = yolo9::train::trainer::TrainOptions::new(std::path::PathBuf::new());
    r.resume = Some(s.run_dir.clone());
    r.verbose = false;
    let e = format!(
        "{:#}",
        train_with(&r, &StopFlag::install()?, &mut Lines::default()).unwrap_err()
    );
    assert!(e.contains("already finished its 1 epochs"), "{e}");
    Ok(())
}
