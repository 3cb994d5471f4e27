//! `yolo9 serve`: detection as an HTTP service (axum on tokio), for Rust and non-Rust clients.
//!
//! One [`Detector`] runs on a worker thread of its own (the forward never blocks the async
//! runtime). Requests go through a bounded queue to that thread, which batches them: it takes the
//! first waiting request, then waits up to [`ServeConfig::max_delay`] for more, up to
//! [`ServeConfig::max_batch`], and runs the requests with equal parameters as one
//! [`Detector::detect_batch_with`] call (images of one letterbox shape share one forward). On a
//! GPU each forward's input is padded on the device to `max_batch` images
//! ([`Detector::detect_batch_padded`]), so the forward has one shape and is replayed from its
//! CUDA graph ([`crate::model::graphs`]). A full
//! queue answers 503 with `Retry-After` at once, so a burst never waits unanswered. A queued
//! request whose client has gone, or whose [`ServeConfig::timeout`] passed (it was answered 504),
//! is dropped before its forward. The images in flight share [`ServeConfig::decode_budget`],
//! reserved from the size a picture's header declares before it is decoded (413 when it can never
//! fit, 503 with `Retry-After` when it does not fit now). Connections ([`conn`]): at most [`ServeConfig::max_conns`]
//! open, a request header due within [`ServeConfig::header_timeout`], closed after
//! [`ServeConfig::effective_idle`] without progress.
//!
//! Endpoints:
//! - `POST /v1/detect`: the image as the request body (any format the decoder reads) or as the
//!   first file field of a `multipart/form-data` body; query parameters `conf`, `iou`, `classes`
//!   (comma-separated ids), `max_det`, `img` override the service's defaults for this request.
//!   Answers `{"detections": [{"class_id", "class_name", "confidence", "xyxy"}], "width",
//!   "height", "batch", "timings_ms": {"decode", "queue", "detect", "total"}}`: the fields of
//!   `yolo9 detect --json`'s `predictions.jsonl`, boxes `xyxy` in the image's pixels (a
//!   segmentation model's detections add their outline, `"polygon": [[x, y], …]`). Errors
//!   answer `{"error": message}`: 400 (not an image, bad parameter), 413 (body over
//!   [`ServeConfig::max_body`]), 503 (queue full, or shutting down), 504 (no answer within
//!   [`ServeConfig::timeout`]), 500 (the forward failed).
//! - `GET /`: a self-contained page (no external resources, [`PAGE`]) to choose an image, send it
//!   to `/v1/detect` and see the boxes drawn with their labels on a canvas. Its body gets
//!   `data-state="done"` and `data-boxes="N"` once drawn (`tests/detect/serve.rs` drives it in a headless
//!   Chromium).
//! - `GET /healthz` (the process answers), `GET /readyz` (200 once the weights are loaded and a
//!   warm-up forward ran, 503 before), `GET /v1/model` (names, classes, input size, strides,
//!   device, dtype, batching settings), `GET /metrics` (Prometheus text: requests by outcome,
//!   queue depth, batches, images, summed decode/queue/detect seconds, requests abandoned).
//!
//! Shutdown: when the future given to [`serve`] completes (the CLI passes SIGINT/SIGTERM), the
//! listener stops accepting, requests already received are answered, the worker drains its
//! queue, and [`serve`] returns; all of it within [`ServeConfig::drain`], after which what is
//! still open is closed unanswered and [`serve`] returns anyway.
//!
//! Why one file (about 600 lines): the router, the batching worker and the metrics all work on the
//! private `Service`, `Job` and `Answer` types; split apart, those would have to become crate-
//! visible while no other module uses them.

pub(crate) mod conn;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Multipart, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use image::{DynamicImage, RgbImage};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::detect::detector::{letterbox_geometry, Detection, Detector};
use crate::detect::letterbox::{apply_letterbox, LetterboxInfo};
use crate::detect::nms::NmsOptions;

/// The most requests that may wait ([`ServeConfig::queue`]): the queue's slots are allocated at
/// start, so a huge value would abort the process instead of being refused.
pub const MAX_QUEUE: usize = 65_536;

