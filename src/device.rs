//! Device selection (`--device cpu|N`), shared by `detect`, `train`, `val` and `serve`.
//!
//! Accepted spellings (case-insensitive, surrounding spaces ignored): `cpu`, a CUDA index `0`,
//! `cuda:0` or `cuda` (= `cuda:0`), `auto` or an empty value (the default: the first CUDA GPU
//! when this build has CUDA and one is present, else the CPU, as the official `--device ''`),
//! and for commands that use several GPUs a comma list `0,1`.
//! Parsing ([`parse_device`], [`parse_devices`]) only checks the syntax, so clap can reject a bad
//! value at parse time; [`select`] checks availability and opens the device.
use anyhow::{bail, Result};
use candle_core::Device;

/// A parsed `--device` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    /// The first CUDA GPU if this build has CUDA and one can be opened, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA device by ordinal.
    Cuda(usize),
}

impl Default for DeviceSpec {
    /// [`DeviceSpec::Auto`], the default of every subcommand's `--device`.
    fn default() -> Self {
        DeviceSpec::Auto
    }
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;
    /// [`parse_device`].
    fn from_str(s: &str) -> Result<Self, String> {
        parse_device(s)
    }
}

/// Written as its [`Display`](std::fmt::Display) form (`auto`, `cpu`, `cuda:N`), so `args.yaml`
/// and a config file read as the flag does.
impl serde::Serialize for DeviceSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Read with [`parse_device`]: `cpu`, `0`, `cuda:0`, `auto`; also a bare integer (`device: 0` in
/// YAML), as the runs of earlier versions wrote it.
impl<'de> serde::Deserialize<'de> for DeviceSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Index(u64),
            Text(String),
        }
        let text = match Raw::deserialize(d)? {
            Raw::Index(i) => i.to_string(),
            Raw::Text(t) => t,
        };
        parse_device(&text).map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Auto => write!(f, "auto"),
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// The help of every subcommand's `--device` (one text, as the flag is one parser).
pub const DEVICE_HELP: &str = "Device: auto (the first CUDA GPU when this build has CUDA and \
one is present, else the CPU), cpu, or a CUDA index such as 0 (or cuda:0)";

const SYNTAX: &str =
    "expected 'cpu', a CUDA device index such as 0 (or cuda:0), or a list like 0,1";

/// Parses one device (`cpu`, `0`, `cuda:0`, `cuda`). The error names the value and the syntax.
pub fn parse_device(s: &str) -> Result<DeviceSpec, String> {
    let t = s.trim().to_ascii_lowercase();
    if t.contains(',') {
        return Err(format!(
            "'{s}' is a list; this command runs on one device: 'cpu' or a CUDA device index such \
             as 0 (or cuda:0)"
        ));
    }
    parse_one(&t).ok_or_else(|| {
        format!(
            "'{s}' is not a device: expected 'cpu' or a CUDA device index such as 0 (or cuda:0)"
        )
    })
}

fn parse_one(t: &str) -> Option<DeviceSpec> {
    match t {
        "" | "auto" => Some(DeviceSpec::Auto),
        "cpu" => Some(DeviceSpec::Cpu),
        "cuda" | "gpu" => Some(DeviceSpec::Cuda(0)),
        _ => {
            let n = t.strip_prefix("cuda:").unwrap_or(t);
            // Only plain decimal digits: "-1", "+1", "1.0", "x" are refused.
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || n.len() > 4 {
                return None;
            }
            n.parse().ok().map(DeviceSpec::Cuda)
        }
    }
}

