//! The state_dict names of the two YOLOv9-s graphs, generated from the layer list.
//!
//! Source: `models/detect/yolov9-s.yaml` (training graph, layers 0–28 + `DualDDetect` at 29) and
//! `models/detect/gelan-s.yaml` (inference graph, layers 0–21 + `DDetect` at 22) of
//! WongKinYiu/yolov9, and the module definitions of `models/common.py` / `models/yolo.py`: each
//! `Conv` holds `conv.weight` and a BatchNorm (`bn.weight`, `bn.bias`, `bn.running_mean`,
//! `bn.running_var`, `bn.num_batches_tracked`). The names and their order equal
//! `model.state_dict().keys()` (checked against `../shared/reference/yolov9-s.state_dict.index.json`
//! in `tests/convert.rs`).

use super::weights::Graph;

/// `(name, shape)` entries being built.
type Out = Vec<(String, Vec<usize>)>;

/// One official `Conv` (conv without bias + BN) at `p`: `c1 → c2`, kernel `k`, `g` groups.
fn conv(out: &mut Out, p: &str, c1: usize, c2: usize, k: usize, g: usize) {
    out.push((format!("{p}.conv.weight"), vec![c2, c1 / g, k, k]));
    for s in ["weight", "bias", "running_mean", "running_var"] {
        out.push((format!("{p}.bn.{s}"), vec![c2]));
    }
    out.push((format!("{p}.bn.num_batches_tracked"), vec![]));
}

/// `RepNCSP(c1, c2, n=3, e=0.5)`: cv1, cv2 (c1 → c_), cv3 (2c_ → c2), and `n`
/// `RepNBottleneck(c_, c_)` = RepConvN (3x3 conv1 + 1x1 conv2) then a 3x3 Conv.
fn rep_ncsp(out: &mut Out, p: &str, c1: usize, c2: usize) {
    let c = c2 / 2;
    conv(out, &format!("{p}.cv1"), c1, c, 1, 1);
    conv(out, &format!("{p}.cv2"), c1, c, 1, 1);
    conv(out, &format!("{p}.cv3"), 2 * c, c2, 1, 1);
    for i in 0..3 {
        conv(out, &format!("{p}.m.{i}.cv1.conv1"), c, c, 3, 1);
        conv(out, &format!("{p}.m.{i}.cv1.conv2"), c, c, 1, 1);
        conv(out, &format!("{p}.m.{i}.cv2"), c, c, 3, 1);
    }
}

/// `RepNCSPELAN4(c1, c2, c3, c4)`: cv1 (c1 → c3), cv2 = (RepNCSP(c3/2 → c4), Conv 3x3),
/// cv3 = (RepNCSP(c4 → c4), Conv 3x3), cv4 (c3 + 2 c4 → c2).
fn rep_ncsp_elan4(out: &mut Out, p: &str, c1: usize, c2: usize, c3: usize, c4: usize) {
    conv(out, &format!("{p}.cv1"), c1, c3, 1, 1);
    rep_ncsp(out, &format!("{p}.cv2.0"), c3 / 2, c4);
    conv(out, &format!("{p}.cv2.1"), c4, c4, 3, 1);
    rep_ncsp(out, &format!("{p}.cv3.0"), c4, c4);
    conv(out, &format!("{p}.cv3.1"), c4, c4, 3, 1);
    conv(out, &format!("{p}.cv4"), c3 + 2 * c4, c2, 1, 1);
}

/// `SPPELAN(c1, c2, c3)`: cv1 (c1 → c3), three max-pools, cv5 (4 c3 → c2).
fn sppelan(out: &mut Out, p: &str, c1: usize, c2: usize, c3: usize) {
    conv(out, &format!("{p}.cv1"), c1, c3, 1, 1);
    conv(out, &format!("{p}.cv5"), 4 * c3, c2, 1, 1);
}

/// Input channels of the three head levels (P3, P4, P5) in both graphs.
const HEAD_CH: [usize; 3] = [128, 192, 256];
/// DFL bins (`reg_max`).
const REG_MAX: usize = 16;