/// Batching, limits and timeouts of the service.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Most requests in one forward (≥ 1).
    pub max_batch: usize,
    /// How long the worker waits for more requests after the first of a batch.
    pub max_delay: Duration,
    /// Requests waiting for the worker at most; one more answers 503 (1 to [`MAX_QUEUE`]).
    pub queue: usize,
    /// Largest request body in bytes; larger answers 413.
    pub max_body: usize,
    /// Longest a request waits for its answer; then 504.
    pub timeout: Duration,
    /// Bytes that the images of all requests in flight may hold together, from the start of their
    /// decode (the size their header declares, [`crate::data::image::declared_need`]) until their
    /// answer. A picture that can never fit is a 413; one that does not fit now a 503 with
    /// `Retry-After`.
    pub decode_budget: u64,
    /// Connections open at most ([`conn::Limited`]); the next waits until one closes.
    pub max_conns: usize,
    /// Longest a request's header may take to arrive (from the connection's start or the previous
    /// answer: also the keep-alive idle time); then the connection is closed.
    pub header_timeout: Duration,
    /// A connection with nothing read or written for this long is closed (a half-sent header,
    /// a stalled body, an idle keep-alive). Never less than `timeout` + 5 s, so a request being
    /// answered is not cut.
    pub idle: Duration,
    /// Longest the graceful shutdown may take once it starts: connections still open then
    /// (a client still sending, an answer still being computed) are closed unanswered and
    /// [`serve`] returns, so a SIGTERM ends the process within this time whatever clients do.
    pub drain: Duration,
    /// Slowest a request body may arrive, in bytes per second, after a grace of
    /// [`ServeConfig::header_timeout`] from the body's start: a body that falls behind
    /// (`grace + received / rate` has passed without its next bytes) is answered 408 and its
    /// connection closed, so slow bodies cannot hold connections and memory for long.
    pub min_body_rate: u64,
    /// Largest `img` a request may ask for, in pixels (0: the service's own input size): a
    /// request's forward cost grows with the square of its size, so one client asking for 4096
    /// could hold the worker for a minute while everyone else waits. Larger is a 400.
    pub max_img: u32,
}

impl ServeConfig {
    /// The idle timeout used: [`ServeConfig::idle`], at least `timeout` + 5 s.
    pub fn effective_idle(&self) -> Duration {
        self.idle.max(self.timeout + Duration::from_secs(5))
    }
}

impl Default for ServeConfig {
    /// Batches of up to 8 within 5 ms, 64 waiting, 32 MiB bodies, 30 s timeout, 2 GiB of images
    /// in flight, 512 connections,
    /// 10 s for a request header, connections closed after 35 s without progress, 10 s to drain,
    /// bodies at 16 KiB/s at least, `img` up to the service's own size.
    fn default() -> Self {
        ServeConfig {
            max_batch: 8,
            max_delay: Duration::from_millis(5),
            queue: 64,
            max_body: 32 << 20,
            timeout: Duration::from_secs(30),
            decode_budget: 2 << 30,
            max_conns: 512,
            header_timeout: Duration::from_secs(10),
            idle: Duration::from_secs(10),
            drain: Duration::from_secs(10),
            min_body_rate: 16 << 10,
            max_img: 0,
        }
    }
}

/// What [`serve`] did, once it returns.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeSummary {
    /// Requests answered 200.
    pub ok: u64,
    /// Requests answered with an error status.
    pub errors: u64,
    /// Forward batches run.
    pub batches: u64,
}

/// Per-request detection parameters (the detector's defaults unless the query overrides them).
#[derive(Debug, Clone, PartialEq)]
struct Params {
    img: u32,
    nms: NmsOptions,
}

/// The query string of `POST /v1/detect`.
#[derive(Debug, Deserialize)]
struct DetectQuery {
    conf: Option<f32>,
    iou: Option<f64>,
    classes: Option<String>,
    max_det: Option<usize>,
    img: Option<u32>,
}

/// One queued request.
struct Job {
    input: Input,
    params: Params,
    queued: Instant,
    reply: tokio::sync::oneshot::Sender<Result<Answer, String>>,
    /// The image's share of [`ServeConfig::decode_budget`], given back when the job is done.
    _mem: Reserved,
}

/// What a job hands the worker.
enum Input {
    /// The image letterboxed at the request's `img` on the decode threads (in parallel, so the
    /// worker's time per batch is the upload, forward and NMS alone).
    Letterboxed(RgbImage, LetterboxInfo),
    /// The decoded image, where the detector tiles (tiles are cut from the original).
    Image(DynamicImage),
}

/// The bytes of images in flight ([`ServeConfig::decode_budget`]).
struct MemBudget {
    cap: u64,
    used: AtomicU64,
}

/// Bytes of a [`MemBudget`] held until dropped.
struct Reserved {
    budget: Arc<MemBudget>,
    bytes: u64,
}

impl MemBudget {
    /// Reserves `bytes` if they fit beside what is held.
    fn try_reserve(budget: &Arc<MemBudget>, bytes: u64) -> Option<Reserved> {
        budget
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|&t| t <= budget.cap)
            })
            .ok()?;
        Some(Reserved {
            budget: budget.clone(),
            bytes,
        })
    }
}

impl Reserved {
    /// Adds `extra` bytes to the reservation if they fit beside what is held (`false`, and
    /// nothing added, when they do not).
    fn grow(&mut self, extra: u64) -> bool {
        let ok = self
            .budget
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(extra).filter(|&t| t <= self.budget.cap)
            })
            .is_ok();
        if ok {
            self.bytes += extra;
        }
        ok
    }

    /// Keeps only `bytes` of the reservation (the decoder's buffers are gone once decoded).
    fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.budget
                .used
                .fetch_sub(self.bytes - bytes, Ordering::AcqRel);
            self.bytes = bytes;
        }
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The worker's answer to one job.
struct Answer {
    detections: Vec<Detection>,
    queue: Duration,
    detect: Duration,
    batch: usize,
}

