//! Training-step timing: `cargo bench --bench train_step -- [--device cpu|N] [--batches 16,64]
//! [--img S] [--iters N] [--amp] [--strict-fp32]`.
//!
//! The same synthetic batches as `../shared/bench/torch_train_step.py` (the official code's
//! timer): uniform-random images, 13 boxes per image (centres in [0.1, 0.9], sizes in
//! [0.03, 0.18] of the image), classes 0..2, nc = 3, a fixed seed. Per iteration: forward of both
//! branches in train mode, the dual TAL loss, backward (timed together as `fwd_bwd`, with the
//! parts `forward`, `loss`, `backward` device-synchronised), then clip 10 + SGD Nesterov
//! (`optimizer`) and the EMA update (`ema`). Medians of `--iters` (10) after 3 warm-ups; the
//! `train_dual_iteration` figure is what `train_dual.py` does per batch at nominal batch 64:
//! `fwd_bwd + (optimizer + ema) / max(round(64 / B), 1)`. The reverse mode is the training
//! step's (`yolo9::internals::train::pass::train_forward`/`train_backward`: the tape on CUDA unless
//! `YOLO9_TAPE=0`). Peak memory is the pool high-water
//! mark of the step (CUDA) or the process RSS (CPU). Prints `name value unit` lines.
//!
//! `forward_host_ms`/`backward_host_ms` are the host's time to enqueue those phases (before the
//! synchronization that ends them): close to the phase's time means host-bound.
//!
//! `--profile-iter K` (CUDA) brackets iteration K with `cuProfilerStart`/`cuProfilerStop`, for
//! `ncu --profile-from-start off`, and launches one `uexp_f64` kernel (used nowhere in the step)
//! after the forward, the loss, the backward and the optimizer, so the kernel list splits into
//! the five phases.

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use std::time::Instant;
use yolo9::device::{parse_device, select};
use yolo9::internals::loss::tal_loss::targets_tensor;
use yolo9::internals::loss::DualTalLoss;
use yolo9::internals::memory::MemoryProbe;
use yolo9::internals::train::ema::Ema;
use yolo9::internals::train::graphed::{self, StepGraphs};
use yolo9::internals::train::optimizer::Sgd;
use yolo9::model::arch::STRIDES;
use yolo9::model::YoloV9Train;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn sync(d: &Device) -> Result<()> {
    d.synchronize()?;
    Ok(())
}

/// Starts (`on`) or stops the CUDA profiler's capture range: `cuProfilerStart`/`cuProfilerStop`
/// looked up in the loaded `libcuda.so.1` (the link-time stub lacks them); a no-op where absent.
fn profiler(on: bool) {
    let name: &std::ffi::CStr = if on {
        c"cuProfilerStart"
    } else {
        c"cuProfilerStop"
    };
    // SAFETY: dlopen/dlsym with NUL-terminated names; the symbol, when found, is the driver's
    // `CUresult f(void)`.
    unsafe {
        let lib = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if lib.is_null() {
            return;
        }
        let f = libc::dlsym(lib, name.as_ptr());
        if !f.is_null() {
            let f: extern "C" fn() -> i32 = std::mem::transmute(f);
            f();
        }
    }
}

/// The phase marker of `--profile-iter`: one `uexp_f64` launch.
fn mark(d: &Device, on: bool) -> Result<()> {
    if on {
        Tensor::ones(1, candle_core::DType::F64, d)?.exp()?;
    }
    Ok(())
}

