//! CPU detection speed of the CPU engine ([`yolo9::internals::model::cpu`]):
//! `cargo bench --bench cpu_detect -- [--weights W] [--image IMG] [--iters N]
//! [--threads 1,2,4,all] [--sizes 640x640,480x640] [--batches 1,8] [--profile]`.
//!
//! For every (size, batch, threads) setting prints one line:
//! `cpu_detect size=HxW batch=B threads=T first_ms=.. forward_ms=.. forward_img_s=..
//! pipeline_ms=.. pipeline_img_s=..` where `forward` is the network and decode on a prepared
//! `(B, 3, H, W)` input (median of `--iters`), `first` the first call of a new detector (plan
//! building included), and `pipeline` the whole detect path from JPEG bytes: decode →
//! letterbox → forward → NMS (the image letterboxed to HxW: padded to that aspect first).
//! `--profile` adds, per setting, the time per kind of op of one forward (per layer with
//! `YOLO9_CPU_PROFILE_SHAPES=1`). `--export-onnx PATH` instead writes the ONNX export of
//! `--weights` at the first `--sizes` entry, batch 1 (what `yolo9 export --img H W -o PATH`
//! writes), for `benches/ort_cpu.py --dir` on a machine without the command line, and
//! `--int8-data DATA_YAML --int8-out PATH` the INT8 weights `yolo9 convert W --int8 --data
//! DATA_YAML -o PATH` writes, likewise. `--rss N` instead calls one detector N times on the image at
//! the first `--sizes` entry's long side and prints the resident memory after the first call and
//! after the last. `--seg-cfg NAME` (e.g. `gelan-c-seg`) instead times a segmentation model's
//! `forward_seg` (boxes, coefficients, prototypes) with seeded random weights, on the CPU engine
//! and on candle's ops, per size and thread count (batch 1):
//! `cpu_detect seg cfg=.. size=HxW threads=T engine_ms=.. candle_ms=..`. Run
//! `benches/ort_cpu.py` with the same settings in the same command for the ONNX Runtime ratio.

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use image::{DynamicImage, RgbImage};
use std::path::PathBuf;
use std::time::Instant;
use yolo9::{Detector, DetectorConfig};

/// Resident memory of this process in MiB (`/proc/self/statm`; 0 where there is none).
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |pages| pages * 4096.0 / (1 << 20) as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<T>()
                .map_err(|e| anyhow::anyhow!("{x}: {e}"))
        })
        .collect()
}

