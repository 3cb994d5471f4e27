//! Detect latency and throughput: `cargo bench --bench detect -- [--device cpu|N] [--weights W]
//! [--cfg MODEL] [--image IMG] [--iters N] [--batch B] [--half] [--batch-only]`.
//!
//! `--cfg yolov9-c` (any built-in model or model yaml) without `--weights` times that model with
//! seeded random weights at nc = 80 (the official model summaries' class count), so every size
//! can be timed without a checkpoint; the inference graph (the gelan counterpart) runs, as
//! `yolo9 detect` runs it for a training checkpoint.
//!
//! Measures, on one image letterboxed to 640 (`auto` padding, as `yolo9 detect`):
//! pre-process (decode excluded: letterbox), forward (input upload + network, device-synchronised,
//! output left on the device as `yolo9 detect` does), NMS + scaling (on a GPU the batched NMS
//! kernel, only kept rows copied), and the total, as medians over `--iters`;
//! `--half` runs the network in f16 (`yolo9 detect --half`); then
//! the forward throughput at `--batch` (default 32) on a stacked batch, and on a GPU the NMS of
//! that batch's output (val and detect settings) on the device against the host path. Prints one line per figure
//! as `name value unit` so a script can compare it with `benches/torch_detect.py` run in the same
//! device command.

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::Instant;
use yolo9::device::{parse_device, select};
use yolo9::internals::detect::letterbox::to_tensor;
use yolo9::Detector;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let mut device = "cpu".to_string();
    let mut weights = PathBuf::from("weights/yolov9-s-bccd.safetensors");
    let mut cfg: Option<String> = None;
    let mut image = PathBuf::from("examples/images/BloodImage_00007.jpg");
    let mut iters = 20usize;
    let mut batch = 32usize;
    let mut batch_only = false;
    let mut dtype = candle_core::DType::F32;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--device" => device = val()?,
            "--weights" => weights = val()?.into(),
            "--cfg" => cfg = Some(val()?),
            "--image" => image = val()?.into(),
            "--iters" => iters = val()?.parse()?,
            "--batch" => batch = val()?.parse()?,
            "--half" => dtype = candle_core::DType::F16,
            "--batch-only" => batch_only = true,
            "--bench" => {}
            _ => {}
        }
    }
    let spec = parse_device(&device).map_err(anyhow::Error::msg)?;
    let dev = select(spec)?;
    let w = match &cfg {
        Some(c) => {
            let arch = yolo9::model::Arch::from_name_or_path(c)?;
            // A gelan model is built as its yolov9 training graph (what yolo9 initialises);
            // the detector runs its main branch, which is the gelan graph.
            let arch = if arch.is_dual() {
                arch
            } else {
                arch.dual_counterpart()
                    .context("no training counterpart of this model")?
            };
            let names = (0..80).map(|i| format!("class{i}")).collect();
            let m = yolo9::model::YoloV9Train::build(
                &arch,
                None,
                80,
                names,
                &candle_core::Device::Cpu,
                0,
            )?;
            weights = PathBuf::from(format!("random {}", arch.name));
            m.to_weights()?
        }
        None => yolo9::Weights::load(&weights)?,
    };
    println!(
        "model {} ({} graph, {} parameters)",
        w.meta.arch.name,
        w.meta.graph.as_str(),
        w.parameter_count()
    );
    let det = Detector::from_weights(&w, dev.clone(), dtype)?;
    let img = yolo9::data::image::load_rgb8(&image)?;
    println!(
        "device {device} dtype {dtype:?} weights {} image {}",
        weights.display(),
        image.display()
    );

    // `--batch-only`: the batch forward alone (a profiler run of the batch).
    if !batch_only {
        batch1_and_parity(&det, &img, &dev, &w, iters)?;
        #[cfg(feature = "cuda")]
        if dtype != candle_core::DType::F32 && !dev.is_cpu() {
            fused_parity(&det, &img, &dev, &w, dtype)?;
        }
    }
    println!("graphs_captured_replayed {:?}", det.graph_counts());
    if batch > 1 {
        let (lb, _) = det.preprocess(&img)?;
        let refs: Vec<_> = (0..batch).map(|_| &lb).collect();
        let x = to_tensor(&refs, &dev)?;
        let x = x.to_device(&dev)?;
        // Median ms of the forward alone: output left on the device, device synchronized,
        // 3 warm-ups.
        let forward_ms = |x: &candle_core::Tensor| -> Result<f64> {
            let mut t = vec![];
            for i in 0..iters.max(4) + 3 {
                dev.synchronize()?;
                let t0 = Instant::now();
                let _y = det.infer_tensor(x)?;
                if i >= 3 {
                    t.push(t0.elapsed().as_secs_f64() * 1e3);
                }
            }
            Ok(median(t))
        };
        let ms = forward_ms(&x)?;
        println!("b{batch}_forward_ms {ms:.3}");
        // `YOLO9_PROFILE_ONE=1`: one more forward between cuProfilerStart and cuProfilerStop, for
        // `ncu --profile-from-start off` (per-kernel times of exactly one batch forward).
        #[cfg(feature = "cuda")]
        if std::env::var("YOLO9_PROFILE_ONE").is_ok_and(|v| v == "1") {
            dev.synchronize()?;
            profiler_call(c"cuProfilerStart");
            let _y = det.infer_tensor(&x)?;
            dev.synchronize()?;
            profiler_call(c"cuProfilerStop");
        }
        println!("b{batch}_img_per_s {:.1}", batch as f64 * 1e3 / ms);
        // NMS of the whole batch's output at the val settings (multi-label, conf 0.001, IoU 0.7,
        // 300 detections) and the detect settings: on the device in one launch (the default off
        // the CPU) against the candidate copy + host NMS (`YOLO9_GPU_NMS=0`); same rows.
        if !dev.is_cpu() && !batch_only {
            use yolo9::internals::detect::device_nms::batch_nms;
            use yolo9::internals::detect::nms::{nms_image, NmsOptions};
            use yolo9::internals::detect::postprocess::host_candidates;
            let y = det.infer_tensor(&x)?;
            let nc = y.dim(1)? - 4;
            let val = NmsOptions {
                conf_thres: 0.001,
                iou_thres: 0.7,
                max_det: 300,
                multi_label: true,
                ..Default::default()
            };
            for (name, o) in [("val", val), ("detect", NmsOptions::default())] {
                let (mut td, mut th) = (vec![], vec![]);
                let (mut kd, mut kh) = (vec![], vec![]);
                for i in 0..iters.max(4) + 3 {
                    dev.synchronize()?;
                    let t0 = Instant::now();
                    kd = batch_nms(&y, &o)?;
                    let t1 = Instant::now();
                    kh = host_candidates(&y, o.conf_thres)?
                        .iter()
                        .map(|c| nms_image(&c.data, nc, c.len, &o))
                        .collect::<Vec<_>>();
                    let t2 = Instant::now();
                    if i >= 3 {
                        td.push((t1 - t0).as_secs_f64() * 1e3);
                        th.push((t2 - t1).as_secs_f64() * 1e3);
                    }
                }
                let kept: usize = kd.iter().map(Vec::len).sum();
                println!("b{batch}_{name}_nms_device_ms {:.3}", median(td));
                println!("b{batch}_{name}_nms_host_ms {:.3}", median(th));
                println!("b{batch}_{name}_nms_kept {kept} same_as_host {}", kd == kh);
            }
        }
        // Batch 1, forward only, same timer (the comparison with a CUDA-graphed PyTorch forward).
        let t = forward_ms(&x.narrow(0, 0, 1)?.contiguous()?)?;
        println!("b1_forward_only_ms {t:.3}");
        println!("graphs_captured_replayed {:?}", det.graph_counts());
    }
    Ok(())
}

