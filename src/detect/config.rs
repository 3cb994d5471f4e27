//! [`DetectorConfig`]: the options of a [`crate::Detector`] — inference size, NMS thresholds and
//! filters, precision — in one value with the defaults of the official `detect_dual.py`. A
//! service reads it from its own configuration (`Deserialize`, unknown keys refused); `yolo9
//! detect` and `yolo9 serve` derive their flags from it (feature `cli`), so each default exists
//! once. [`DetectorConfig::validate`] checks it when a detector is built, not on every call.

use crate::detect::nms::NmsOptions;
use crate::error::Error;
use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};

/// The defaults of [`DetectorConfig`] (official `detect_dual.py`).
pub mod defaults {
    /// Inference size, pixels (`--img 640`).
    pub const IMG: u32 = 640;
    /// The NMS defaults (`--conf-thres 0.25`, `--iou-thres 0.45`, `--max-det 1000`), owned by
    /// [`crate::detect::nms::NmsOptions`].
    pub use crate::detect::nms::defaults::{CONF, IOU, MAX_DET};
}

/// Most CPU threads a detector accepts ([`DetectorConfig::threads`]).
pub const MAX_THREADS: usize = 1024;

/// Largest inference size a detector accepts, pixels (after rounding to a multiple of 32). The
/// command line stops at [`crate::parse::MAX_IMG`].
pub const MAX_IMG_SIZE: u32 = 16_384;

/// Options of a [`crate::Detector`]. `Default` is the official `detect_dual.py` set: 640 px,
/// conf 0.25, IoU 0.45, 1000 detections, every class, per-class NMS, f32.
///
/// In a config file (JSON, YAML, TOML through serde) missing keys keep their defaults and unknown
/// keys are refused; the Ultralytics names `imgsz` and `agnostic_nms` are accepted too:
/// ```
/// let c: yolo9::DetectorConfig = serde_json::from_str(r#"{"imgsz": 320, "conf": 0.5}"#).unwrap();
/// assert_eq!((c.img_size, c.conf, c.iou), (320, 0.5, 0.45));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct DetectorConfig {
    /// Inference size in pixels (1..=8192), rounded up to a multiple of 32: the longer side of
    /// the letterbox. On the CPU a size whose estimated memory exceeds the free memory is
    /// refused before any work.
    #[serde(alias = "imgsz")]
    #[cfg_attr(feature = "cli", arg(long = "img", value_name = "IMG",
        visible_aliases = ["imgsz", "img-size"], default_value_t = defaults::IMG,
        value_parser = crate::parse::img, allow_negative_numbers = true))]
    pub img_size: u32,
    /// Confidence threshold in [0, 1]; a box needs a score strictly above it.
    #[cfg_attr(feature = "cli", arg(long = "conf-thres", visible_alias = "conf",
        default_value_t = defaults::CONF, value_parser = crate::parse::unit_f32,
        allow_negative_numbers = true))]
    pub conf: f32,
    /// NMS IoU threshold in [0, 1]; an overlap strictly above it suppresses.
    #[cfg_attr(feature = "cli", arg(long = "iou-thres", visible_alias = "iou",
        default_value_t = defaults::IOU, value_parser = crate::parse::unit,
        allow_negative_numbers = true))]
    pub iou: f64,
    /// Maximum detections per image (≥ 1).
    #[cfg_attr(feature = "cli", arg(long = "max-det", default_value_t = defaults::MAX_DET,
        value_parser = crate::parse::positive, allow_negative_numbers = true))]
    pub max_det: usize,
    /// Keep only these class ids, e.g. --classes 0 2 or --classes 0,2 (default: every class).
    #[cfg_attr(feature = "cli", arg(long, num_args = 1.., value_delimiter = ','))]
    pub classes: Option<Vec<usize>>,
    /// Class-agnostic NMS (boxes of different classes suppress each other).
    #[serde(alias = "agnostic_nms")]
    #[cfg_attr(feature = "cli", arg(long = "agnostic-nms"))]
    pub agnostic: bool,
    /// One candidate per (box, class) above the threshold instead of the best class only, as
    /// validation does (`val_dual.py`); not a flag of `detect`.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub multi_label: bool,
    /// Half-precision (f16) network on a CUDA device, as the official --half (outputs, boxes and
    /// NMS stay f32). On the CPU it is ignored (f32 is used; half precision is slower there).
    #[cfg_attr(feature = "cli", arg(long))]
    pub half: bool,
    /// CPU threads of the network (the detector's own pool, [`crate::model::cpu`]); 0: every
    /// CPU this process may use (or `YOLO9_THREADS`). Ignored on a GPU.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0, value_name = "N"))]
    pub threads: usize,
    /// Sliced inference for small objects in large images ([`crate::detect::tile`]); off by
    /// default. In a config file: `"tile": {"size": 640, "overlap": 0.2}`.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub tile: crate::detect::tile::TileOptions,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig {
            img_size: defaults::IMG,
            conf: defaults::CONF,
            iou: defaults::IOU,
            max_det: defaults::MAX_DET,
            classes: None,
            agnostic: false,
            multi_label: false,
            half: false,
            threads: 0,
            tile: crate::detect::tile::TileOptions::default(),
        }
    }
}

