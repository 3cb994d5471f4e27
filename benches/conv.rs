//! cuDNN convolution op vs candle's stock CUDA `conv2d`: `cargo bench --features cuda --bench conv
//! -- [--device N] [--iters 10] [--warmup 3] [--oom]`.
//!
//! Cases (f32, and bf16 for the first two): `s1` 3×3 128→128 on 160×160, batch 16, pad 1,
//! stride 1; `s2` the same with stride 2; `g4` the head's grouped conv, 3×3 64→64 groups 4 on
//! 80×80, batch 16, pad 1. For each implementation (`ours-heur`: the cuDNN op with cuDNN's
//! heuristic algorithm; `ours-bench`: the cuDNN op with timed algorithm search; `stock`: candle's
//! `Tensor::conv2d`) it prints the median over `--iters` runs after `--warmup` runs, device
//! synchronized around each timed region, of the forward and of forward+backward
//! (`loss = Σ y·g`, gradients to x and w); then the relative L2 error
//! `‖ours − stock‖ / ‖stock‖` of y, dX and dW. Also timed: our two backward ops alone
//! (`bwddata`, `bwdfilter`, with dy = g) and the loss + backward bookkeeping without a
//! convolution (`lossbwd_noconv`). `--oom` also checks that an allocation failure
//! inside the op comes back as an error and the device stays usable. One line per figure:
//! `name value unit`.

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use std::time::Instant;
use yolo9::internals::cuda::conv::{
    conv2d as cudnn_conv2d, set_algo_search, AlgoSearch, Conv2dBwdData, Conv2dBwdFilter,
};
use yolo9::internals::cuda::conv_params::Conv2dParams;

#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    n: usize,
    c_in: usize,
    c_out: usize,
    hw: usize,
    k: usize,
    pad: usize,
    stride: usize,
    groups: usize,
}

#[derive(Clone, Copy, PartialEq)]
enum Impl {
    Ours(AlgoSearch),
    Stock,
}