/// Batch-1 pre-process, forward, NMS and total medians, then GPU-vs-CPU parity on a GPU.
fn batch1_and_parity(
    det: &Detector,
    img: &image::RgbImage,
    dev: &candle_core::Device,
    w: &yolo9::Weights,
    iters: usize,
) -> Result<()> {
    let (mut pre, mut fwd, mut post, mut total) = (vec![], vec![], vec![], vec![]);
    for i in 0..iters + 3 {
        let t0 = Instant::now();
        let (lb, info) = det.preprocess(img)?;
        let t1 = Instant::now();
        let y = det.infer(&[&lb])?;
        let t2 = Instant::now();
        let d = det.postprocess(&y, &[info])?;
        let t3 = Instant::now();
        if i >= 3 {
            pre.push((t1 - t0).as_secs_f64() * 1e3);
            fwd.push((t2 - t1).as_secs_f64() * 1e3);
            post.push((t3 - t2).as_secs_f64() * 1e3);
            total.push((t3 - t0).as_secs_f64() * 1e3);
        }
        if i == 0 {
            println!("detections {}", d[0].len());
        }
    }
    println!("b1_preprocess_ms {:.3}", median(pre));
    println!("b1_forward_ms {:.3}", median(fwd));
    println!("b1_nms_ms {:.3}", median(post));
    println!("b1_total_ms {:.3}", median(total));

    if !dev.is_cpu() {
        // GPU vs CPU parity on the same letterboxed input, with strict f32 convolutions (the
        // timings above allow TF32, as PyTorch does).
        #[cfg(feature = "cuda")]
        yolo9::internals::cuda::conv::set_strict_fp32(true);
        let cpu = Detector::from_weights(w, candle_core::Device::Cpu, candle_core::DType::F32)?;
        let (lb, info) = det.preprocess(img)?;
        let yg = det.forward_tensor(&to_tensor(&[&lb], dev)?)?;
        let yc = cpu.forward_tensor(&to_tensor(&[&lb], &candle_core::Device::Cpu)?)?;
        let diff = |a: &candle_core::Tensor, b: &candle_core::Tensor| -> Result<f32> {
            Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
        };
        let rows = yg.dim(1)?;
        println!(
            "parity_box_px {:.3e}",
            diff(&yg.narrow(1, 0, 4)?, &yc.narrow(1, 0, 4)?)?
        );
        println!(
            "parity_score {:.3e}",
            diff(&yg.narrow(1, 4, rows - 4)?, &yc.narrow(1, 4, rows - 4)?)?
        );
        let dg = det.postprocess(&yg, &[info])?;
        let dc = cpu.postprocess(&yc, &[info])?;
        let same_classes = dg[0].len() == dc[0].len()
            && dg[0]
                .iter()
                .zip(&dc[0])
                .all(|(a, b)| a.class_id == b.class_id);
        let max_box = dg[0]
            .iter()
            .zip(&dc[0])
            .flat_map(|(a, b)| a.bbox.iter().zip(b.bbox).map(|(x, y)| (x - y).abs()))
            .fold(0f32, f32::max);
        println!(
            "parity_detections gpu {} cpu {} same_classes {same_classes} max_box_diff_px {max_box:.3e}",
            dg[0].len(),
            dc[0].len()
        );
        #[cfg(feature = "cuda")]
        yolo9::internals::cuda::conv::set_strict_fp32(false);
    }

    Ok(())
}