fn main() -> Result<()> {
    let mut device = "cpu".to_string();
    let mut batches = "16,64".to_string();
    let mut img = 640usize;
    let mut iters = 10usize;
    let mut amp = false;
    let mut strict = false;
    let mut profile_iter = usize::MAX;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--device" => device = val()?,
            "--batches" | "--batch" => batches = val()?,
            "--img" => img = val()?.parse()?,
            "--iters" => iters = val()?.parse()?,
            "--amp" => amp = true,
            "--strict-fp32" => strict = true,
            "--profile-iter" => profile_iter = val()?.parse()?,
            _ => {}
        }
    }
    #[cfg(feature = "cuda")]
    yolo9::internals::cuda::conv::set_strict_fp32(strict);
    let precision = if amp {
        "amp"
    } else if strict {
        "f32strict"
    } else {
        "f32"
    };
    let spec = parse_device(&device).map_err(anyhow::Error::msg)?;
    let dev = select(spec)?;
    let nc = 3;
    let model = YoloV9Train::new(None, nc, Vec::new(), &dev, 0)?;
    model.set_amp(amp);
    let loss = DualTalLoss::new(nc, &STRIDES)?;
    let params = model
        .vars()
        .iter()
        .map(|v| (v.name.clone(), v.var.clone()))
        .collect();
    let mut opt = Sgd::new(params, 0.01, 0.937, 5e-4);
    let mut ema = Ema::new(&model.float_state()?)?;
    let probe = MemoryProbe::new(&dev)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    for bs in batches.split(',').map(|b| b.trim().parse::<usize>()) {
        let bs = bs.context("--batches: a comma-separated list of batch sizes")?;
        let x = Tensor::rand(0f32, 1f32, (bs, 3, img, img), &dev)?;
        let mut rows = Vec::new();
        for b in 0..bs {
            for _ in 0..13 {
                let w: f32 = rng.random_range(0.03..0.18);
                let h: f32 = rng.random_range(0.03..0.18);
                rows.push([
                    b as f32,
                    rng.random_range(0..nc) as f32,
                    rng.random_range(0.1..0.9),
                    rng.random_range(0.1..0.9),
                    w,
                    h,
                ]);
            }
        }
        let t = targets_tensor(&rows, &Device::Cpu)?;
        probe.reset_peak();
        let (mut tf, mut tl, mut tb, mut to, mut te) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // Host time to enqueue the forward and the backward (before the synchronization): when
        // it is close to the phase's time, the phase is bound by the host, not the GPU.
        let (mut hf, mut hb) = (Vec::new(), Vec::new());
        for it in 0..iters + 3 {
            let prof = it == profile_iter;
            sync(&dev)?;
            if prof {
                profiler(true);
            }
            let t0 = Instant::now();
            let (raw, tape) = yolo9::internals::train::pass::train_forward(&model, &x)?;
            let h1 = Instant::now();
            mark(&dev, prof)?;
            sync(&dev)?;
            let t1 = Instant::now();
            let lo = loss.compute(&raw.aux, &raw.main, &t, (img, img))?;
            mark(&dev, prof)?;
            sync(&dev)?;
            let t2 = Instant::now();
            let mut grads = yolo9::internals::train::pass::train_backward(&lo.total, raw, tape)?;
            let h3 = Instant::now();
            mark(&dev, prof)?;
            sync(&dev)?;
            let t3 = Instant::now();
            let norm =
                opt.clip_grad_norm(&mut grads, yolo9::internals::train::step::MAX_GRAD_NORM)?;
            anyhow::ensure!(
                norm.is_finite(),
                "non-finite gradient norm at iteration {it}"
            );
            opt.step(&grads)?;
            drop(grads);
            mark(&dev, prof)?;
            sync(&dev)?;
            let t4 = Instant::now();
            ema.update(&model.float_state()?)?;
            sync(&dev)?;
            if prof {
                profiler(false);
            }
            let t5 = Instant::now();
            if it >= 3 {
                let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
                tf.push(ms(t0, t1));
                hf.push(ms(t0, h1));
                hb.push(ms(t2, h3));
                tl.push(ms(t1, t2));
                tb.push(ms(t2, t3));
                to.push(ms(t3, t4));
                te.push(ms(t4, t5));
            }
        }
        let fwd_bwd: Vec<f64> = (0..tf.len()).map(|i| tf[i] + tl[i] + tb[i]).collect();
        let step: Vec<f64> = (0..tf.len()).map(|i| fwd_bwd[i] + to[i] + te[i]).collect();
        let (f, l, b, o, e) = (
            median(tf),
            median(tl),
            median(tb),
            median(to.clone()),
            median(te.clone()),
        );
        let fb = median(fwd_bwd);
        let st = median(step);
        let acc = ((64.0 / bs as f64).round() as usize).max(1) as f64;
        let iter_ms = fb + (o + e) / acc;
        let k = format!("yolo9_train_b{bs}_{precision}");
        println!("{k}_ms {st:.1} ms");
        println!("{k}_img_per_s {:.1} img/s", bs as f64 * 1e3 / st);
        println!("{k}_fwd_bwd_ms {fb:.1} ms");
        println!("{k}_forward_ms {f:.1} ms");
        println!("{k}_forward_host_ms {:.1} ms", median(hf));
        println!("{k}_backward_host_ms {:.1} ms", median(hb));
        println!("{k}_loss_ms {l:.1} ms");
        println!("{k}_backward_ms {b:.1} ms");
        println!("{k}_optimizer_ms {o:.1} ms");
        println!("{k}_ema_ms {e:.1} ms");
        println!("{k}_train_dual_iteration_ms {iter_ms:.1} ms");
        println!(
            "{k}_train_dual_img_per_s {:.1} img/s",
            bs as f64 * 1e3 / iter_ms
        );
        println!(
            "{k}_peak_{} {:.2} GiB",
            probe.what().replace(' ', "_"),
            probe.peak_bytes() as f64 / (1u64 << 30) as f64
        );

        // The same micro-step replayed from CUDA graphs (`yolo9::internals::train::graphed`, what the
        // trainer runs on CUDA): first its gradients against the ordinary step's on the same
        // weights and input, then its time.
        let mut sg = StepGraphs::new();
        if !sg.applies(&x) {
            continue;
        }
        let pt: Vec<Tensor> = opt
            .params()
            .iter()
            .map(|p| p.var.as_tensor().clone())
            .collect();
        let want = graphed::ordinary(&model, &loss, &pt, &x, &t, (img, img))?
            .grads
            .context("non-finite loss")?;
        // The ordinary step against itself: cuDNN's weight-gradient algorithms add with atomics,
        // so two runs differ by rounding; this is the scale the graphed difference is read on.
        let again = graphed::ordinary(&model, &loss, &pt, &x, &t, (img, img))?
            .grads
            .context("non-finite loss")?;
        let worst_of = |a: &candle_core::backprop::GradStore| -> Result<(f64, String)> {
            let mut w = (0f64, String::new());
            for (p, (name, _)) in pt.iter().zip(opt.params().iter().map(|p| (&p.name, 0))) {
                if let (Some(a), Some(b)) = (a.get(p), want.get(p)) {
                    let d = (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()? as f64;
                    let m = b.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()? as f64;
                    let r = d / m.max(1e-30);
                    if r > w.0 {
                        w = (r, name.clone());
                    }
                }
            }
            Ok(w)
        };
        let noise = worst_of(&again)?;
        println!(
            "{k}_ordinary_grad_worst_rel {:.2e} (two ordinary steps, {})",
            noise.0, noise.1
        );
        drop(again);
        let mut got = None;
        for _ in 0..4 {
            got = sg.micro_step(&model, &loss, &pt, &x, &t, (img, img))?.grads;
        }
        let got = got.context("non-finite loss")?;
        let worst = worst_of(&got)?;
        println!(
            "{k}_graphed_grad_worst_rel {:.2e} (vs the ordinary step, {} grads, {})",
            worst.0,
            pt.len(),
            worst.1
        );
        drop((want, got));
        probe.reset_peak();
        let (mut tg, mut tge) = (Vec::new(), Vec::new());
        for _ in 0..iters + 3 {
            sync(&dev)?;
            let t0 = Instant::now();
            let out = sg.micro_step(&model, &loss, &pt, &x, &t, (img, img))?;
            sync(&dev)?;
            let t1 = Instant::now();
            let mut grads = out.grads.context("non-finite loss")?;
            opt.clip_grad_norm(&mut grads, yolo9::internals::train::step::MAX_GRAD_NORM)?;
            opt.step(&grads)?;
            drop(grads);
            ema.update(&model.float_state()?)?;
            sync(&dev)?;
            let t2 = Instant::now();
            tg.push((t1 - t0).as_secs_f64() * 1e3);
            tge.push((t2 - t1).as_secs_f64() * 1e3);
        }
        let g = median(tg[3..].to_vec());
        let ge = median(tge[3..].to_vec());
        println!("{k}_graphed_fwd_bwd_ms {g:.1} ms");
        println!("{k}_graphed_optimizer_ema_ms {ge:.1} ms");
        let it = g + ge / acc;
        println!("{k}_graphed_train_dual_iteration_ms {it:.1} ms");
        println!(
            "{k}_graphed_train_dual_img_per_s {:.1} img/s",
            bs as f64 * 1e3 / it
        );
        println!("{k}_graphed_counts {:?}", sg.counts());
        // What the trainer adds per micro-step: its gradients summed into the batch's
        // (`yolo9::internals::train::step::add_param_grads`: one multi-tensor launch on CUDA, one add per
        // parameter tensor with `YOLO9_FUSED_GRADS=0`).
        let mut acc = None;
        let mut ta = Vec::new();
        for _ in 0..6 {
            let out = sg.micro_step(&model, &loss, &pt, &x, &t, (img, img))?;
            let mut grads = out.grads.context("non-finite loss")?;
            sync(&dev)?;
            let t0 = Instant::now();
            yolo9::internals::train::step::add_param_grads(&mut acc, &mut grads, &opt)?;
            sync(&dev)?;
            ta.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        println!(
            "{k}_graphed_accumulate_ms {:.1} ms (per micro-step after the first)",
            median(ta[1..].to_vec())
        );
        drop(acc);
        #[cfg(feature = "cuda")]
        if let Device::Cuda(c) = &dev {
            println!(
                "{k}_graphed_graph_pool_reserved_high {:.2} GiB",
                yolo9::internals::cuda::graph::graph_reserved_high(c)? as f64 / (1u64 << 30) as f64
            );
        }
        println!(
            "{k}_graphed_peak_{} {:.2} GiB",
            probe.what().replace(' ', "_"),
            probe.peak_bytes() as f64 / (1u64 << 30) as f64
        );
    }
    Ok(())
}
