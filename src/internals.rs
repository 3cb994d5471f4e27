//! The crate's internal modules, for its own tests, benches, examples and binaries: hidden
//! from the documentation and outside the public API (no semver promise). An embedder uses the
//! public modules; what is here may change in any release.

/// `bounded` (internal).
pub mod bounded {
    pub use crate::bounded::*;
}
/// `budget` (internal).
pub mod budget {
    pub use crate::budget::*;
}
#[cfg(feature = "cli")]
/// `cli` (internal).
pub mod cli {
    pub use crate::cli::*;
}
/// `footprint` (internal).
pub mod footprint {
    pub use crate::footprint::*;
}
#[cfg(all(unix, feature = "cli"))]
/// `launcher` (internal).
pub mod launcher {
    pub use crate::launcher::*;
}
#[cfg(feature = "train")]
/// `loss` (internal).
pub mod loss {
    pub use crate::loss::*;
}
/// `memory` (internal).
pub mod memory {
    pub use crate::memory::*;
}
/// `op_args` (internal).
pub mod op_args {
    pub use crate::op_args::*;
}
/// `outfile` (internal).
pub mod outfile {
    pub use crate::outfile::*;
}
/// `parse` (internal).
pub mod parse {
    pub use crate::parse::*;
}
/// `pt` (internal).
pub mod pt {
    pub use crate::pt::*;
}
#[cfg(feature = "media")]
/// `runs` (internal).
pub mod runs {
    pub use crate::runs::*;
}
/// `switches` (internal).
pub mod switches {
    pub use crate::switches::*;
}
/// `text` (internal).
pub mod text {
    pub use crate::text::*;
}
#[cfg(feature = "cuda")]
/// `cuda` (internal).
pub mod cuda {
    pub use crate::cuda::*;
}
/// The internal modules of `detect`.
pub mod detect {
    /// `detect::device_nms` (internal).
    pub mod device_nms {
        pub use crate::detect::device_nms::*;
    }
    /// `detect::letterbox` (internal).
    pub mod letterbox {
        pub use crate::detect::letterbox::*;
    }
    /// `detect::nms` (internal).
    pub mod nms {
        pub use crate::detect::nms::*;
    }
    /// `detect::postprocess` (internal).
    pub mod postprocess {
        pub use crate::detect::postprocess::*;
    }
}
/// The internal modules of `model`.
pub mod model {
    /// `model::bias_act` (internal).
    pub mod bias_act {
        pub use crate::model::bias_act::*;
    }
    /// `model::blocks` (internal).
    pub mod blocks {
        pub use crate::model::blocks::*;
    }
    /// `model::bn_act` (internal).
    pub mod bn_act {
        pub use crate::model::bn_act::*;
    }
    /// `model::bn_sync` (internal).
    pub mod bn_sync {
        pub use crate::model::bn_sync::*;
    }
    /// `model::conv` (internal).
    pub mod conv {
        pub use crate::model::conv::*;
    }
    /// `model::cpu` (internal).
    pub mod cpu {
        pub use crate::model::cpu::*;
    }
    /// `model::cpu_conv` (internal).
    pub mod cpu_conv {
        pub use crate::model::cpu_conv::*;
    }
    /// `model::ew` (internal).
    pub mod ew {
        pub use crate::model::ew::*;
    }
    /// `model::graphs` (internal).
    pub mod graphs {
        pub use crate::model::graphs::*;
    }
    /// `model::head` (internal).
    pub mod head {
        pub use crate::model::head::*;
    }
    /// `model::layout` (internal).
    pub mod layout {
        pub use crate::model::layout::*;
    }
    /// `model::keys` (internal).
    pub mod keys {
        pub use crate::model::keys::*;
    }
    /// `model::params` (internal).
    pub mod params {
        pub use crate::model::params::*;
    }
    /// `model::pool` (internal).
    pub mod pool {
        pub use crate::model::pool::*;
    }
    /// `model::rename` (internal).
    pub mod rename {
        pub use crate::model::rename::*;
    }
    /// `model::tape` (internal).
    pub mod tape {
        pub use crate::model::tape::*;
    }
    /// `model::trace` (internal).
    pub mod trace {
        pub use crate::model::trace::*;
    }
    /// `model::yolov9` (internal).
    pub mod yolov9 {
        pub use crate::model::yolov9::*;
    }
}
/// The internal modules of `data`.
pub mod data {
    #[cfg(feature = "train")]
    /// `data::augment` (internal).
    pub mod augment {
        pub use crate::data::augment::*;
    }
    #[cfg(feature = "train")]
    /// `data::coco_json` (internal).
    pub mod coco_json {
        pub use crate::data::coco_json::*;
    }
    #[cfg(feature = "train")]
    /// `data::compose` (internal).
    pub mod compose {
        pub use crate::data::compose::*;
    }
    /// `data::fsio` (internal).
    pub mod fsio {
        pub use crate::data::fsio::*;
    }
    #[cfg(feature = "train")]
    /// `data::labels` (internal).
    pub mod labels {
        pub use crate::data::labels::*;
    }
    #[cfg(feature = "train")]
    /// `data::loader` (internal).
    pub mod loader {
        pub use crate::data::loader::*;
    }
    #[cfg(feature = "train")]
    /// `data::polygons` (internal).
    pub mod polygons {
        pub use crate::data::polygons::*;
    }
    #[cfg(feature = "train")]
    /// `data::scan` (internal).
    pub mod scan {
        pub use crate::data::scan::*;
    }
    #[cfg(feature = "train")]
    /// `data::warp` (internal).
    pub mod warp {
        pub use crate::data::warp::*;
    }
    #[cfg(feature = "train")]
    /// `data::yaml` (internal).
    pub mod yaml {
        pub use crate::data::yaml::*;
    }
}
#[cfg(feature = "train")]
/// The internal modules of `train`.
pub mod train {
    /// `train::budget` (internal).
    pub mod budget {
        pub use crate::train::budget::*;
    }
    /// `train::cache` (internal).
    pub mod cache {
        pub use crate::train::cache::*;
    }
    /// `train::checkpoint` (internal).
    pub mod checkpoint {
        pub use crate::train::checkpoint::*;
    }
    /// `train::dist` (internal).
    pub mod dist {
        pub use crate::train::dist::*;
    }
    /// `train::ema` (internal).
    pub mod ema {
        pub use crate::train::ema::*;
    }
    /// `train::graphed` (internal).
    pub mod graphed {
        pub use crate::train::graphed::*;
    }
    /// `train::guard` (internal).
    pub mod guard {
        pub use crate::train::guard::*;
    }
    /// `train::optimizer` (internal).
    pub mod optimizer {
        pub use crate::train::optimizer::*;
    }
    /// `train::pass` (internal).
    pub mod pass {
        pub use crate::train::pass::*;
    }
    /// `train::plots` (internal).
    pub mod plots {
        pub use crate::train::plots::*;
    }
    /// `train::report` (internal).
    pub mod report {
        pub use crate::train::report::*;
    }
    /// `train::schedule` (internal).
    pub mod schedule {
        pub use crate::train::schedule::*;
    }
    /// `train::step` (internal).
    pub mod step {
        pub use crate::train::step::*;
    }
}
#[cfg(feature = "train")]
/// The internal modules of `metrics`.
pub mod metrics {
    /// `metrics::ap` (internal).
    pub mod ap {
        pub use crate::metrics::ap::*;
    }
    /// `metrics::coco` (internal).
    pub mod coco {
        pub use crate::metrics::coco::*;
    }
    /// `metrics::coco_json` (internal).
    pub mod coco_json {
        pub use crate::metrics::coco_json::*;
    }
    /// `metrics::confusion` (internal).
    pub mod confusion {
        pub use crate::metrics::confusion::*;
    }
    /// `metrics::plots` (internal).
    pub mod plots {
        pub use crate::metrics::plots::*;
    }
}
/// The internal modules of `track`.
pub mod track {
    /// `track::assign` (internal).
    pub mod assign {
        pub use crate::track::assign::*;
    }
    /// `track::clock` (internal).
    pub mod clock {
        pub use crate::track::clock::*;
    }
    /// `track::kalman` (internal).
    pub mod kalman {
        pub use crate::track::kalman::*;
    }
    /// `track::trail` (internal).
    pub mod trail {
        pub use crate::track::trail::*;
    }
}
#[cfg(feature = "export")]
/// The internal modules of `export`.
pub mod export {
    /// `export::onnx_pb` (internal).
    pub mod onnx_pb {
        pub use crate::export::onnx_pb::*;
    }
}
#[cfg(feature = "serve")]
/// The internal modules of `serve`.
pub mod serve {
    /// `serve::conn` (internal).
    pub mod conn {
        pub use crate::serve::conn::*;
    }
}