/// Parses a device list (`cpu`, `0`, `0,1`, `cuda:0,cuda:1`). Refuses empty items, duplicates
/// and mixing `cpu` with GPUs; errors name the value.
pub fn parse_devices(s: &str) -> Result<Vec<DeviceSpec>, String> {
    let t = s.trim().to_ascii_lowercase();
    let mut out = Vec::new();
    for item in t.split(',') {
        let d = parse_one(item.trim()).ok_or_else(|| {
            format!(
                "invalid device '{s}': item '{}' is not valid; {SYNTAX}",
                item.trim()
            )
        })?;
        if out.contains(&d) {
            return Err(format!("invalid device '{s}': {d} is listed twice"));
        }
        out.push(d);
    }
    if out.len() > 1 && out.contains(&DeviceSpec::Auto) {
        return Err(format!("invalid device '{s}': 'auto' stands alone"));
    }
    if out.len() > 1 && out.contains(&DeviceSpec::Cpu) {
        return Err(format!("invalid device '{s}': cannot mix cpu with GPUs"));
    }
    Ok(out)
}

/// How a device is named to the user: `cpu` or `cuda:N`.
pub fn name_of(d: &Device) -> String {
    match d.location() {
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        _ => "cpu".to_string(),
    }
}

/// The line a command prints when `--device` was left to [`DeviceSpec::Auto`], naming the pick.
pub fn auto_notice(d: &Device) -> String {
    format!(
        "device: {} (the default, --device auto: the first CUDA GPU if there is one; --device cpu \
         or --device N picks another)",
        name_of(d)
    )
}

/// Names of the devices this build can use now, e.g. `["cpu"]` or `["cpu", "cuda:0"]`.
pub fn available_devices() -> Vec<String> {
    let mut v = vec!["cpu".to_string()];
    if candle_core::utils::cuda_is_available() {
        for i in 0..64 {
            if Device::new_cuda(i).is_err() {
                break;
            }
            v.push(format!("cuda:{i}"));
        }
    }
    v
}

/// [`select`], and for [`DeviceSpec::Auto`] the line saying which device it picked
/// ([`auto_notice`]), for the caller to show: how every subcommand opens its `--device`.
pub fn open(
    spec: DeviceSpec,
) -> std::result::Result<(Device, Option<String>), crate::error::Error> {
    let d = select(spec)?;
    let notice = (spec == DeviceSpec::Auto).then(|| auto_notice(&d));
    Ok((d, notice))
}

/// Opens the device. Errors: a CUDA device in a build without the `cuda` feature (the message
/// says how to rebuild), or a CUDA ordinal that does not exist (the message lists the available
/// devices); both are [`crate::error::Error::Device`].
pub fn select(spec: DeviceSpec) -> std::result::Result<Device, crate::error::Error> {
    select_inner(spec).map_err(|e| crate::error::Error::Device(format!("{e:#}")))
}

fn select_inner(spec: DeviceSpec) -> Result<Device> {
    match spec {
        DeviceSpec::Auto => {
            if cfg!(feature = "cuda") && candle_core::utils::cuda_is_available() {
                if let Ok(d) = Device::new_cuda(0) {
                    single_stream(&d);
                    return Ok(d);
                }
            }
            Ok(Device::Cpu)
        }
        DeviceSpec::Cpu => Ok(Device::Cpu),
        DeviceSpec::Cuda(i) => {
            if !candle_core::utils::cuda_is_available() {
                bail!(
                    "device {i} not available: this yolo9 was built without CUDA; available: cpu. \
                     Use --device cpu, or rebuild with CUDA: `cargo build --release --features \
                     cuda` (add `cudnn` for cuDNN)"
                );
            }
            match Device::new_cuda(i) {
                Ok(d) => {
                    single_stream(&d);
                    Ok(d)
                }
                Err(e) => bail!(
                    "device {i} not available ({}); available: {}. Check the NVIDIA driver \
                     (`nvidia-smi` lists the GPUs) or use --device cpu",
                    error_head(&e),
                    available_devices().join(", ")
                ),
            }
        }
    }
}

/// The first line of an error's message: candle appends a backtrace to some errors, which only
/// hides the cause from a user.
pub fn error_head(e: &dyn std::fmt::Display) -> String {
    let s = e.to_string();
    s.lines().next().unwrap_or_default().trim().to_string()
}