impl DetectorConfig {
    /// Checks every value for a model of `nc` classes: thresholds finite and in [0, 1], at
    /// least one detection, an inference size in 1..=[`MAX_IMG_SIZE`] after rounding, class ids
    /// below `nc`.
    ///
    /// Errors: [`Error::InvalidOption`] naming the option and the value.
    pub fn validate(&self, nc: usize) -> Result<(), Error> {
        let bad = |m: String| Err(Error::InvalidOption(m));
        if !(0.0..=1.0).contains(&self.conf) {
            return bad(format!(
                "confidence threshold {} is outside [0, 1]",
                self.conf
            ));
        }
        if !(0.0..=1.0).contains(&self.iou) {
            return bad(format!("IoU threshold {} is outside [0, 1]", self.iou));
        }
        if self.max_det == 0 {
            return bad("max_det 0 keeps nothing; it must be at least 1".into());
        }
        if let Some(cs) = &self.classes {
            if let Some(c) = cs.iter().find(|&&c| c >= nc) {
                return bad(format!(
                    "class filter contains {c}, but the model has {nc} classes (0..={})",
                    nc.saturating_sub(1)
                ));
            }
        }
        if self.threads > MAX_THREADS {
            return bad(format!(
                "threads {} is more than {MAX_THREADS}; use 0 for every CPU",
                self.threads
            ));
        }
        self.tile.validate().map_err(Error::InvalidOption)?;
        self.effective_img_size().map(|_| ())
    }

    /// The inference size used: [`DetectorConfig::img_size`] rounded up to a multiple of 32
    /// (official `check_img_size`).
    ///
    /// Errors: [`Error::InvalidOption`] for 0 or more than [`MAX_IMG_SIZE`].
    pub fn effective_img_size(&self) -> Result<u32, Error> {
        effective_img_size(self.img_size)
    }

    /// The NMS part.
    pub fn nms(&self) -> NmsOptions {
        NmsOptions {
            conf_thres: self.conf,
            iou_thres: self.iou,
            classes: self.classes.clone(),
            agnostic: self.agnostic,
            multi_label: self.multi_label,
            max_det: self.max_det,
        }
    }

    /// The network's dtype on `device`: f16 for [`DetectorConfig::half`] on a GPU, else f32 (as
    /// the official `half &= device.type != 'cpu'`).
    pub fn dtype(&self, device: &Device) -> DType {
        inference_dtype(self.half, device)
    }
}