/// Counters behind `GET /metrics`.
#[derive(Default)]
struct Metrics {
    ok: AtomicU64,
    bad_request: AtomicU64,
    too_large: AtomicU64,
    unavailable: AtomicU64,
    timeout: AtomicU64,
    failed: AtomicU64,
    queued: AtomicU64,
    batches: AtomicU64,
    images: AtomicU64,
    decode_us: AtomicU64,
    queue_us: AtomicU64,
    detect_us: AtomicU64,
    /// Jobs dropped before their forward: their client had gone or had its 504 already.
    abandoned: AtomicU64,
}

/// The state the handlers share.
struct Service {
    tx: SyncSender<Job>,
    ready: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    defaults: Params,
    nc: usize,
    model: Value,
    cfg: ServeConfig,
    /// The model runs on the CPU: a request's `img` is checked against the free memory.
    cpu: bool,
    /// The bytes of images in flight.
    mem: Arc<MemBudget>,
    /// The detector tiles its images ([`crate::detect::DetectorConfig::tile`]): requests hand
    /// the worker the decoded image, not a letterbox.
    tiles: bool,
}

/// The page of `GET /` (HTML with its script and style inline).
pub const PAGE: &str = include_str!("page.html");

/// Serves `detector` on `listener` until `shutdown` completes, then drains and returns.
///
/// Errors: a configuration out of range (`max_batch` or `queue` 0, `queue` over [`MAX_QUEUE`]), the
/// listener failing.
/// Request errors are answers, never errors of this function.
pub async fn serve(
    listener: tokio::net::TcpListener,
    detector: Detector,
    cfg: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<ServeSummary> {
    anyhow::ensure!(
        cfg.max_batch >= 1 && cfg.queue >= 1,
        "serve: --max-batch and --queue must be at least 1"
    );
    anyhow::ensure!(cfg.max_conns >= 1, "serve: --max-conns must be at least 1");
    anyhow::ensure!(
        cfg.queue <= MAX_QUEUE,
        "serve: --queue {} is over the limit of {MAX_QUEUE} waiting requests",
        cfg.queue
    );
    let names = detector.names().to_vec();
    let meta = detector.meta();
    let model = json!({
        "names": names,
        "nc": names.len(),
        "img": detector.effective_img_size()?,
        "strides": meta.strides,
        "device": format!("{:?}", detector.device()),
        "max_batch": cfg.max_batch,
        "max_delay_ms": cfg.max_delay.as_secs_f64() * 1e3,
        "queue": cfg.queue,
    });
    let defaults = Params {
        img: detector.requested_img_size(),
        nms: detector.nms_options(),
    };
    let cpu = detector.device().is_cpu();
    let tiles = detector.config().tile.on();
    let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(cfg.queue);
    let ready = Arc::new(AtomicBool::new(false));
    let metrics = Arc::new(Metrics::default());
    // The worker says when it has stopped (a panic drops the sender unsent), so that waiting for
    // it can be bounded by the drain time without a blocking join.
    let (worker_done, worker_stopped) = tokio::sync::oneshot::channel::<()>();
    {
        let (ready, metrics, cfg) = (ready.clone(), metrics.clone(), cfg.clone());
        std::thread::Builder::new()
            .name("yolo9-serve-worker".into())
            .spawn(move || {
                work(detector, rx, &cfg, &ready, &metrics);
                let _ = worker_done.send(());
            })
            .context("serve: starting the detection worker")?;
    }
    let svc = Arc::new(Service {
        tx,
        ready,
        metrics: metrics.clone(),
        defaults,
        nc: names.len(),
        model,
        cfg: cfg.clone(),
        cpu,
        mem: Arc::new(MemBudget {
            cap: cfg.decode_budget,
            used: AtomicU64::new(0),
        }),
        tiles,
    });
    let app = router(svc);
    let listener = conn::Limited::new(
        listener,
        cfg.max_conns,
        cfg.effective_idle(),
        cfg.header_timeout,
    );
    // The shutdown signal, seen by the server (stop accepting, finish what is open) and by the
    // drain deadline (then stop waiting).
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopping = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let drain = cfg.drain;
    let drained = {
        let rx = stop_rx.clone();
        async move {
            stopping(rx).await;
            tokio::time::sleep(drain).await;
        }
    };
    tokio::pin!(drained);
    let server = axum::serve(listener, app).with_graceful_shutdown(stopping(stop_rx));
    tokio::select! {
        r = server => {
            r.context("serve: the HTTP server failed")?;
            // The router (and with it the queue's sender) is gone: the worker answers what is
            // queued and stops.
            tokio::select! {
                r = worker_stopped => {
                    r.map_err(|_| anyhow::anyhow!("serve: the detection worker panicked"))?;
                }
                _ = &mut drained => {
                    tracing::warn!("serve: the worker was still busy at the end of the drain time");
                }
            }
        }
        _ = &mut drained => {
            tracing::warn!(
                "serve: connections still open after the drain time ({:?}) are closed",
                drain
            );
        }
    }
    let m = &metrics;
    let errors = [
        &m.bad_request,
        &m.too_large,
        &m.unavailable,
        &m.timeout,
        &m.failed,
    ]
    .iter()
    .map(|c| c.load(Ordering::Relaxed))
    .sum();
    Ok(ServeSummary {
        ok: m.ok.load(Ordering::Relaxed),
        errors,
        batches: m.batches.load(Ordering::Relaxed),
    })
}

fn router(svc: Arc<Service>) -> Router {
    // Multipart bodies obey the same limit (the raw body is read with it explicitly).
    let limit = svc.cfg.max_body;
    Router::new()
        .route("/", get(|| async { axum::response::Html(PAGE) }))
        .route("/v1/detect", post(detect))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/v1/model", get(model))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(svc)
}

/// The worker thread: warm-up, then batches until the queue's sender is dropped and the queue
/// is empty.
fn work(det: Detector, rx: Receiver<Job>, cfg: &ServeConfig, ready: &AtomicBool, m: &Metrics) {
    let warm = DynamicImage::new_rgb8(64, 64);
    if let Err(e) = det.detect_batch(&[warm]) {
        tracing::warn!("serve: the warm-up forward failed: {e:#}");
    }
    ready.store(true, Ordering::Release);
    let pad = !det.device().is_cpu() && cfg.max_batch > 1;
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        let until = Instant::now() + cfg.max_delay;
        while jobs.len() < cfg.max_batch {
            let left = until.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        m.queued.fetch_sub(jobs.len() as u64, Ordering::Relaxed);
        // A job whose answer nobody waits for any more (the client disconnected, or its
        // `timeout` passed and it was answered 504) is dropped, not detected.
        let waiting = jobs.len();
        jobs.retain(|j| !j.reply.is_closed());
        m.abandoned
            .fetch_add((waiting - jobs.len()) as u64, Ordering::Relaxed);
        while !jobs.is_empty() {
            let params = jobs[0].params.clone();
            let (same, rest): (Vec<Job>, Vec<Job>) =
                jobs.into_iter().partition(|j| j.params == params);
            jobs = rest;
            let start = Instant::now();
            // The images move into the batch (no copy); the rest of each job answers it.
            // Each image's share of the budget is held until its answer is ready.
            let (inputs, replies): (Vec<Input>, Vec<_>) = same
                .into_iter()
                .map(|j| (j.input, (j.queued, j.reply, j._mem)))
                .unzip();
            // On the GPU one batch shape, so the forward is replayed from its CUDA graph
            // (batches of varying size would each be launched op by op).
            let pad_to = if pad { cfg.max_batch } else { 0 };
            let out = detect_inputs(&det, inputs, &params, pad_to);
            let detect = start.elapsed();
            m.batches.fetch_add(1, Ordering::Relaxed);
            m.images.fetch_add(replies.len() as u64, Ordering::Relaxed);
            m.detect_us
                .fetch_add(detect.as_micros() as u64, Ordering::Relaxed);
            let n = replies.len();
            match out {
                Ok(all) => {
                    for ((queued, reply, mem), detections) in replies.into_iter().zip(all) {
                        // The image's share of the budget is free before its client hears back.
                        drop(mem);
                        let queue = start.saturating_duration_since(queued);
                        m.queue_us
                            .fetch_add(queue.as_micros() as u64, Ordering::Relaxed);
                        let _ = reply.send(Ok(Answer {
                            detections,
                            queue,
                            detect,
                            batch: n,
                        }));
                    }
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    for (_, reply, mem) in replies {
                        drop(mem);
                        let _ = reply.send(Err(msg.clone()));
                    }
                }
            }
        }
    }
}

/// The detections of one batch of inputs with equal parameters: the letterboxed ones through
/// one forward per letterbox shape, the decoded ones (a tiling detector) through
/// [`Detector::detect_batch_padded`].
fn detect_inputs(
    det: &Detector,
    inputs: Vec<Input>,
    params: &Params,
    pad_to: usize,
) -> Result<Vec<Vec<Detection>>> {
    let (mut lbs, mut imgs) = (Vec::new(), Vec::new());
    let mut letterboxed = Vec::with_capacity(inputs.len());
    for input in inputs {
        letterboxed.push(matches!(input, Input::Letterboxed(..)));
        match input {
            Input::Letterboxed(img, info) => lbs.push((img, info)),
            Input::Image(img) => imgs.push(img),
        }
    }
    let mut from_lbs = if lbs.is_empty() {
        Vec::new()
    } else {
        det.detect_letterboxed(&lbs, &params.nms, pad_to)?
    }
    .into_iter();
    let mut from_imgs = if imgs.is_empty() {
        Vec::new()
    } else {
        det.detect_batch_padded(&imgs, params.img, &params.nms, pad_to)?
    }
    .into_iter();
    // Each kind keeps its order: the answers interleave back by the inputs' kinds.
    Ok(letterboxed
        .into_iter()
        .map(|lb| {
            if lb {
                from_lbs.next()
            } else {
                from_imgs.next()
            }
            .unwrap_or_default()
        })
        .collect())
}

/// An error answer `{"error": msg}`, counted.
fn fail(svc: &Service, status: StatusCode, msg: impl Into<String>) -> Response {
    let m = &svc.metrics;
    let c = match status {
        StatusCode::BAD_REQUEST => &m.bad_request,
        StatusCode::PAYLOAD_TOO_LARGE => &m.too_large,
        StatusCode::SERVICE_UNAVAILABLE => &m.unavailable,
        StatusCode::GATEWAY_TIMEOUT | StatusCode::REQUEST_TIMEOUT => &m.timeout,
        _ => &m.failed,
    };
    c.fetch_add(1, Ordering::Relaxed);
    let body = Json(json!({ "error": msg.into() }));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        (status, [(header::RETRY_AFTER, "1")], body).into_response()
    } else {
        (status, body).into_response()
    }
}

