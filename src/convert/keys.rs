//! The state_dict names of the two YOLOv9-s graphs, generated from the layer list.
//!
//! Source: `models/detect/yolov9-s.yaml` (training graph, layers 0–28 + `DualDDetect` at 29) and
//! `models/detect/gelan-s.yaml` (inference graph, layers 0–21 + `DDetect` at 22) of
//! WongKinYiu/yolov9, and the module definitions of `models/common.py` / `models/yolo.py`: each
//! `Conv` holds `conv.weight` and a BatchNorm (`bn.weight`, `bn.bias`, `bn.running_mean`,
//! `bn.running_var`, `bn.num_batches_tracked`). The names and their order equal
//! `model.state_dict().keys()` (checked against `../shared/reference/yolov9-s.state_dict.index.json`
//! in `tests/convert.rs`).

use crate::model::weights::Graph;

/// Pushes the names of one official `Conv` (conv + BN) at `p`.
fn conv(out: &mut Vec<String>, p: &str) {
    out.push(format!("{p}.conv.weight"));
    for s in [
        "weight",
        "bias",
        "running_mean",
        "running_var",
        "num_batches_tracked",
    ] {
        out.push(format!("{p}.bn.{s}"));
    }
}

/// `RepNCSP(c1, c2, n=3)`: cv1, cv2, cv3 and `n` RepNBottlenecks (RepConvN conv1/conv2 + Conv).
fn rep_ncsp(out: &mut Vec<String>, p: &str) {
    conv(out, &format!("{p}.cv1"));
    conv(out, &format!("{p}.cv2"));
    conv(out, &format!("{p}.cv3"));
    for i in 0..3 {
        conv(out, &format!("{p}.m.{i}.cv1.conv1"));
        conv(out, &format!("{p}.m.{i}.cv1.conv2"));
        conv(out, &format!("{p}.m.{i}.cv2"));
    }
}

/// `RepNCSPELAN4`: cv1, cv2 = (RepNCSP, Conv), cv3 = (RepNCSP, Conv), cv4.
fn rep_ncsp_elan4(out: &mut Vec<String>, p: &str) {
    conv(out, &format!("{p}.cv1"));
    for b in ["cv2", "cv3"] {
        rep_ncsp(out, &format!("{p}.{b}.0"));
        conv(out, &format!("{p}.{b}.1"));
    }
    conv(out, &format!("{p}.cv4"));
}

/// One detection branch set (`cv2`/`cv3` or `cv4`/`cv5`): per level, Conv, Conv, Conv2d(bias).
fn head_branch(out: &mut Vec<String>, p: &str) {
    for level in 0..3 {
        conv(out, &format!("{p}.{level}.0"));
        conv(out, &format!("{p}.{level}.1"));
        out.push(format!("{p}.{level}.2.weight"));
        out.push(format!("{p}.{level}.2.bias"));
    }
}

/// The layers shared by both graphs (0–21).
fn backbone_and_neck(out: &mut Vec<String>) {
    for i in 0..=21usize {
        let p = format!("model.{i}");
        match i {
            0 | 1 => conv(out, &p),
            2 => (1..=4).for_each(|k| conv(out, &format!("{p}.cv{k}"))),
            3 | 5 | 7 | 16 | 19 => conv(out, &format!("{p}.cv1")),
            4 | 6 | 8 | 12 | 15 | 18 | 21 => rep_ncsp_elan4(out, &p),
            9 => sppelan(out, &p),
            _ => {} // Upsample / Concat: no tensors
        }
    }
}

fn sppelan(out: &mut Vec<String>, p: &str) {
    conv(out, &format!("{p}.cv1"));
    conv(out, &format!("{p}.cv5"));
}

