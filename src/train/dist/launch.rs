//! `yolo9 train --device 0,1,...`: one training process per device, started and waited for
//! by the command ([`launch`]).

use crate::device::DeviceSpec;
use crate::train::trainer::StopFlag;
use anyhow::Result;

/// `yolo9 train --device 0,1,...` without a group in the environment: starts this program once
/// per device with the same arguments and torchrun's variables (`WORLD_SIZE` = the number of
/// devices, `RANK` = `LOCAL_RANK` = its index, `MASTER_ADDR` 127.0.0.1, `MASTER_PORT` from the
/// environment or a free port) and waits for them all. A stop signal reaches every process of the
/// terminal's group; this one waits for them. Errors name each rank that failed, with its exit
/// status.
pub fn launch(devices: &[DeviceSpec]) -> Result<()> {
    #[cfg(not(feature = "cuda"))]
    if devices.iter().any(|d| matches!(d, DeviceSpec::Cuda(_))) {
        anyhow::bail!(
            "--device {}: this yolo9 was built without CUDA (the `cuda` feature), so it cannot \
             train on GPUs; use --device cpu",
            devices
                .iter()
                .map(|d| match d {
                    // As the user writes it: `--device 0,1`.
                    DeviceSpec::Cuda(i) => i.to_string(),
                    d => d.to_string(),
                })
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    let n = devices.len();
    let port = match crate::switches::var("MASTER_PORT").ok_or(()) {
        Ok(p) => p,
        Err(_) => std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port().to_string())?,
    };
    let exe = std::env::current_exe()?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    // A stop signal is for the ranks (they save and stop together); this process waits.
    let _stop = StopFlag::install()?;
    let mut children = Vec::with_capacity(n);
    for r in 0..n {
        let child = std::process::Command::new(&exe)
            .args(&args)
            .env("WORLD_SIZE", n.to_string())
            .env("RANK", r.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", &port)
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting rank {r} ({}): {e}", crate::text::path(&exe)))?;
        children.push(child);
    }
    let mut failed = Vec::new();
    for (r, mut c) in children.into_iter().enumerate() {
        let st = c.wait()?;
        if !st.success() {
            failed.push(format!("rank {r} ({st})"));
        }
    }
    anyhow::ensure!(
        failed.is_empty(),
        "data-parallel training failed: {} (each rank printed its error above)",
        failed.join(", ")
    );
    Ok(())
}