impl Impl {
    fn label(self) -> &'static str {
        match self {
            Impl::Ours(AlgoSearch::Heuristic) => "ours-heur",
            Impl::Ours(AlgoSearch::Benchmark) => "ours-bench",
            Impl::Stock => "stock",
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn conv(imp: Impl, x: &Tensor, w: &Tensor, c: &Case) -> Result<Tensor> {
    Ok(match imp {
        Impl::Ours(m) => {
            set_algo_search(m);
            cudnn_conv2d(x, w, c.pad, c.stride, c.groups)?
        }
        Impl::Stock => x.conv2d(w, c.pad, c.stride, 1, c.groups)?,
    })
}

/// y, dX, dW of `loss = Σ conv(x, w)·g`.
fn fwd_bwd(imp: Impl, x: &Var, w: &Var, g: &Tensor, c: &Case) -> Result<[Tensor; 3]> {
    let y = conv(imp, x.as_tensor(), w.as_tensor(), c)?;
    let loss = (&y * g)?.sum_all()?;
    let grads = loss.backward()?;
    let dx = grads.get(x.as_tensor()).context("no dX")?.clone();
    let dw = grads.get(w.as_tensor()).context("no dW")?.clone();
    Ok([y, dx, dw])
}

/// Median ms of `f` over `iters` runs after `warm` runs, synchronized around each run.
fn time(dev: &Device, warm: usize, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..warm {
        f()?;
    }
    let mut v = Vec::with_capacity(iters);
    for _ in 0..iters {
        dev.synchronize()?;
        let t = Instant::now();
        f()?;
        dev.synchronize()?;
        v.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(v))
}

/// ‖a − b‖ / ‖b‖ in f64 on the CPU.
fn rel(a: &Tensor, b: &Tensor) -> Result<f64> {
    let a = a.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
    let b = b.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
    let num = (&a - &b)?.sqr()?.sum_all()?.to_scalar::<f64>()?;
    let den = b.sqr()?.sum_all()?.to_scalar::<f64>()?;
    Ok((num / den).sqrt())
}

fn run_case(dev: &Device, c: &Case, dtype: DType, warm: usize, iters: usize) -> Result<()> {
    let tag = format!(
        "{}_{}",
        c.name,
        if dtype == DType::F32 { "f32" } else { "bf16" }
    );
    let fan_in = (c.c_in / c.groups * c.k * c.k) as f64;
    let x0 = Tensor::randn(0f32, 1f32, (c.n, c.c_in, c.hw, c.hw), dev)?;
    let w0 = (Tensor::randn(0f32, 1f32, (c.c_out, c.c_in / c.groups, c.k, c.k), dev)?
        * (1.0 / fan_in.sqrt()))?;
    let ho = (c.hw + 2 * c.pad - c.k) / c.stride + 1;
    let g0 = Tensor::randn(0f32, 1f32, (c.n, c.c_out, ho, ho), dev)?;
    let x = Var::from_tensor(&x0.to_dtype(dtype)?)?;
    let w = Var::from_tensor(&w0.to_dtype(dtype)?)?;
    let g = g0.to_dtype(dtype)?;
    let impls = [
        Impl::Ours(AlgoSearch::Heuristic),
        Impl::Ours(AlgoSearch::Benchmark),
        Impl::Stock,
    ];
    let mut results: Vec<(Impl, [Tensor; 3])> = Vec::new();
    for imp in impls {
        let label = imp.label();
        // First call: algorithm choice (and, for `stock`, nothing special).
        dev.synchronize()?;
        let t = Instant::now();
        let r = fwd_bwd(imp, &x, &w, &g, c)?;
        dev.synchronize()?;
        println!(
            "{tag}_first_fwdbwd_{label} {:.3} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        let fwd = time(dev, warm, iters, || {
            conv(imp, x.as_tensor(), w.as_tensor(), c)?;
            Ok(())
        })?;
        println!("{tag}_fwd_{label} {fwd:.3} ms");
        let fb = time(dev, warm, iters, || {
            fwd_bwd(imp, &x, &w, &g, c)?;
            Ok(())
        })?;
        println!("{tag}_fwdbwd_{label} {fb:.3} ms");
        if let Impl::Ours(m) = imp {
            // The two backward convolutions alone (dy = g).
            set_algo_search(m);
            let p = Conv2dParams::new(x.dims4()?, w.dims4()?, c.pad, c.stride, c.groups)?;
            let bd = time(dev, warm, iters, || {
                g.apply_op2_no_bwd(w.as_tensor(), &Conv2dBwdData(p))?;
                Ok(())
            })?;
            println!("{tag}_bwddata_{label} {bd:.3} ms");
            let bf = time(dev, warm, iters, || {
                x.as_tensor().apply_op2_no_bwd(&g, &Conv2dBwdFilter(p))?;
                Ok(())
            })?;
            println!("{tag}_bwdfilter_{label} {bf:.3} ms");
        } else {
            // What the loss and candle's backward bookkeeping cost without any convolution:
            // loss = Σ y·g with y a leaf variable of the conv output's shape.
            let y = Var::from_tensor(&r[0])?;
            let lb = time(dev, warm, iters, || {
                (y.as_tensor() * &g)?.sum_all()?.backward()?;
                Ok(())
            })?;
            println!("{tag}_lossbwd_noconv {lb:.3} ms");
        }
        results.push((imp, r));
    }
    // Parity against candle's stock conv in the same dtype (and, for bf16, against f32 stock).
    let stock = results
        .iter()
        .find(|(i, _)| *i == Impl::Stock)
        .map(|(_, r)| r.clone())
        .context("no stock result")?;
    for (imp, r) in &results {
        if *imp == Impl::Stock {
            continue;
        }
        for (name, a, b) in [
            ("y", &r[0], &stock[0]),
            ("dx", &r[1], &stock[1]),
            ("dw", &r[2], &stock[2]),
        ] {
            println!(
                "{tag}_relerr_{name}_{}_vs_stock {:.3e} rel",
                imp.label(),
                rel(a, b)?
            );
        }
    }
    if dtype != DType::F32 {
        let x32 = Var::from_tensor(&x0)?;
        let w32 = Var::from_tensor(&w0)?;
        let r32 = fwd_bwd(Impl::Stock, &x32, &w32, &g0, c)?;
        for (imp, r) in &results {
            for (i, name) in ["y", "dx", "dw"].iter().enumerate() {
                println!(
                    "{tag}_relerr_{name}_{}_vs_stock_f32 {:.3e} rel",
                    imp.label(),
                    rel(&r[i], &r32[i])?
                );
            }
        }
    }
    Ok(())
}

/// Fills the GPU until an allocation fails, then runs the op: it must return an error; after
/// freeing, the op must work again.
fn oom_check(dev: &Device) -> Result<()> {
    let c = Case {
        name: "oom",
        n: 16,
        c_in: 128,
        c_out: 128,
        hw: 160,
        k: 3,
        pad: 1,
        stride: 1,
        groups: 1,
    };
    let x = Tensor::randn(0f32, 1f32, (c.n, c.c_in, c.hw, c.hw), dev)?;
    let w = Tensor::randn(0f32, 1f32, (c.c_out, c.c_in, c.k, c.k), dev)?;
    set_algo_search(AlgoSearch::Heuristic);
    let mut hold = Vec::new();
    let mut chunk = 4usize << 30; // bytes
    while chunk >= 1 << 20 {
        match Tensor::zeros(chunk / 4, DType::F32, dev) {
            Ok(t) => hold.push(t),
            Err(_) => chunk /= 2,
        }
    }
    dev.synchronize()?;
    let held: usize = hold.iter().map(|t| t.elem_count() * 4).sum();
    println!("oom_held {:.2} GiB", held as f64 / (1u64 << 30) as f64);
    let r = cudnn_conv2d(&x, &w, c.pad, c.stride, c.groups);
    match &r {
        Ok(_) => println!("oom_conv_returned_err 0 bool"),
        Err(e) => {
            println!("oom_conv_returned_err 1 bool");
            let msg = e.to_string();
            let first = msg.lines().next().unwrap_or("");
            eprintln!("oom error: {first}");
        }
    }
    drop(r);
    drop(hold);
    let y = cudnn_conv2d(&x, &w, c.pad, c.stride, c.groups)?;
    let s = y.sum_all()?.to_scalar::<f32>()?;
    println!("oom_after_ok {} bool", u8::from(s.is_finite()));
    Ok(())
}

fn main() -> Result<()> {
    let mut device = 0usize;
    let mut iters = 10usize;
    let mut warm = 3usize;
    let mut oom = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--device" => device = val()?.parse()?,
            "--iters" => iters = val()?.parse()?,
            "--warmup" => warm = val()?.parse()?,
            "--oom" => oom = true,
            _ => {}
        }
    }
    let dev = Device::new_cuda(device)?;
    // PTX JIT warm-up of candle's kernels used below (first use on a machine costs seconds).
    let t = Instant::now();
    {
        let a = Var::from_tensor(&Tensor::randn(0f32, 1f32, (2, 8, 16, 16), &dev)?)?;
        let k = Var::from_tensor(&Tensor::randn(0f32, 1f32, (8, 8, 3, 3), &dev)?)?;
        for bf in [false, true] {
            let (a, k) = if bf {
                (
                    Var::from_tensor(&a.to_dtype(DType::BF16)?)?,
                    Var::from_tensor(&k.to_dtype(DType::BF16)?)?,
                )
            } else {
                (a.clone(), k.clone())
            };
            let y = a.as_tensor().conv2d(k.as_tensor(), 1, 1, 1, 1)?;
            let l = (&y * &y)?.sum_all()?;
            l.backward()?;
            let y = cudnn_conv2d(a.as_tensor(), k.as_tensor(), 1, 1, 1)?;
            let l = (&y * &y)?.sum_all()?;
            l.backward()?;
        }
        dev.synchronize()?;
    }
    println!("warmup_s {:.2} s", t.elapsed().as_secs_f64());
    let base = Case {
        name: "s1",
        n: 16,
        c_in: 128,
        c_out: 128,
        hw: 160,
        k: 3,
        pad: 1,
        stride: 1,
        groups: 1,
    };
    let cases = [
        base,
        Case {
            name: "s2",
            stride: 2,
            ..base
        },
        Case {
            name: "g4",
            c_in: 64,
            c_out: 64,
            hw: 80,
            groups: 4,
            ..base
        },
    ];
    for c in &cases {
        run_case(&dev, c, DType::F32, warm, iters)?;
    }
    for c in &cases[..2] {
        run_case(&dev, c, DType::BF16, warm, iters)?;
    }
    if oom {
        oom_check(&dev)?;
    }
    Ok(())
}