/// One box branch set (`cv2`/`cv4`): per level Conv 3x3 (ch → 64), Conv 3x3 g=4, Conv2d 1x1
/// g=4 with bias (64 → 4·16).
fn box_branch(out: &mut Out, p: &str) {
    let c2 = (HEAD_CH[0] / 4).max(REG_MAX * 4).max(16);
    for (level, ch) in HEAD_CH.iter().enumerate() {
        conv(out, &format!("{p}.{level}.0"), *ch, c2, 3, 1);
        conv(out, &format!("{p}.{level}.1"), c2, c2, 3, 4);
        out.push((
            format!("{p}.{level}.2.weight"),
            vec![4 * REG_MAX, c2 / 4, 1, 1],
        ));
        out.push((format!("{p}.{level}.2.bias"), vec![4 * REG_MAX]));
    }
}

/// One class branch set (`cv3`/`cv5`): per level Conv 3x3 (ch → c3), Conv 3x3, Conv2d 1x1 with
/// bias (c3 → nc), with `c3 = max(ch[0], min(nc, 100))`.
fn class_branch(out: &mut Out, p: &str, nc: usize) {
    let c3 = HEAD_CH[0].max(nc.min(100));
    for (level, ch) in HEAD_CH.iter().enumerate() {
        conv(out, &format!("{p}.{level}.0"), *ch, c3, 3, 1);
        conv(out, &format!("{p}.{level}.1"), c3, c3, 3, 1);
        out.push((format!("{p}.{level}.2.weight"), vec![nc, c3, 1, 1]));
        out.push((format!("{p}.{level}.2.bias"), vec![nc]));
    }
}

/// The layers shared by both graphs (0–21), with the channel arguments of yolov9-s.yaml.
fn backbone_and_neck(out: &mut Out) {
    conv(out, "model.0", 3, 32, 3, 1);
    conv(out, "model.1", 32, 64, 3, 1);
    // ELAN1(64, 64, 64, 32)
    conv(out, "model.2.cv1", 64, 64, 1, 1);
    conv(out, "model.2.cv2", 32, 32, 3, 1);
    conv(out, "model.2.cv3", 32, 32, 3, 1);
    conv(out, "model.2.cv4", 128, 64, 1, 1);
    conv(out, "model.3.cv1", 64, 128, 3, 1);
    rep_ncsp_elan4(out, "model.4", 128, 128, 128, 64);
    conv(out, "model.5.cv1", 128, 192, 3, 1);
    rep_ncsp_elan4(out, "model.6", 192, 192, 192, 96);
    conv(out, "model.7.cv1", 192, 256, 3, 1);
    rep_ncsp_elan4(out, "model.8", 256, 256, 256, 128);
    sppelan(out, "model.9", 256, 256, 128);
    rep_ncsp_elan4(out, "model.12", 448, 192, 192, 96);
    rep_ncsp_elan4(out, "model.15", 320, 128, 128, 64);
    conv(out, "model.16.cv1", 128, 96, 3, 1);
    rep_ncsp_elan4(out, "model.18", 288, 192, 192, 96);
    conv(out, "model.19.cv1", 192, 128, 3, 1);
    rep_ncsp_elan4(out, "model.21", 384, 256, 256, 128);
}

/// Every state_dict entry `(name, shape)` of `graph` with `nc` classes, in official state_dict
/// order, including the int64 `*.num_batches_tracked` counters (shape `[]`).
/// Train: 1772 entries; Infer: 1339.
pub fn state_dict_entries(graph: Graph, nc: usize) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::with_capacity(1772);
    backbone_and_neck(&mut out);
    let dfl =
        |out: &mut Out, p: &str| out.push((format!("{p}.conv.weight"), vec![1, REG_MAX, 1, 1]));
    match graph {
        Graph::Train => {
            sppelan(&mut out, "model.22", 256, 256, 128);
            rep_ncsp_elan4(&mut out, "model.25", 448, 192, 192, 96);
            rep_ncsp_elan4(&mut out, "model.28", 320, 128, 128, 64);
            box_branch(&mut out, "model.29.cv2");
            class_branch(&mut out, "model.29.cv3", nc);
            box_branch(&mut out, "model.29.cv4");
            class_branch(&mut out, "model.29.cv5", nc);
            dfl(&mut out, "model.29.dfl");
            dfl(&mut out, "model.29.dfl2");
        }
        Graph::Infer => {
            box_branch(&mut out, "model.22.cv2");
            class_branch(&mut out, "model.22.cv3", nc);
            dfl(&mut out, "model.22.dfl");
        }
    }
    out
}

/// Every state_dict name of `graph`, in official state_dict order (see [`state_dict_entries`]).
pub fn state_dict_names(graph: Graph) -> Vec<String> {
    state_dict_entries(graph, 80)
        .into_iter()
        .map(|e| e.0)
        .collect()
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
