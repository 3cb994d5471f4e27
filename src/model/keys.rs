//! State_dict names: every `(name, shape)` of a graph, generated from its layer table
//! ([`crate::model::arch::Arch`]) by the same code that builds the network (a describing build,
//! [`crate::model::params::Builder::describing`]), so the list of blocks exists once. The renaming
//! between a training graph and its inference graph is [`crate::model::rename`].
//!
//! The names and their order equal the official `model.state_dict().keys()` (checked against
//! `../shared/reference/yolov9-s.state_dict.index.json` in `tests/model/convert.rs`): each `Conv`
//! holds `conv.weight` and a BatchNorm (`bn.weight`, `bn.bias`, `bn.running_mean`,
//! `bn.running_var`, `bn.num_batches_tracked`); the head holds `cv2…cv5` and the constant DFL
//! kernels `dfl`/`dfl2`.

use super::arch::Arch;

/// Every state_dict entry `(name, shape)` of `arch` with `nc` classes, in official state_dict
/// order, including the int64 `*.num_batches_tracked` counters (shape `[]`).
/// yolov9-s: 1772 entries; gelan-s: 1339.
///
/// Errors: none for a checked [`Arch`] (the describing build cannot fail on one); kept as a
/// `Result` because it runs the layer builders.
pub fn state_dict_entries(arch: &Arch, nc: usize) -> anyhow::Result<Vec<(String, Vec<usize>)>> {
    super::net::describe(arch, nc)
}

/// Every state_dict name of `arch`, in official order (see [`state_dict_entries`]).
pub fn state_dict_names(arch: &Arch) -> anyhow::Result<Vec<String>> {
    Ok(state_dict_entries(arch, 80)?
        .into_iter()
        .map(|e| e.0)
        .collect())
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

/// The name of the class-logit convolution of the first main head level, whose output channel
/// count is `nc` (`model.29.cv5.0.2.weight` for yolov9-s, `model.22.cv3.0.2.weight` for gelan-s).
pub fn class_conv_name(arch: &Arch) -> String {
    let h = arch.head_index();
    if arch.is_dual() {
        format!("model.{h}.cv5.0.2.weight")
    } else {
        format!("model.{h}.cv3.0.2.weight")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rename::NameMap;
    use std::collections::HashMap;

    #[test]
    fn counts_and_mapping() {
        let s = Arch::builtin("yolov9-s").unwrap();
        let g = Arch::builtin("gelan-s").unwrap();
        assert_eq!(state_dict_names(&s).unwrap().len(), 1772);
        assert_eq!(state_dict_names(&g).unwrap().len(), 1339);
        let m = NameMap::train_to_infer(&s);
        assert_eq!(
            m.map("model.29.cv4.0.2.bias").as_deref(),
            Some("model.22.cv2.0.2.bias")
        );
        assert_eq!(
            m.map("model.29.dfl2.conv.weight").as_deref(),
            Some("model.22.dfl.conv.weight")
        );
        assert_eq!(m.map("model.29.dfl.conv.weight"), None);
        assert_eq!(m.map("model.22.cv1.conv.weight"), None);
        assert_eq!(
            m.map("model.21.cv4.bn.bias").as_deref(),
            Some("model.21.cv4.bn.bias")
        );
        let back = NameMap::infer_to_train(&s);
        assert_eq!(
            back.map("model.22.cv3.1.2.weight").as_deref(),
            Some("model.29.cv5.1.2.weight")
        );
        // For every training graph: each name maps into the inference set or is dropped, the
        // image is the whole inference set with the same shapes, and the inverse maps back.
        for t in ["yolov9-t", "yolov9-s", "yolov9-m", "yolov9-c", "yolov9-e"] {
            let train = Arch::builtin(t).unwrap();
            let infer = train.main_branch().0;
            let fwd = NameMap::train_to_infer(&train);
            let inv = NameMap::infer_to_train(&train);
            let want: HashMap<String, Vec<usize>> =
                state_dict_entries(&infer, 3).unwrap().into_iter().collect();
            let mut got = HashMap::new();
            for (n, shape) in state_dict_entries(&train, 3).unwrap() {
                if let Some(m) = fwd.map(&n) {
                    assert_eq!(inv.map(&m).as_deref(), Some(n.as_str()), "{t}: {n}");
                    got.insert(m, shape);
                }
            }
            assert_eq!(got, want, "{t}");
        }
    }
}