/// The request's parameters: the defaults, overridden by the query; checked here so a bad value
/// is a 400 naming it.
fn params(svc: &Service, q: &DetectQuery) -> std::result::Result<Params, String> {
    let mut p = svc.defaults.clone();
    if let Some(c) = q.conf {
        if !(0.0..=1.0).contains(&c) {
            return Err(format!("conf={c} is outside [0, 1]"));
        }
        p.nms.conf_thres = c;
    }
    if let Some(i) = q.iou {
        if !(0.0..=1.0).contains(&i) {
            return Err(format!("iou={i} is outside [0, 1]"));
        }
        p.nms.iou_thres = i;
    }
    if let Some(m) = q.max_det {
        if !(1..=30_000).contains(&m) {
            return Err(format!("max_det={m} is outside 1..=30000"));
        }
        p.nms.max_det = m;
    }
    if let Some(s) = q.img {
        if !(32..=4096).contains(&s) {
            return Err(format!("img={s} is outside 32..=4096 pixels"));
        }
        if svc.cpu && s > svc.defaults.img {
            // A full batch at this size must fit the free memory (`crate::footprint`).
            let free = crate::memory::MemoryProbe::new(&candle_core::Device::Cpu)
                .map(|p| p.free_bytes())
                .unwrap_or(0);
            let need =
                crate::footprint::estimate(crate::footprint::Work::Infer, s, svc.cfg.max_batch);
            if free > 0 && need > free {
                return Err(format!(
                    "img={s}: a full batch of {} images needs about {} on the CPU, but {} is \
                     free; use a smaller img (the default is {})",
                    svc.cfg.max_batch,
                    crate::memory::fmt_size(need),
                    crate::memory::fmt_size(free),
                    svc.defaults.img
                ));
            }
        }
        let max = if svc.cfg.max_img == 0 {
            svc.defaults.img
        } else {
            svc.cfg.max_img
        };
        if s > max {
            return Err(format!(
                "img={s} is over this service's largest input size {max} pixels (serve \
                 --max-img); use a smaller img"
            ));
        }
        p.img = s;
    }
    if let Some(cs) = &q.classes {
        let mut v = Vec::new();
        for t in cs.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            match t.parse::<usize>() {
                Ok(c) if c < svc.nc => v.push(c),
                _ => {
                    return Err(format!(
                        "classes: {t:?} is not a class id in 0..{} (comma-separated ids)",
                        svc.nc
                    ))
                }
            }
        }
        p.nms.classes = Some(v);
    }
    Ok(p)
}

