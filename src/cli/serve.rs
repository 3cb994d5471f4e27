//! `yolo9 serve`: the HTTP detection service ([`crate::serve`]) on an address, until SIGINT or
//! SIGTERM.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use super::detect::inference_dtype;
use crate::detect::config::DetectorConfig;
use crate::detect::detector::Detector;
use crate::device::{parse_device, DeviceSpec};
use crate::serve::ServeConfig;

/// Arguments of `yolo9 serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The weights and, optionally, the model they are.
    #[command(flatten)]
    pub model: super::detect::WeightsArgs,
    /// The device ([`crate::device::DEVICE_HELP`]).
    #[arg(long, default_value_t = DeviceSpec::Auto, value_parser = parse_device,
          allow_negative_numbers = true, help = crate::device::DEVICE_HELP)]
    pub device: DeviceSpec,
    /// Address to listen on (loopback by default; 0.0.0.0:PORT to accept other hosts).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// The default options of a request (a request may pass `img`, `conf`, `iou`).
    #[command(flatten)]
    pub config: DetectorConfig,
    /// Most requests in one forward.
    #[arg(long = "max-batch", default_value = "8", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_batch: u32,
    /// Milliseconds the worker waits for more requests after the first of a batch.
    #[arg(long = "max-delay-ms", default_value = "5")]
    pub max_delay_ms: u64,
    /// Requests that may wait (1 to 65536); one more is answered 503 with Retry-After.
    #[arg(long, default_value = "64", value_parser = clap::value_parser!(u32).range(1..=crate::serve::MAX_QUEUE as i64))]
    pub queue: u32,
    /// Largest request body in MiB (413 above).
    #[arg(long = "max-body-mb", default_value = "32", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_body_mb: u32,
    /// Seconds a request may wait for its answer (504 after).
    #[arg(long = "timeout-s", default_value = "30", value_parser = clap::value_parser!(u32).range(1..))]
    pub timeout_s: u32,
    /// MiB that the images of all requests in flight may hold (from their decode to their answer,
    /// by the size their header declares); a larger image is a 413, one that does not fit now a
    /// 503 with Retry-After.
    #[arg(long = "decode-budget-mb", default_value = "2048", value_parser = clap::value_parser!(u32).range(64..=1_048_576))]
    pub decode_budget_mb: u32,
    /// Connections open at most; the next one waits until one closes.
    #[arg(long = "max-conns", default_value = "512", value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub max_conns: u32,
    /// Seconds a request's header may take to arrive (also the keep-alive idle time).
    #[arg(long = "header-timeout-s", default_value = "10", value_parser = clap::value_parser!(u32).range(1..=600))]
    pub header_timeout_s: u32,
    /// Seconds without a byte read or written after which a connection is closed (at least
    /// --timeout-s + 5).
    #[arg(long = "idle-s", default_value = "10", value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub idle_s: u32,
    /// Seconds that stopping (SIGTERM, Ctrl-C) may take: requests received are answered within
    /// it; connections still open at its end are closed unanswered and the process exits.
    #[arg(long = "drain-s", default_value = "10", value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub drain_s: u32,
    /// Slowest a request body may arrive, in KiB/s, after a grace of --header-timeout-s (408 and
    /// the connection closed when it falls behind).
    #[arg(long = "min-body-rate-kb", default_value = "16", value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub min_body_rate_kb: u32,
    /// Largest `img` a request may ask for (0: --img, the served size); larger is a 400.
    #[arg(long = "max-img", default_value = "0", value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub max_img: u32,
}

/// Runs `yolo9 serve`.
pub fn run(args: ServeArgs) -> Result<()> {
    let (weights, w) = args.model.load()?;
    let (device, notice) = crate::device::open(args.device)?;
    if let Some(n) = notice {
        crate::text::errln!("{n}");
    }
    // The default size and the largest batch against the memory before serving.
    crate::footprint::check_device(
        &crate::footprint::Request {
            what: "serving a full batch",
            work: crate::footprint::Work::Infer,
            img: args.config.img_size,
            images: args.max_batch as usize,
            batch_option: Some("--max-batch"),
            split_option: None,
        },
        &device,
        None,
    )?;
    // The notice of --half on the CPU; the detector picks the same dtype.
    let _ = inference_dtype(args.config.half, &device);
    super::detect::check_classes(args.config.classes.as_deref(), &w.meta.names)?;
    let detector = Detector::with_weights(&w, device, args.config.clone())
        .with_context(|| format!("building the model from {}", crate::text::path(&weights)))?;
    let cfg = ServeConfig {
        max_batch: args.max_batch as usize,
        max_delay: Duration::from_millis(args.max_delay_ms),
        queue: args.queue as usize,
        max_body: (args.max_body_mb as usize) << 20,
        timeout: Duration::from_secs(args.timeout_s as u64),
        decode_budget: u64::from(args.decode_budget_mb) << 20,
        max_conns: args.max_conns as usize,
        header_timeout: Duration::from_secs(args.header_timeout_s as u64),
        idle: Duration::from_secs(args.idle_s as u64),
        drain: Duration::from_secs(args.drain_s as u64),
        min_body_rate: u64::from(args.min_body_rate_kb) << 10,
        max_img: args.max_img,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("serve: starting the async runtime")?;
    let r = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.addr)
            .await
            .with_context(|| format!("serve: cannot listen on {} (--addr)", args.addr))?;
        let addr = listener.local_addr()?;
        crate::text::errln!(
            "serving {} on http://{addr} (a page to try it: http://{addr}/; POST /v1/detect; GET \
             /healthz /readyz /v1/model /metrics); Ctrl-C or SIGTERM stops after answering what \
             is queued",
            crate::text::path(&weights),
        );
        let s = crate::serve::serve(listener, detector, cfg, stop_signal()).await?;
        crate::text::errln!(
            "stopped: {} requests answered, {} errors, {} batches",
            s.ok,
            s.errors,
            s.batches
        );
        Ok(())
    });
    // Decodes still running past the drain time are not waited for.
    rt.shutdown_timeout(Duration::from_millis(100));
    r
}

/// Completes at the first SIGINT or SIGTERM.
async fn stop_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term => {},
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}