/// `t` on the CPU, copying only its own elements (row-major): a copy on the device first for
/// a tensor elsewhere. candle's `to_device` copies the whole storage a tensor is a view of, and
/// the training loop's gradients are ~900 views of one buffer (one multi-tensor launch writes
/// them): saving a checkpoint mid-window copied that buffer once per tensor (16x BCCD on the
/// H200, 2026-12-04: 17.8 s for one checkpoint; by count ~900 × 28 MB ≈ 25 GB of host copies,
/// not measured). Errors: device errors.
pub fn to_host(t: &candle_core::Tensor) -> candle_core::Result<candle_core::Tensor> {
    match t.device() {
        Device::Cpu => Ok(t.clone()),
        d => t.force_contiguous()?.to_device(&Device::Cpu).map_err(|e| {
            candle_core::Error::Msg(format!("copying a tensor from {d:?} to the host: {e}"))
        }),
    }
}

/// yolo9 runs all work of a device on candle's one stream of that device, so cudarc's event
/// tracking (a `cuEventRecord`/`cuStreamWaitEvent` per kernel argument, there to order work across
/// streams) only costs launch time; it is turned off for every new device.
fn single_stream(d: &Device) {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(c) = d {
        // SAFETY: called before any tensor of this device exists, and every tensor of it is
        // used on the device's single stream (cuDNN is bound to the same stream).
        unsafe { c.disable_event_tracking() };
    }
    #[cfg(not(feature = "cuda"))]
    let _ = d;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_spec_reads_as_the_flag_and_round_trips() {
        for (text, spec) in [
            ("\"auto\"", DeviceSpec::Auto),
            ("\"cpu\"", DeviceSpec::Cpu),
            ("\"0\"", DeviceSpec::Cuda(0)),
            ("1", DeviceSpec::Cuda(1)),
            ("\"cuda:2\"", DeviceSpec::Cuda(2)),
        ] {
            let got: DeviceSpec = serde_json::from_str(text).unwrap();
            assert_eq!(got, spec, "{text}");
            let back: DeviceSpec =
                serde_json::from_str(&serde_json::to_string(&got).unwrap()).unwrap();
            assert_eq!(back, spec);
        }
        assert_eq!(
            serde_json::to_string(&DeviceSpec::Cuda(3)).unwrap(),
            "\"cuda:3\""
        );
        let e = serde_json::from_str::<DeviceSpec>("\"gpu9x\"").unwrap_err();
        assert!(e.to_string().contains("'gpu9x' is not a device"), "{e}");
        assert_eq!(DeviceSpec::default(), DeviceSpec::Auto);
    }

    #[test]
    fn error_head_drops_a_backtrace() {
        let e = "DriverError(CUDA_ERROR_NO_DEVICE, \"no CUDA-capable device\")\n   0: <unknown>\n";
        assert_eq!(
            error_head(&e),
            "DriverError(CUDA_ERROR_NO_DEVICE, \"no CUDA-capable device\")"
        );
    }

    #[test]
    fn parses() {
        assert_eq!(parse_device("cpu"), Ok(DeviceSpec::Cpu));
        assert_eq!(parse_device(" CPU "), Ok(DeviceSpec::Cpu));
        assert_eq!(parse_device("0"), Ok(DeviceSpec::Cuda(0)));
        assert_eq!(parse_device("cuda:3"), Ok(DeviceSpec::Cuda(3)));
        // Empty (the official `--device ''`) and `auto`: the first GPU if there is one.
        assert_eq!(parse_device(""), Ok(DeviceSpec::Auto));
        assert_eq!(parse_device(" Auto "), Ok(DeviceSpec::Auto));
        assert!(parse_devices("auto,0").unwrap_err().contains("alone"));
        for bad in ["cuda:x", "-1", "1.0", "+1", "gpu0", "0,0", "0,1"] {
            let e = parse_device(bad).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{bad}: {e}");
        }
        assert_eq!(
            parse_devices("0,1"),
            Ok(vec![DeviceSpec::Cuda(0), DeviceSpec::Cuda(1)])
        );
        assert!(parse_devices("0,0").unwrap_err().contains("twice"));
        assert!(parse_devices("cpu,0").is_err());
        assert!(parse_devices("0,").is_err());
    }
}