/// The whole body of `req`, read as it streams in: at most [`ServeConfig::max_body`] bytes (413
/// past it, or at once when `Content-Length` says more), every byte held counted in `mem` (503
/// with `Retry-After` when the budget of bytes in flight has no room), and at least
/// [`ServeConfig::min_body_rate`] after the grace of [`ServeConfig::header_timeout`] (408 and the
/// connection closed when it falls behind). With `sniff` (a raw image body), a picture whose
/// header, in the first bytes, declares more than the whole budget is a 413 before the rest of
/// the body is read (a decompression bomb costs its first kilobytes, not its megabytes).
async fn read_body(
    svc: &Service,
    req: Request,
    mem: &mut Reserved,
    sniff: bool,
) -> std::result::Result<(axum::http::request::Parts, Bytes), Response> {
    use axum::body::HttpBody;
    let (parts, mut body) = req.into_parts();
    let max = svc.cfg.max_body as u64;
    let too_large = || {
        fail(
            svc,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the service's limit of {max} bytes"),
        )
    };
    let no_room = |n: u64| {
        fail(
            svc,
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "no room for a body of {n} bytes: the requests in flight hold {} of the {} MB \
                 budget (--decode-budget-mb); retry later",
                svc.mem.used.load(Ordering::Acquire) >> 20,
                svc.mem.cap >> 20
            ),
        )
    };
    let declared = body.size_hint().exact();
    let mut buf: Vec<u8> = Vec::new();
    // The bytes of `buf` reserved in `mem` (its capacity, which may exceed its length).
    let mut held = 0u64;
    // A declared length over the limit is refused before any byte is read; the room is
    // reserved as the bytes arrive (a slow body declaring 30 MB holds what it sent, not 30 MB).
    if declared.is_some_and(|n| n > max) {
        return Err(too_large());
    }
    let start = tokio::time::Instant::now();
    let rate = svc.cfg.min_body_rate.max(1) as f64;
    let mut sniffing = sniff;
    loop {
        let due = start + svc.cfg.header_timeout + Duration::from_secs_f64(buf.len() as f64 / rate);
        let next = std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx));
        let frame = match tokio::time::timeout_at(due, next).await {
            Ok(f) => f,
            Err(_) => {
                let mut r = fail(
                    svc,
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request body arrived slower than {} bytes/s ({} bytes in {:.1} s)",
                        svc.cfg.min_body_rate,
                        buf.len(),
                        start.elapsed().as_secs_f64()
                    ),
                );
                r.headers_mut().insert(
                    header::CONNECTION,
                    header::HeaderValue::from_static("close"),
                );
                return Err(r);
            }
        };
        let data = match frame {
            None => break,
            Some(Err(e)) => {
                return Err(fail(
                    svc,
                    StatusCode::BAD_REQUEST,
                    format!("reading the request body: {e}"),
                ))
            }
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
        };
        if buf.len() as u64 + data.len() as u64 > max {
            return Err(too_large());
        }
        let want = (buf.len() + data.len()) as u64;
        if want > held {
            // Room for the data, doubling as a Vec would, reserved before it is allocated.
            let cap = want.max(2 * held).min(declared.unwrap_or(max)).max(want);
            if !mem.grow(cap - held) {
                return Err(no_room(cap));
            }
            buf.reserve_exact(cap as usize - buf.len());
            held = cap.max(buf.capacity() as u64);
        }
        buf.extend_from_slice(&data);
        if sniffing && buf.len() >= 64 {
            if let Some((w, h, n)) = crate::data::image::declared_need(&buf) {
                sniffing = false;
                if n > svc.mem.cap {
                    let mut r = too_big_image(svc, w, h, n);
                    r.headers_mut().insert(
                        header::CONNECTION,
                        header::HeaderValue::from_static("close"),
                    );
                    return Err(r);
                }
            } else if buf.len() >= 64 << 10 {
                // No header readable in the first 64 KiB: the decode will say why.
                sniffing = false;
            }
        }
    }
    Ok((parts, Bytes::from(buf)))
}