/// The half-precision forward with the convolution epilogues fused into cuDNN graphs against
/// the same forward unfused (`YOLO9_CUDNN_FUSED=off`), both measured against the strict-f32 GPU
/// forward of the same input: the largest box (px) and score differences of each.
#[cfg(feature = "cuda")]
fn fused_parity(
    det: &Detector,
    img: &image::RgbImage,
    dev: &candle_core::Device,
    w: &yolo9::Weights,
    dtype: candle_core::DType,
) -> Result<()> {
    use yolo9::internals::cuda::fused_conv::{fused, set_fused, Fused};
    let mode = fused();
    let (lb, _) = det.preprocess(img)?;
    let x = to_tensor(&[&lb], dev)?;
    yolo9::internals::cuda::conv::set_strict_fp32(true);
    let exact =
        Detector::from_weights(w, dev.clone(), candle_core::DType::F32)?.forward_tensor(&x)?;
    yolo9::internals::cuda::conv::set_strict_fp32(false);
    let rows = exact.dim(1)?;
    for (name, m) in [("unfused", Fused::Off), ("fused", Fused::All)] {
        set_fused(m);
        let y = Detector::from_weights(w, dev.clone(), dtype)?
            .forward_tensor(&x)?
            .to_dtype(candle_core::DType::F32)?;
        let diff = |a: &candle_core::Tensor, b: &candle_core::Tensor| -> Result<f32> {
            Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
        };
        println!(
            "half_{name}_vs_f32 box_px {:.3e} score {:.3e}",
            diff(&y.narrow(1, 0, 4)?, &exact.narrow(1, 0, 4)?)?,
            diff(&y.narrow(1, 4, rows - 4)?, &exact.narrow(1, 4, rows - 4)?)?
        );
    }
    set_fused(mode);
    Ok(())
}

/// Calls the driver's `cuProfilerStart`/`cuProfilerStop` (looked up in libcuda.so.1 at run
/// time; the link-time stub lacks them). A missing symbol is reported, not fatal.
#[cfg(feature = "cuda")]
fn profiler_call(name: &std::ffi::CStr) {
    // SAFETY: dlopen/dlsym of the already-loaded driver library; the symbol is a C function
    // `CUresult f(void)` that only marks a profiler range.
    unsafe {
        let lib = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        let f = if lib.is_null() {
            std::ptr::null_mut()
        } else {
            libc::dlsym(lib, name.as_ptr())
        };
        if f.is_null() {
            eprintln!("{name:?} not found in libcuda.so.1");
            return;
        }
        let f: extern "C" fn() -> i32 = std::mem::transmute(f);
        println!("{name:?} -> {}", f());
    }
}