/// Every state_dict name of `graph`, in official state_dict order, including the int64
/// `*.num_batches_tracked` counters. Train: 1772 names; Infer: 1339.
pub fn state_dict_names(graph: Graph) -> Vec<String> {
    let mut out = Vec::with_capacity(1772);
    backbone_and_neck(&mut out);
    match graph {
        Graph::Train => {
            sppelan(&mut out, "model.22");
            rep_ncsp_elan4(&mut out, "model.25");
            rep_ncsp_elan4(&mut out, "model.28");
            for b in ["cv2", "cv3", "cv4", "cv5"] {
                head_branch(&mut out, &format!("model.29.{b}"));
            }
            out.push("model.29.dfl.conv.weight".into());
            out.push("model.29.dfl2.conv.weight".into());
        }
        Graph::Infer => {
            head_branch(&mut out, "model.22.cv2");
            head_branch(&mut out, "model.22.cv3");
            out.push("model.22.dfl.conv.weight".into());
        }
    }
    out
}

/// Whether a state_dict name is a BatchNorm step counter (int64, ignored by loaders).
pub fn is_counter(name: &str) -> bool {
    name.ends_with(".num_batches_tracked")
}

/// Whether a state_dict name counts as a *parameter* in the official model summary
/// (`sum(x.numel() for x in model.parameters())`): everything except BN running statistics and
/// counters (the DFL conv weight is a frozen parameter and counts).
pub fn is_parameter(name: &str) -> bool {
    !(name.ends_with(".running_mean") || name.ends_with(".running_var") || is_counter(name))
}

/// The name of a training-graph tensor in the inference graph, following the official
/// re-parameterization (`tools/reparameterization.ipynb`, "Convert YOLOv9-S"): layers 0–21 keep
/// their names; `model.29.cv4/cv5/dfl2` become `model.22.cv2/cv3/dfl`; everything else (the
/// auxiliary branch: layers 22, 25, 28 and `model.29.cv2/cv3/dfl`) has no counterpart (`None`).
pub fn train_to_infer_name(name: &str) -> Option<String> {
    for (from, to) in [
        ("model.29.cv4.", "model.22.cv2."),
        ("model.29.cv5.", "model.22.cv3."),
        ("model.29.dfl2.", "model.22.dfl."),
    ] {
        if let Some(rest) = name.strip_prefix(from) {
            return Some(format!("{to}{rest}"));
        }
    }
    let rest = name.strip_prefix("model.")?;
    let (layer, _) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    (layer <= 21).then(|| name.to_string())
}

/// The head layer index of a graph (29 for Train, 22 for Infer).
pub fn head_layer(graph: Graph) -> usize {
    match graph {
        Graph::Train => 29,
        Graph::Infer => 22,
    }
}

/// The name of the class-logit convolution of the first head level, whose output channel count
/// is `nc` (main branch for Train: `model.29.cv5.0.2.weight`; Infer: `model.22.cv3.0.2.weight`).
pub fn class_conv_name(graph: Graph) -> &'static str {
    match graph {
        Graph::Train => "model.29.cv5.0.2.weight",
        Graph::Infer => "model.22.cv3.0.2.weight",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_mapping() {
        assert_eq!(state_dict_names(Graph::Train).len(), 1772);
        assert_eq!(state_dict_names(Graph::Infer).len(), 1339);
        assert_eq!(
            train_to_infer_name("model.29.cv4.0.2.bias").as_deref(),
            Some("model.22.cv2.0.2.bias")
        );
        assert_eq!(
            train_to_infer_name("model.29.dfl2.conv.weight").as_deref(),
            Some("model.22.dfl.conv.weight")
        );
        assert_eq!(train_to_infer_name("model.29.dfl.conv.weight"), None);
        assert_eq!(train_to_infer_name("model.22.cv1.conv.weight"), None);
        assert_eq!(
            train_to_infer_name("model.21.cv4.bn.bias").as_deref(),
            Some("model.21.cv4.bn.bias")
        );
        // every train name maps into the infer set or is dropped; the image is the infer set
        let infer: std::collections::BTreeSet<String> =
            state_dict_names(Graph::Infer).into_iter().collect();
        let mapped: std::collections::BTreeSet<String> = state_dict_names(Graph::Train)
            .iter()
            .filter_map(|n| train_to_infer_name(n))
            .collect();
        assert_eq!(mapped, infer);
    }
}