/// The 413 of a picture whose header declares `w` x `h` pixels, `n` bytes to decode, over the
/// whole budget of images in flight.
fn too_big_image(svc: &Service, w: u32, h: u32, n: u64) -> Response {
    let limit = svc.mem.cap.min(crate::data::image::MAX_DECODE_BYTES);
    fail(
        svc,
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the image declares {w}x{h} pixels: decoding it needs about {} MB, over the {} MB \
             an image may take (the service's budget for images in flight, --decode-budget-mb, \
             and the decoding-bomb guard's {} MB)",
            mb(n),
            mb(limit),
            mb(crate::data::image::MAX_DECODE_BYTES)
        ),
    )
}

/// The image bytes of a request: the body, or the first file field of a multipart body (the
/// body read by [`read_body`] first, its bytes counted in `mem`).
async fn body_bytes(
    svc: &Service,
    req: Request,
    mem: &mut Reserved,
) -> std::result::Result<Bytes, Response> {
    let multipart = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    let (parts, raw) = read_body(svc, req, mem, !multipart).await?;
    let too_large = |svc: &Service| {
        fail(
            svc,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is larger than the service's limit of {} bytes",
                svc.cfg.max_body
            ),
        )
    };
    if !multipart {
        return Ok(raw);
    }
    let req = Request::from_parts(parts, axum::body::Body::from(raw));
    let mut mp = Multipart::from_request(req, &())
        .await
        .map_err(|e| fail(svc, StatusCode::BAD_REQUEST, format!("multipart body: {e}")))?;
    loop {
        match mp.next_field().await {
            Ok(Some(f)) if f.file_name().is_some() || f.name() == Some("image") => {
                return f.bytes().await.map_err(|e| {
                    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                        too_large(svc)
                    } else {
                        fail(svc, StatusCode::BAD_REQUEST, format!("multipart body: {e}"))
                    }
                });
            }
            Ok(Some(_)) => continue,
            Ok(None) => return Err(fail(
                svc,
                StatusCode::BAD_REQUEST,
                "multipart body has no file field (send the image as a file, or as the raw body)",
            )),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(too_large(svc)),
            Err(e) => {
                return Err(fail(
                    svc,
                    StatusCode::BAD_REQUEST,
                    format!("multipart body: {e}"),
                ))
            }
        }
    }
}

