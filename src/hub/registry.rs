//! The checkpoints the official WongKinYiu/yolov9 release `v0.1` publishes for detection, with
//! what a download must be: the model its keys must describe and its parameter count.
//!
//! Source of the list: the official README (its "Performance" table links the `-converted`
//! files of yolov9-t/s/m/c/e; its "Evaluation" section links `yolov9-s/m/c/e.pt` and
//! `gelan-s/m/c/e.pt`). The release has no `yolov9-t.pt` and no `gelan-t.pt` (the tiny model is
//! published only in its converted form). Its "Instance Segmentation" section links
//! `gelan-c-seg.pt` (listed; its YOLOv9-C-SEG row has no link, so `yolov9-c-seg` is not
//! published); the panoptic and captioning checkpoints are not listed.
//!
//! Parameter counts are the official model summary's (`sum(p.numel() for p in
//! model.parameters())`, BN running statistics excluded) for 80 classes, of the official model
//! descriptions (`models/detect/*.yaml`, embedded as [`crate::model::Arch::builtin`]); the
//! official summaries of yolov9-s (9,804,512) and gelan-s (7,226,208) are the reference's
//! (`../shared/reference/README.md`), and a unit test recounts every row from the model
//! definitions. COCO mAP50-95 values are the official README's (val2017, 640 px); the README
//! gives none for the GELAN checkpoints.

/// The official release that names resolve to (`YOLO9_WEIGHTS_URL` replaces it).
pub const RELEASE_URL: &str = "https://github.com/WongKinYiu/yolov9/releases/download/v0.1";

/// One published checkpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Published {
    /// The name (`yolov9-s`, `yolov9-s-converted`, `gelan-c`): the release file is `NAME.pt`.
    pub name: &'static str,
    /// The model its tensors must describe ([`crate::model::Arch::builtin`] name): the training
    /// graph for `yolov9-*`, its GELAN inference graph for `-converted` and `gelan-*`.
    pub arch: &'static str,
    /// Parameters at 80 classes (official summary count).
    pub parameters: usize,
    /// Official COCO val2017 mAP50-95 (640 px), in percent, when the official README gives it.
    pub coco_map50_95: Option<f32>,
}

/// The published detection and segmentation checkpoints of the official `v0.1` release.
pub const PUBLISHED: [Published; 14] = [
    row("yolov9-t-converted", "gelan-t", 2_442_640, Some(38.3)),
    row("yolov9-s-converted", "gelan-s", 7_226_208, Some(46.8)),
    row("yolov9-m-converted", "gelan-m", 20_124_000, Some(51.4)),
    row("yolov9-c-converted", "gelan-c", 25_498_752, Some(53.0)),
    row("yolov9-e-converted", "gelan-e", 58_114_432, Some(55.6)),
    row("yolov9-s", "yolov9-s", 9_804_512, Some(46.8)),
    row("yolov9-m", "yolov9-m", 32_878_432, Some(51.4)),
    row("yolov9-c", "yolov9-c", 51_182_080, Some(53.0)),
    row("yolov9-e", "yolov9-e", 69_529_664, Some(55.6)),
    row("gelan-s", "gelan-s", 7_226_208, None),
    row("gelan-m", "gelan-m", 20_124_000, None),
    row("gelan-c", "gelan-c", 25_498_752, None),
    row("gelan-e", "gelan-e", 58_114_432, None),
    // Box mAP50-95 (mask: 42.4).
    row("gelan-c-seg", "gelan-c-seg", 27_634_720, Some(52.3)),
];

const fn row(
    name: &'static str,
    arch: &'static str,
    parameters: usize,
    coco_map50_95: Option<f32>,
) -> Published {
    Published {
        name,
        arch,
        parameters,
        coco_map50_95,
    }
}

/// The published names, comma-separated (for error messages).
pub fn published_names() -> String {
    PUBLISHED.map(|p| p.name).join(", ")
}

/// `spec` without a trailing `.pt` (`yolov9-s.pt` → `yolov9-s`).
pub fn strip_pt(spec: &str) -> &str {
    spec.strip_suffix(".pt").unwrap_or(spec)
}

/// The published checkpoint `spec` names (`yolov9-s` or `yolov9-s.pt`), if any.
pub fn lookup(spec: &str) -> Option<&'static Published> {
    let key = strip_pt(spec);
    PUBLISHED.iter().find(|p| p.name == key)
}

/// The published checkpoint a user most likely meant by `key` when it is not published as
/// written: the Ultralytics spellings (`yolov9s`, `YOLOv9-S`, `yolov9s.pt`), compared without
/// case, dashes and underscores.
pub fn near_miss(key: &str) -> Option<&'static Published> {
    let squash = |s: &str| -> String {
        s.chars()
            .filter(|c| *c != '-' && *c != '_')
            .flat_map(char::to_lowercase)
            .collect()
    };
    let k = squash(strip_pt(key));
    PUBLISHED.iter().find(|p| squash(p.name) == k)
}

/// Whether `spec` looks like a model name rather than a file path: no directory separator and
/// no extension other than `.pt` (`yolov9-s`, `gelan-c.pt`, `yolov9-x`).
pub fn looks_like_name(spec: &str) -> bool {
    let key = strip_pt(spec);
    !key.is_empty()
        && !key.contains(['/', '\\'])
        && !key.starts_with('.')
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{keys, Arch};

    #[test]
    fn every_row_counts_the_parameters_of_its_model_definition() {
        let counted: Vec<(&str, usize)> = PUBLISHED
            .iter()
            .map(|p| {
                let arch = Arch::builtin(p.arch).unwrap();
                let n = keys::state_dict_entries(&arch, 80)
                    .unwrap()
                    .iter()
                    .filter(|(name, _)| keys::is_parameter(name))
                    .map(|(_, shape)| shape.iter().product::<usize>())
                    .sum();
                (p.name, n)
            })
            .collect();
        let table: Vec<(&str, usize)> = PUBLISHED.iter().map(|p| (p.name, p.parameters)).collect();
        assert_eq!(counted, table);
        // The official summaries of the reference checkpoint and its conversion.
        assert_eq!(lookup("yolov9-s").unwrap().parameters, 9_804_512);
        assert_eq!(
            lookup("yolov9-s-converted.pt").unwrap().parameters,
            7_226_208
        );
    }

    #[test]
    fn ultralytics_spellings_find_the_published_name() {
        assert_eq!(near_miss("yolov9s").unwrap().name, "yolov9-s");
        assert_eq!(near_miss("YOLOv9-C.pt").unwrap().name, "yolov9-c");
        assert_eq!(near_miss("gelan_c").unwrap().name, "gelan-c");
        assert!(near_miss("yolov8n").is_none());
    }

    #[test]
    fn names_and_paths_are_told_apart() {
        assert!(looks_like_name("yolov9-s"));
        assert!(looks_like_name("gelan-c.pt"));
        assert!(looks_like_name("yolov9-x"));
        assert!(!looks_like_name("weights/yolov9-s.pt"));
        assert!(!looks_like_name("best.safetensors"));
        assert!(!looks_like_name("../x"));
        assert_eq!(lookup("gelan-e.pt").unwrap().arch, "gelan-e");
        assert!(
            lookup("yolov9-t").is_none(),
            "the release has no yolov9-t.pt"
        );
        assert!(lookup("gelan-t").is_none(), "the release has no gelan-t.pt");
        assert_eq!(published_names().split(", ").count(), 14);
        assert_eq!(lookup("gelan-c-seg").unwrap().arch, "gelan-c-seg");
        assert!(
            lookup("yolov9-c-seg").is_none(),
            "its release row has no link"
        );
    }
}
