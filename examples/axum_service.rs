//! A detection endpoint inside your own axum service: what to copy when `yolo9 serve` (the full
//! service, `yolo9::serve`) is more than you need.
//!
//! ```text
//! cargo run --release --example axum_service -- weights/yolov9-s-bccd.safetensors 127.0.0.1:8080
//! curl --data-binary @examples/images/BloodImage_00007.jpg http://127.0.0.1:8080/detect
//! ```
//! One `Detector` is shared by all requests (it is `Send + Sync`); decoding and the forward run
//! on tokio's blocking pool, never on the async workers.
use std::sync::Arc;

use axum::{body::Bytes, extract::State, http::StatusCode, routing::post, Json, Router};
use yolo9::{Detection, Detector, DetectorConfig};

async fn detect(
    State(det): State<Arc<Detector>>,
    body: Bytes,
) -> Result<Json<Vec<Detection>>, (StatusCode, String)> {
    let run = move || -> Result<Vec<Detection>, (StatusCode, String)> {
        // The decoder applies EXIF orientation and refuses oversized images.
        let img = yolo9::data::image::decode_rgb8(&body)
            .map_err(|e| (StatusCode::BAD_REQUEST, format!("{e:#}")))?;
        // The library's errors say what kind of failure it was.
        det.detect_rgb(&img).map_err(|e| match e {
            yolo9::Error::OutOfMemory(_) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            yolo9::Error::InvalidOption(_) => (StatusCode::BAD_REQUEST, e.to_string()),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        })
    };
    match tokio::task::spawn_blocking(run).await {
        Ok(r) => r.map(Json),
        Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let weights = args
        .next()
        .unwrap_or("weights/yolov9-s-bccd.safetensors".into());
    let addr = args.next().unwrap_or("127.0.0.1:8080".into());
    let device = yolo9::device::select(yolo9::device::DeviceSpec::Auto)?;
    // The detector's options from the service's own configuration (here one JSON value in an
    // environment variable, e.g. DETECTOR='{"conf": 0.4, "imgsz": 512}'; unknown keys refused,
    // missing ones the official defaults), checked once, here.
    let config: DetectorConfig = match std::env::var("DETECTOR") {
        Ok(json) => serde_json::from_str(&json)?,
        Err(_) => DetectorConfig::default(),
    };
    let det = Arc::new(Detector::new(&weights, device, config)?);
    let app = Router::new().route("/detect", post(detect)).with_state(det);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("POST images to http://{addr}/detect");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