async fn detect(
    State(svc): State<Arc<Service>>,
    q: std::result::Result<Query<DetectQuery>, axum::extract::rejection::QueryRejection>,
    req: Request,
) -> Response {
    let t0 = Instant::now();
    let q = match q {
        Ok(Query(q)) => q,
        Err(e) => return fail(&svc, StatusCode::BAD_REQUEST, format!("query: {e}")),
    };
    let params = match params(&svc, &q) {
        Ok(p) => p,
        Err(e) => return fail(&svc, StatusCode::BAD_REQUEST, e),
    };
    // The body's bytes, then the decode's, are held in the budget of bytes in flight.
    let mut mem = match MemBudget::try_reserve(&svc.mem, 0) {
        Some(r) => r,
        None => unreachable!("reserving 0 bytes always fits"),
    };
    let bytes = match body_bytes(&svc, req, &mut mem).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if bytes.is_empty() {
        return fail(
            &svc,
            StatusCode::BAD_REQUEST,
            "empty body: send the image bytes as the body (or as a multipart file)",
        );
    }
    if let Err(r) = reserve_decode(&svc, &bytes, &mut mem) {
        return *r;
    }
    // The decode stops (at the next JPEG scan) once this request is dropped (its client has
    // gone) or its timeout has passed, instead of burning a core for nobody.
    let gone = Arc::new(AtomicBool::new(false));
    let _set_gone = SetOnDrop(gone.clone());
    let deadline = t0 + svc.cfg.timeout;
    let stop = move || gone.load(Ordering::Relaxed) || Instant::now() >= deadline;
    let decoded =
        tokio::task::spawn_blocking(move || crate::data::image::decode_rgb8_until(&bytes, stop))
            .await;
    let img = match decoded {
        Ok(Ok(img)) => img,
        Ok(Err(e)) if e.is::<crate::data::image::DecodeStopped>() => {
            return fail(
                &svc,
                StatusCode::GATEWAY_TIMEOUT,
                format!("the image did not decode within {:?}", svc.cfg.timeout),
            )
        }
        Ok(Err(e)) => {
            return fail(
                &svc,
                StatusCode::BAD_REQUEST,
                format!("the body is not a readable image: {e:#}"),
            )
        }
        Err(e) => return fail(&svc, StatusCode::INTERNAL_SERVER_ERROR, format!("{e}")),
    };
    let decode = t0.elapsed();
    svc.metrics
        .decode_us
        .fetch_add(decode.as_micros() as u64, Ordering::Relaxed);
    let (w, h) = img.dimensions();
    // Decoded: only the RGB pixels stay until the letterbox is made.
    mem.shrink_to(3 * u64::from(w) * u64::from(h));
    let input = match letterboxed(&svc, img, params.img, &mut mem).await {
        Ok(i) => i,
        Err(r) => return *r,
    };
    let a = match queue_and_wait(&svc, input, params, mem).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    svc.metrics.ok.fetch_add(1, Ordering::Relaxed);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let dets: Vec<Value> = a
        .detections
        .iter()
        .map(|d| {
            let mut v = json!({
                "class_id": d.class_id,
                "class_name": d.class_name,
                "confidence": d.confidence,
                "xyxy": d.bbox,
            });
            if let Some(m) = &d.mask {
                // A segmentation model: the outline in the image's pixels, as in
                // predictions.jsonl.
                v["polygon"] = json!(m.polygon);
            }
            v
        })
        .collect();
    Json(json!({
        "detections": dets,
        "width": w,
        "height": h,
        "batch": a.batch,
        "timings_ms": {
            "decode": ms(decode),
            "queue": ms(a.queue),
            "detect": ms(a.detect),
            "total": ms(t0.elapsed()),
        },
    }))
    .into_response()
}

/// Sets its flag when dropped: the request it lives in is over (answered, or dropped because
/// its client has gone).
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The decode memory of the image `bytes`, from the size its header declares, added to `mem`
/// (the body's reservation in the budget of images in flight) before decoding; the answer when
/// it is over the whole budget (413) or does not fit beside the images in flight (503). A header
/// that cannot be read reserves nothing more: the decode says why (its own guard bounds it).
fn reserve_decode(
    svc: &Service,
    bytes: &[u8],
    mem: &mut Reserved,
) -> std::result::Result<(), Box<Response>> {
    let Some((w, h, n)) = crate::data::image::declared_need(bytes) else {
        return Ok(());
    };
    // Over the budget, or over what the decoder's own guard accepts: refused before any decode.
    if n > svc.mem.cap || n > crate::data::image::MAX_DECODE_BYTES {
        return Err(Box::new(too_big_image(svc, w, h, n)));
    }
    grow_or_busy(svc, mem, n, || {
        format!("the image ({w}x{h}) needs about {} MB to decode", mb(n))
    })
}

/// `bytes` in whole MiB, rounded up (the unit of `--decode-budget-mb` and its messages).
fn mb(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

/// `need` more bytes held by `mem`, or a 503 naming `what` (what needs them and how many MB)
/// and how much of the budget the images in flight hold.
fn grow_or_busy(
    svc: &Service,
    mem: &mut Reserved,
    need: u64,
    what: impl FnOnce() -> String,
) -> std::result::Result<(), Box<Response>> {
    if mem.grow(need) {
        return Ok(());
    }
    Err(Box::new(fail(
        svc,
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "{}; the images in flight hold {} of the {} MB budget: retry later",
            what(),
            mb(svc.mem.used.load(Ordering::Acquire)),
            mb(svc.mem.cap)
        ),
    )))
}

