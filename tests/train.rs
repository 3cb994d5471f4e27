//! Training tests, one test binary: the dataset side (`tests/data/`: dataset YAML, label scan,
//! COCO/Roboflow layouts, the loader and augmentation, image decoding and its guards, hostile text
//! and folder trees), the loss (`tests/loss/`: the task-aligned assigner, the TAL loss terms and a
//! batch's loss and gradients against the official code) and training itself (`tests/train/`:
//! tiny runs, options, the optimizer, several ranks, and the guards: OOM, NaN, stop, resume,
//! budget). One binary rather than three so that the clean build links fewer and the long tests
//! of each area run beside the others'.
mod common;

mod train {
    mod dist;
    mod gelan;
    mod guard;
    mod optim;
    mod options;
    mod seg;
    mod tiny;
}

// `#[path]` names the folder for rustfmt, which otherwise looks for these files in the
// folder of the first module above (rustc finds them either way).
#[path = "data"]
mod data {
    mod augment;
    mod bounded_parse;
    mod coco;
    #[cfg(unix)]
    mod fs_walk;
    mod hostile_text;
    mod image_decode;
    mod image_guard;
    mod image_verdict;
    mod loader;
    mod scan;
    mod text_hygiene;
    mod yaml;
}

#[path = "loss"]
mod loss {
    mod assigner;
    mod batch;
    mod tal;
}