fn main() -> Result<()> {
    let mut weights = PathBuf::from("weights/yolov9-s-bccd.safetensors");
    let mut image = PathBuf::from("examples/images/BloodImage_00007.jpg");
    let mut iters = 10usize;
    let mut threads = "1,2,4,all".to_string();
    let mut sizes = "640x640,480x640".to_string();
    let mut batches = "1,8".to_string();
    let mut profile = false;
    let mut rss_calls = 0usize;
    let mut seg_cfg: Option<String> = None;
    let mut export_onnx: Option<PathBuf> = None;
    let (mut int8_data, mut int8_out): (Option<PathBuf>, Option<PathBuf>) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--weights" => weights = val()?.into(),
            "--image" => image = val()?.into(),
            "--iters" => iters = val()?.parse()?,
            "--threads" => threads = val()?,
            "--sizes" => sizes = val()?,
            "--batches" => batches = val()?,
            "--profile" => profile = true,
            "--rss" => rss_calls = val()?.parse()?,
            "--seg-cfg" => seg_cfg = Some(val()?),
            "--export-onnx" => export_onnx = Some(val()?.into()),
            "--int8-data" => int8_data = Some(val()?.into()),
            "--int8-out" => int8_out = Some(val()?.into()),
            _ => {}
        }
    }
    let all = yolo9::internals::model::cpu::default_threads();
    let threads: Vec<usize> = threads
        .split(',')
        .map(|t| match t.trim() {
            "all" => Ok(all),
            t => t.parse::<usize>().map_err(anyhow::Error::from),
        })
        .collect::<Result<_>>()?;
    let mut threads_dedup = threads.clone();
    threads_dedup.dedup();
    let sizes: Vec<(usize, usize)> = sizes
        .split(',')
        .map(|s| {
            let (h, w) = s.split_once('x').context("sizes are HxW")?;
            Ok((h.trim().parse()?, w.trim().parse()?))
        })
        .collect::<Result<_>>()?;
    let batches: Vec<usize> = list(&batches)?;
    if int8_data.is_some() != int8_out.is_some() {
        anyhow::bail!("--int8-data and --int8-out go together: pass both, or neither");
    }
    if let (Some(data), Some(out)) = (int8_data, int8_out) {
        use yolo9::convert::int8::{quantize_file, Int8Options};
        let int8 = Int8Options {
            data,
            images: 100,
            imgsz: 640,
            threads: 0,
        };
        let report = quantize_file(&weights, &out, Default::default(), &int8)?;
        println!("{report}");
        return Ok(());
    }
    if let Some(path) = export_onnx {
        let opts = yolo9::export::ExportOptions {
            img: *sizes.first().context("--sizes is empty")?,
            ..Default::default()
        };
        let model = yolo9::export::onnx::export(&yolo9::Weights::load(&weights)?, &opts)?;
        let inputs = yolo9::internals::outfile::Inputs::of([weights.as_path()]);
        let bytes = yolo9::export::write(&model, &path, &inputs)?;
        println!("cpu_detect exported {} ({bytes} bytes)", path.display());
        return Ok(());
    }
    if let Some(cfg) = seg_cfg {
        let arch = yolo9::model::Arch::builtin(&cfg)?;
        let w = yolo9::model::YoloV9Train::build(&arch, None, 80, vec![], &Device::Cpu, 1)?
            .to_weights()?;
        for &(h, wd) in &sizes {
            let x = Tensor::rand(0f32, 1f32, (1, 3, h, wd), &Device::Cpu)?;
            for &t in &threads_dedup {
                let m = yolo9::model::YoloV9::load(&w, &Device::Cpu)?.with_threads(t);
                m.forward_seg(&x)?;
                m.forward_seg_launched(&x)?;
                let time = |f: &dyn Fn() -> Result<(Tensor, Tensor)>| -> Result<f64> {
                    let ms = (0..iters)
                        .map(|_| {
                            let t0 = Instant::now();
                            f().map(|_| t0.elapsed().as_secs_f64() * 1e3)
                        })
                        .collect::<std::result::Result<Vec<_>, _>>()?;
                    Ok(median(ms))
                };
                let engine = time(&|| m.forward_seg(&x))?;
                let candle = time(&|| m.forward_seg_launched(&x))?;
                println!(
                    "cpu_detect seg cfg={cfg} size={h}x{wd} threads={t} engine_ms={engine:.2} candle_ms={candle:.2} engine={}",
                    m.cpu_engine().is_some_and(|e| e.is_seg())
                );
            }
        }
        return Ok(());
    }
    let w = yolo9::Weights::load(&weights)?;
    let bytes = std::fs::read(&image).with_context(|| format!("reading {}", image.display()))?;
    let src = image::load_from_memory(&bytes)?.to_rgb8();
    println!("cpu_detect cpus={all} weights={}", weights.display());
    if rss_calls > 0 {
        // A detector called in a loop: resident memory after the first call and after all.
        let (h, wd) = sizes[0];
        let config = DetectorConfig {
            img_size: h.max(wd) as u32,
            ..DetectorConfig::default()
        };
        let det = Detector::with_weights(&w, Device::Cpu, config)?;
        let img = image::load_from_memory(&bytes)?;
        det.detect(&img)?;
        let first = rss_mib();
        let t0 = Instant::now();
        for i in 1..rss_calls {
            det.detect(&img)?;
            if [10, 100, 300].contains(&(i + 1)) {
                println!(
                    "cpu_detect rss after_calls={} rss_mib={:.1}",
                    i + 1,
                    rss_mib()
                );
            }
        }
        println!(
            "cpu_detect rss calls={rss_calls} img={} rss_after_first_mib={first:.1} rss_after_all_mib={:.1} ms_per_call={:.2}",
            h.max(wd),
            rss_mib(),
            t0.elapsed().as_secs_f64() * 1e3 / (rss_calls - 1).max(1) as f64
        );
        return Ok(());
    }
    for &(h, wd) in &sizes {
        // The image padded (bottom/right, grey) to the aspect of HxW, then letterboxed to it.
        let (iw, ih) = src.dimensions();
        let scale = (iw as f64 / wd as f64).max(ih as f64 / h as f64);
        let (cw, ch) = (
            (wd as f64 * scale).round() as u32,
            (h as f64 * scale).round() as u32,
        );
        let mut canvas = RgbImage::from_pixel(cw.max(iw), ch.max(ih), image::Rgb([114, 114, 114]));
        image::imageops::overlay(&mut canvas, &src, 0, 0);
        let mut jpeg = Vec::new();
        DynamicImage::ImageRgb8(canvas).write_to(
            &mut std::io::Cursor::new(&mut jpeg),
            image::ImageFormat::Jpeg,
        )?;
        for &b in &batches {
            let x = Tensor::rand(0f32, 1f32, (b, 3, h, wd), &Device::Cpu)?;
            for &t in &threads_dedup {
                let config = DetectorConfig {
                    img_size: h.max(wd) as u32,
                    threads: t,
                    ..DetectorConfig::default()
                };
                let det = Detector::with_weights(&w, Device::Cpu, config.clone())?;
                let t0 = Instant::now();
                det.forward_tensor(&x)?;
                let first = t0.elapsed().as_secs_f64() * 1e3;
                let fwd = median(
                    (0..iters)
                        .map(|_| {
                            let t0 = Instant::now();
                            det.forward_tensor(&x)
                                .map(|_| t0.elapsed().as_secs_f64() * 1e3)
                        })
                        .collect::<std::result::Result<Vec<_>, yolo9::Error>>()?,
                );
                let pipe = median(
                    (0..iters.max(3))
                        .map(|_| -> Result<f64> {
                            let t0 = Instant::now();
                            let imgs = (0..b)
                                .map(|_| image::load_from_memory(&jpeg))
                                .collect::<std::result::Result<Vec<_>, _>>()?;
                            let d = det.detect_batch(&imgs)?;
                            anyhow::ensure!(d.len() == b);
                            Ok(t0.elapsed().as_secs_f64() * 1e3)
                        })
                        .collect::<Result<Vec<_>>>()?,
                );
                println!(
                    "cpu_detect size={h}x{wd} batch={b} threads={t} first_ms={first:.1} forward_ms={fwd:.2} forward_img_s={:.2} pipeline_ms={pipe:.2} pipeline_img_s={:.2}",
                    b as f64 * 1e3 / fwd,
                    b as f64 * 1e3 / pipe
                );
                if profile {
                    let m = yolo9::model::YoloV9::load(&w, &Device::Cpu)?.with_threads(t);
                    let e = m.cpu_engine().context("the CPU engine did not compile")?;
                    e.forward(&x)?;
                    let mut rows: Vec<Vec<(String, f64, f64)>> = Vec::new();
                    for _ in 0..5 {
                        rows.push(e.profile(&x)?);
                    }
                    let mut med: Vec<(String, f64, f64)> = rows[0]
                        .iter()
                        .map(|(label, _, gf)| {
                            let ms = median(
                                rows.iter()
                                    .filter_map(|r| r.iter().find(|x| &x.0 == label).map(|x| x.1))
                                    .collect(),
                            );
                            (label.clone(), ms, *gf)
                        })
                        .collect();
                    med.sort_by(|a, b| {
                        (a.0 == "total")
                            .cmp(&(b.0 == "total"))
                            .then(b.1.total_cmp(&a.1))
                    });
                    for (label, ms, gf) in &med {
                        let rate = if *gf > 0.0 {
                            format!(" {:.0} GFLOP/s", gf / ms * 1e3)
                        } else {
                            String::new()
                        };
                        println!("  profile {label:<18} {ms:8.2} ms {gf:7.2} GFLOP{rate}");
                    }
                }
            }
        }
    }
    Ok(())
}