/// The job's input from the decoded image: its letterbox at `img_size`, made on a blocking
/// thread (so in parallel across requests, off the worker), its bytes added to `mem` while it is
/// made and the decoded image's given back after (413 when the two can never fit in the budget,
/// 503 when they do not fit now); the decoded image itself where the detector tiles.
async fn letterboxed(
    svc: &Service,
    img: RgbImage,
    img_size: u32,
    mem: &mut Reserved,
) -> std::result::Result<Input, Box<Response>> {
    if svc.tiles {
        return Ok(Input::Image(DynamicImage::ImageRgb8(img)));
    }
    let info = letterbox_geometry(img.width(), img.height(), img_size).map_err(|e| {
        Box::new(fail(
            svc,
            StatusCode::BAD_REQUEST,
            format!("img={img_size}: {e:#}"),
        ))
    })?;
    let need = 3 * u64::from(info.out_w()) * u64::from(info.out_h());
    let (w, h) = img.dimensions();
    if mem.bytes + need > svc.mem.cap {
        return Err(Box::new(fail(
            svc,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the image ({w}x{h}) and its letterbox at img={img_size} need about {} MB, over \
                 the service's budget for images in flight ({} MB, --decode-budget-mb): send a \
                 smaller image or img",
                mb(mem.bytes + need),
                mb(svc.mem.cap)
            ),
        )));
    }
    grow_or_busy(svc, mem, need, || {
        format!(
            "the letterbox of the image ({w}x{h}) at img={img_size} needs about {} MB",
            mb(need)
        )
    })?;
    let lb = tokio::task::spawn_blocking(move || apply_letterbox(&img, &info))
        .await
        .map_err(|e| Box::new(fail(svc, StatusCode::INTERNAL_SERVER_ERROR, format!("{e}"))))?;
    mem.shrink_to(need);
    Ok(Input::Letterboxed(lb, info))
}

/// Queues the job's `input` for the detection worker and waits for its answer (up to the
/// service's timeout); the error answer when the queue is full (503), the service is stopping
/// (503), the worker failed (500) or the time ran out (504).
async fn queue_and_wait(
    svc: &Service,
    input: Input,
    params: Params,
    mem: Reserved,
) -> std::result::Result<Answer, Response> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = Job {
        input,
        params,
        queued: Instant::now(),
        reply,
        _mem: mem,
    };
    svc.metrics.queued.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = svc.tx.try_send(job) {
        svc.metrics.queued.fetch_sub(1, Ordering::Relaxed);
        let why = match e {
            TrySendError::Full(_) => format!(
                "the queue is full ({} requests waiting); retry later",
                svc.cfg.queue
            ),
            TrySendError::Disconnected(_) => "the service is shutting down".to_string(),
        };
        return Err(fail(svc, StatusCode::SERVICE_UNAVAILABLE, why));
    }
    match tokio::time::timeout(svc.cfg.timeout, answer).await {
        Ok(Ok(Ok(a))) => Ok(a),
        Ok(Ok(Err(e))) => Err(fail(svc, StatusCode::INTERNAL_SERVER_ERROR, e)),
        Ok(Err(_)) => Err(fail(
            svc,
            StatusCode::INTERNAL_SERVER_ERROR,
            "the detection worker stopped",
        )),
        Err(_) => Err(fail(
            svc,
            StatusCode::GATEWAY_TIMEOUT,
            format!("no answer within {:?}", svc.cfg.timeout),
        )),
    }
}

async fn readyz(State(svc): State<Arc<Service>>) -> Response {
    if svc.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "warming up\n").into_response()
    }
}

async fn model(State(svc): State<Arc<Service>>) -> Json<Value> {
    Json(svc.model.clone())
}

async fn metrics(State(svc): State<Arc<Service>>) -> Response {
    let m = &svc.metrics;
    let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let s = |c: &AtomicU64| g(c) as f64 / 1e6;
    let mut out = String::new();
    out.push_str("# HELP yolo9_requests_total Detection requests answered, by outcome.\n");
    out.push_str("# TYPE yolo9_requests_total counter\n");
    for (k, c) in [
        ("ok", &m.ok),
        ("bad_request", &m.bad_request),
        ("too_large", &m.too_large),
        ("unavailable", &m.unavailable),
        ("timeout", &m.timeout),
        ("failed", &m.failed),
    ] {
        out.push_str(&format!(
            "yolo9_requests_total{{outcome=\"{k}\"}} {}\n",
            g(c)
        ));
    }
    out.push_str("# TYPE yolo9_queue_depth gauge\n");
    out.push_str(&format!("yolo9_queue_depth {}\n", g(&m.queued)));
    out.push_str("# HELP yolo9_abandoned_total Requests dropped before detection (client gone or timed out).\n");
    out.push_str("# TYPE yolo9_abandoned_total counter\n");
    out.push_str(&format!("yolo9_abandoned_total {}\n", g(&m.abandoned)));
    out.push_str("# TYPE yolo9_batches_total counter\n");
    out.push_str(&format!("yolo9_batches_total {}\n", g(&m.batches)));
    out.push_str("# TYPE yolo9_images_total counter\n");
    out.push_str(&format!("yolo9_images_total {}\n", g(&m.images)));
    out.push_str("# TYPE yolo9_seconds_total counter\n");
    for (k, c) in [
        ("decode", &m.decode_us),
        ("queue", &m.queue_us),
        ("detect", &m.detect_us),
    ] {
        out.push_str(&format!(
            "yolo9_seconds_total{{phase=\"{k}\"}} {:.6}\n",
            s(c)
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}
