//! The torchrun-style environment of a rank: `WORLD_SIZE`, `RANK`, `LOCAL_RANK`, `MASTER_ADDR`,
//! `MASTER_PORT` (the names of `torch.distributed.run`), `YOLO9_DIST_TIMEOUT` (seconds, the
//! timeout of every collective operation, default [`super::DEFAULT_TIMEOUT`]) and
//! `YOLO9_DIST_BACKEND` (how gradients are summed, [`Backend`]).

use super::socket::SocketRank;
use super::BACKEND_ENV;
use anyhow::{ensure, Context, Result};
use std::time::Duration;

/// Environment variable: the timeout of every collective operation in seconds.
pub const TIMEOUT_ENV: &str = "YOLO9_DIST_TIMEOUT";

/// How the ranks sum their gradients (torch.distributed's `backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// On the GPUs through NCCL ([`super::nccl::NcclRank`]; `cuda` builds, CUDA devices): the
    /// default on a CUDA device.
    Nccl,
    /// Through the host over TCP ([`SocketRank`]): the default on the CPU.
    Tcp,
}

impl Backend {
    /// The backend `value` of [`BACKEND_ENV`] names (`None`: unset, the default for `cuda`
    /// devices or not). Errors name the variable and the value.
    pub fn choose(value: Option<&str>, on_cuda: bool) -> Result<Backend> {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") => Ok(if on_cuda { Backend::Nccl } else { Backend::Tcp }),
            Some("nccl") => {
                ensure!(
                    on_cuda,
                    "{BACKEND_ENV}=nccl needs CUDA devices (--device 0,1,...); the CPU sums \
                     through tcp"
                );
                Ok(Backend::Nccl)
            }
            Some("tcp") | Some("gloo") => Ok(Backend::Tcp),
            Some(v) => anyhow::bail!("{BACKEND_ENV}={v}: expected nccl or tcp"),
        }
    }
}

/// A rank's place in a group, as the environment gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupEnv {
    /// `WORLD_SIZE`: the number of ranks (processes).
    pub world: usize,
    /// `RANK`: this process's rank, `0..world`.
    pub rank: usize,
    /// `LOCAL_RANK`: its index among the ranks of this host (picks its GPU); `RANK` when unset.
    pub local_rank: usize,
    /// `MASTER_ADDR:MASTER_PORT` (default `127.0.0.1:29500`, torchrun's port).
    pub addr: String,
    /// `YOLO9_DIST_TIMEOUT` seconds, or [`super::DEFAULT_TIMEOUT`].
    pub timeout: Duration,
}

impl GroupEnv {
    /// Reads the environment through `get` (e.g. `crate::switches::var`): `None` when
    /// `WORLD_SIZE` is unset. Errors name the variable and its value (not a number, a rank not
    /// below the world size, a timeout that is not a positive number of seconds).
    pub fn read(get: impl Fn(&str) -> Option<String>) -> Result<Option<GroupEnv>> {
        let Some(w) = get("WORLD_SIZE") else {
            return Ok(None);
        };
        let num = |k: &str, v: &str| -> Result<usize> {
            v.trim()
                .parse()
                .with_context(|| format!("{k}={v}: not a whole number"))
        };
        let world = num("WORLD_SIZE", &w)?;
        ensure!(world >= 1, "WORLD_SIZE={w}: at least 1");
        let rank = match get("RANK") {
            Some(v) => num("RANK", &v)?,
            None => 0,
        };
        ensure!(
            rank < world,
            "RANK={rank} with WORLD_SIZE={world}: the rank must be below the world size"
        );
        let local_rank = match get("LOCAL_RANK") {
            Some(v) => num("LOCAL_RANK", &v)?,
            None => rank,
        };
        let host = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        let port = get("MASTER_PORT").unwrap_or_else(|| "29500".into());
        let port: u16 = port
            .trim()
            .parse()
            .with_context(|| format!("MASTER_PORT={port}: not a port number"))?;
        let timeout = match get(TIMEOUT_ENV) {
            Some(v) => {
                let s: f64 = v
                    .trim()
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0)
                    .with_context(|| {
                        format!("{TIMEOUT_ENV}={v}: expected a positive number of seconds")
                    })?;
                Duration::from_secs_f64(s)
            }
            None => super::DEFAULT_TIMEOUT,
        };
        Ok(Some(GroupEnv {
            world,
            rank,
            local_rank,
            addr: if host.contains(':') && !host.starts_with('[') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            },
            timeout,
        }))
    }

    /// Forms the group for a rank training on `device`: over TCP ([`SocketRank::connect`]),
    /// then, with the [`Backend::Nccl`] backend ([`BACKEND_ENV`], the default on CUDA), the
    /// NCCL communicator on that device with the TCP group as its control plane. Also returns
    /// the backend in words (`TCP`, `NCCL 2.27.3`).
    pub fn form(
        &self,
        device: crate::device::DeviceSpec,
    ) -> Result<(Box<dyn super::Collective>, String)> {
        let on_cuda = matches!(device, crate::device::DeviceSpec::Cuda(_));
        let backend = Backend::choose(crate::switches::var(BACKEND_ENV).as_deref(), on_cuda)?;
        let ctl = self.connect()?;
        match backend {
            Backend::Tcp => Ok((Box::new(ctl), "TCP".into())),
            #[cfg(feature = "cuda")]
            Backend::Nccl => {
                let d = crate::device::select(device)?;
                let r = super::nccl::NcclRank::new(Box::new(ctl), &d).with_context(|| {
                    format!(
                        "rank {} of {}: forming the NCCL group on {device}",
                        self.rank, self.world
                    )
                })?;
                Ok((Box::new(r), format!("NCCL {}", super::nccl::version()?)))
            }
            #[cfg(not(feature = "cuda"))]
            Backend::Nccl => anyhow::bail!(
                "{BACKEND_ENV}=nccl: this yolo9 was built without CUDA (the `cuda` feature)"
            ),
        }
    }

    /// Forms the group over TCP ([`SocketRank::connect`]).
    pub fn connect(&self) -> Result<SocketRank> {
        SocketRank::connect(&self.addr, self.rank, self.world, self.timeout).with_context(|| {
            format!(
                "rank {} of {}: forming the group at {} (MASTER_ADDR:MASTER_PORT)",
                self.rank, self.world, self.addr
            )
        })
    }
}