/// `img_size` rounded up to a multiple of 32 (official `check_img_size`).
///
/// Errors: [`Error::InvalidOption`] for 0 or more than [`MAX_IMG_SIZE`].
pub fn effective_img_size(img_size: u32) -> Result<u32, Error> {
    crate::detect::letterbox::round_img_size(img_size)
        .filter(|&s| s <= MAX_IMG_SIZE)
        .ok_or_else(|| {
            Error::InvalidOption(format!(
                "image size {img_size} is out of range (1..={MAX_IMG_SIZE} pixels)"
            ))
        })
}

/// The network dtype for `half` on `device`: f16 on a GPU, f32 otherwise (the official `half &=
/// device.type != 'cpu'`). Shared by detection, validation and serving.
pub fn inference_dtype(half: bool, device: &Device) -> DType {
    if half && !device.is_cpu() {
        DType::F16
    } else {
        DType::F32
    }
}

/// `--classes` against the model's classes `names`: a class id the model lacks is refused before
/// any work, with the model's classes listed.
pub fn check_classes(classes: Option<&[usize]>, names: &[String]) -> anyhow::Result<()> {
    if let Some(bad) = classes.and_then(|cs| cs.iter().find(|&&c| c >= names.len())) {
        anyhow::bail!(
            "--classes {bad}: the model has {} classes (0..={}: {})",
            names.len(),
            names.len().saturating_sub(1),
            names.join(", ")
        );
    }
    Ok(())
}

/// The network dtype for `--half` on `device` ([`inference_dtype`]), with
/// a notice when `--half` has no effect (on the CPU).
pub fn inference_dtype_noted(half: bool, device: &Device) -> DType {
    if half && device.is_cpu() {
        crate::text::errln!("--half has no effect on the CPU: the network runs in f32");
    }
    crate::detect::config::inference_dtype(half, device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_with_defaults_and_refuses_unknown_keys_and_bad_values() {
        let c: DetectorConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c, DetectorConfig::default());
        let c: DetectorConfig =
            serde_json::from_str(r#"{"imgsz": 320, "agnostic_nms": true, "classes": [1]}"#)
                .unwrap();
        assert_eq!(
            (c.img_size, c.agnostic, c.classes),
            (320, true, Some(vec![1]))
        );
        let e = serde_json::from_str::<DetectorConfig>(r#"{"confidence": 0.3}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `confidence`"), "{e}");
        let ok = DetectorConfig::default();
        assert!(ok.validate(3).is_ok());
        for (c, needle) in [
            (
                DetectorConfig {
                    conf: 1.5,
                    ..ok.clone()
                },
                "confidence threshold 1.5",
            ),
            (
                DetectorConfig {
                    conf: f32::NAN,
                    ..ok.clone()
                },
                "confidence threshold NaN",
            ),
            (
                DetectorConfig {
                    iou: -0.1,
                    ..ok.clone()
                },
                "IoU threshold -0.1",
            ),
            (
                DetectorConfig {
                    max_det: 0,
                    ..ok.clone()
                },
                "max_det 0",
            ),
            (
                DetectorConfig {
                    classes: Some(vec![0, 3]),
                    ..ok.clone()
                },
                "contains 3",
            ),
            (
                DetectorConfig {
                    img_size: 0,
                    ..ok.clone()
                },
                "image size 0",
            ),
            (
                DetectorConfig {
                    img_size: 20_000,
                    ..ok.clone()
                },
                "image size 20000",
            ),
        ] {
            match c.validate(3) {
                Err(Error::InvalidOption(m)) => assert!(m.contains(needle), "{m}"),
                other => panic!("{c:?}: {other:?}"),
            }
        }
        assert_eq!(
            DetectorConfig {
                img_size: 650,
                ..ok.clone()
            }
            .effective_img_size()
            .unwrap(),
            672
        );
        assert_eq!(ok.nms(), NmsOptions::default());
        assert_eq!(
            DetectorConfig { half: true, ..ok }.dtype(&Device::Cpu),
            DType::F32
        );
    }
}
