//! The renaming of state_dict names between a training graph and its inference graph (the
//! official re-parameterization, `tools/reparameterization.ipynb`): [`NameMap`]. The names
//! themselves are listed by [`crate::model::keys`]; the mapping is checked against them there.

use super::arch::Arch;
use std::collections::HashMap;

/// A renaming of state_dict names between a training graph and its inference graph
/// ([`Arch::main_branch`]): layer indices move, and the head's main branch is `cv4`/`cv5`/`dfl2`
/// in the training graph and `cv2`/`cv3`/`dfl` in the inference graph (for `DualDSegment`
/// → `DSegment` also `cv7`/`proto2` → `cv4`/`proto`). Names with no counterpart (the auxiliary
/// branch) map to `None`.
#[derive(Debug, Clone)]
pub struct NameMap {
    layers: HashMap<usize, usize>,
    head_from: usize,
    head_to: usize,
    /// Head sub-module renames (`cv4.` → `cv2.`, …); sub-modules not listed have no counterpart.
    head: Vec<(&'static str, &'static str)>,
}

impl NameMap {
    /// Training-graph names → inference-graph names (what `yolo9 convert --infer` and inference
    /// from training weights use). `train` must be a `DualDDetect` graph.
    pub fn train_to_infer(train: &Arch) -> Self {
        let (infer, from) = train.main_branch();
        let n = from.len() - 1;
        Self {
            layers: from[..n].iter().enumerate().map(|(k, &i)| (i, k)).collect(),
            head_from: train.head_index(),
            head_to: infer.head_index(),
            head: if train.seg().is_some() {
                // DualDSegment → DSegment: the main mask branch is cv7/proto2 → cv4/proto.
                vec![
                    ("cv4.", "cv2."),
                    ("cv5.", "cv3."),
                    ("dfl2.", "dfl."),
                    ("cv7.", "cv4."),
                    ("proto2.", "proto."),
                ]
            } else {
                vec![("cv4.", "cv2."), ("cv5.", "cv3."), ("dfl2.", "dfl.")]
            },
        }
    }

    /// Inference-graph names → training-graph names (training from gelan weights): the inverse
    /// of [`NameMap::train_to_infer`].
    pub fn infer_to_train(train: &Arch) -> Self {
        let m = Self::train_to_infer(train);
        Self {
            layers: m.layers.iter().map(|(&i, &k)| (k, i)).collect(),
            head_from: m.head_to,
            head_to: m.head_from,
            head: m.head.iter().map(|&(a, b)| (b, a)).collect(),
        }
    }

    /// The counterpart of `name`, or `None`.
    pub fn map(&self, name: &str) -> Option<String> {
        let rest = name.strip_prefix("model.")?;
        let (layer, tail) = rest.split_once('.')?;
        let layer: usize = layer.parse().ok()?;
        if layer == self.head_from {
            return self.head.iter().find_map(|(a, b)| {
                tail.strip_prefix(a)
                    .map(|t| format!("model.{}.{b}{t}", self.head_to))
            });
        }
        self.layers.get(&layer).map(|k| format!("model.{k}.{tail}"))
    }
}
