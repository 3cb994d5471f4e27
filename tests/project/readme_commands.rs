//! Every `yolo9 …` command README.md and the topic pages `docs/*.md` show is either run here
//! exactly as written, or listed in [`SKIPPED`] with the reason it cannot run offline on the CPU in
//! seconds (a GPU, an official checkpoint that is not shipped, hours of training, a synopsis with
//! `[optional]` parts).
//!
//! The commands are read from the documents themselves ([`documents`]: README.md, then every
//! `docs/*.md`): the lines of their code blocks that start with `yolo9 ` (or `$ yolo9 `, joined
//! over `\` line continuations, a trailing `# comment` cut), the blocks'
//! `cargo run --release -- ARGS` (run as `yolo9 ARGS`: the same program, without building it
//! again), and the inline code spans of the prose that start with `yolo9 ` and have at least one
//! argument (`yolo9 check` alone names a subcommand, it is not a command). A command a document
//! gains or changes fails [`every_readme_command_is_run_or_skipped_with_a_reason`] until it is
//! added to [`RUN`] or [`SKIPPED`]; an entry no document shows any more fails it too. README.md
//! itself stays a README: [`readme_is_at_most_300_lines`].
//!
//! Each command of [`RUN`] runs in a fresh folder laid out like the repository root of a new user's
//! clone: copies of `examples/images`, `examples/videos`, `weights/` and `docs/bccd-run/`,
//! `../shared` beside it (a link to the shared folder), and the files the documents' placeholders
//! stand for: `data.yaml` (a 2-image dataset), `best.safetensors` (a copy of the shipped weights)
//! and `bccd/data.yaml` (BCCD's layout and classes, 3 images per split, so validation takes
//! seconds; the full test split's numbers are asserted by
//! `val_metrics::shipped_weights_reach_the_acceptance_map`).
//! Nothing is written into the repository or into `../shared`.
use crate::common;

use std::path::{Path, PathBuf};

/// Commands of the documents run by [`runnable_readme_commands_succeed`], as they are written.
const RUN: &[&str] = &[
    "cargo run --release -- detect examples/images",
    "yolo9 detect examples/images",
    "yolo9 detect examples/images/BloodImage_00007.jpg",
    "yolo9 track examples/videos/cells.mp4 --img 384 --classes 1 2",
    "yolo9 convert best.safetensors --half --infer",
    "yolo9 convert best.safetensors --int8 --data bccd/data.yaml -o best-int8.safetensors",
    "yolo9 convert ../shared/reference/bccd-official-best.pt --half --infer -o bccd-official-best.safetensors",
    "yolo9 val --data bccd/data.yaml --split test",
    "yolo9 val --data bccd/data.yaml --weights weights/yolov9-s-bccd.safetensors --split test --device cpu --save-json",
    "yolo9 check --data data.yaml",
    "yolo9 export",
    "yolo9 export --nms --half -o bccd-nms-half.onnx",
    "yolo9 plot docs/bccd-run/yolo9-results.csv ../shared/reference/bccd-official-results.csv --labels \"yolo9 (50 epochs, --budget 8GiB)\" \"official train_dual.py (50 epochs)\" -o docs/bccd-curves.png",
];

const GPU: &str = "needs a CUDA GPU (--device 0)";
const SYNOPSIS: &str = "a synopsis: [optional] parts and placeholders, not one command";
const TRAINING: &str = "a full training run (hours on the CPU); tests/train/tiny.rs and \
                        tests/train/guard.rs train tiny runs";
const DOWNLOAD: &str = "downloads an official checkpoint from the release (no test touches the \
                        internet); tests/model/weights_download.rs runs `detect --weights yolov9-s` \
                        against a release server on loopback";
const FRAGMENT: &str = "a fragment of a sentence whose data and weights the prose names";

/// Commands of the documents that are not run here, with the reason.
const SKIPPED: &[(&str, &str)] = &[
    ("yolo9 train --data data.yaml", TRAINING),
    (
        "yolo9 export --weights my-seg.safetensors",
        "a user's trained segmentation weights; tests/model/export_onnx.rs exports the tiny-seg \
         and tiny-dseg oracle graphs and runs them in tract",
    ),
    (
        "yolo9 val --weights my-seg.safetensors --data data.yaml",
        "a user's trained segmentation weights and dataset; tests/train/seg.rs validates the \
         tiny-seg run's weights on its polygon split",
    ),
    (
        "yolo9 train --cfg gelan-c-seg --data data.yaml",
        "hours of training on a user's polygon dataset; tests/train/seg.rs trains the tiny-seg \
         graph on polygon labels through the same engine",
    ),
    ("yolo9 convert gelan-c-seg", DOWNLOAD),
    (
        "yolo9 detect examples/images --weights gelan-c-seg --save-txt --json",
        "downloads the official gelan-c-seg checkpoint (no test touches the internet); \
         tests/model/seg.rs runs the segmentation detector on an official checkpoint of a small \
         graph",
    ),
    (
        "yolo9 export --weights yolov9-c.pt --dynamic",
        "needs the official yolov9-c.pt (not shipped); tests/model/export_onnx.rs exports dynamic models",
    ),
    (
        "yolo9 export [--weights W] [--cfg M] [--img 640 | --img H W] [--batch 1 | --dynamic] [--half] [--nms [--conf 0.25] [--iou 0.45] [--max-det 300]] [--opset 17] [-o model.onnx]",
        SYNOPSIS,
    ),
    ("yolo9 train --budget 8GiB", FRAGMENT),
    (
        "yolo9 train --data ../shared/datasets/bccd/data.yaml --cfg yolov9-t --img 320 --batch 16 --epochs 1 --device cpu --workers 2 --noval",
        "a CPU speed measurement (3 minutes on 2 cores); tests/train/tiny.rs trains tiny runs on the CPU",
    ),
    (
        "yolo9 val --data ../shared/datasets/bccd/data.yaml --split test --device cpu",
        "a CPU speed measurement on the whole test split; `yolo9 val --data bccd/data.yaml \
         --split test` runs here, and val_metrics asserts the full split's table",
    ),
    (
        "yolo9 train --data data.yaml --device 0,1 --batch 64",
        "needs two CUDA GPUs; tests/train/dist.rs trains 2 and 3 ranks on the CPU",
    ),
    (
        "yolo9 train --data b16/data.yaml --cfg yolov9-s --batch 16 --workers 8 --epochs 3 --close-mosaic 0 --img 640 [--budget 8GiB|6GiB]",
        GPU,
    ),
    (
        "yolo9 train --data bccd/data.yaml --cfg gelan-s --device 0 --batch 16 --epochs 50 --img 640 --close-mosaic 10 --workers 8 --seed 0 --noplots",
        GPU,
    ),
    (
        "yolo9 train --data bccd/data.yaml --cfg yolov9-s --device 0 --batch 16 --epochs 50 --img 640 --close-mosaic 10 --workers 8 --seed 0 --noplots",
        GPU,
    ),
    (
        "yolo9 serve --device cpu --img 640 --drain-s 10 --decode-budget-mb 2048",
        "a service that runs until stopped; benches/serve_hostile.py drives it, tests/detect/serve_limits.rs tests its limits",
    ),
    ("yolo9 val --split test --device cpu", FRAGMENT),
    ("yolo9 val --split test", FRAGMENT),
    ("yolo9 val --save-json", FRAGMENT),
    ("yolo9 train --strict-fp32", FRAGMENT),
    ("yolo9 detect --half", FRAGMENT),
    (
        "yolo9 detect SOURCE... [--weights W] [--img 640] [--conf-thres 0.25] [--iou-thres 0.45]",
        SYNOPSIS,
    ),
    (
        "yolo9 train --data data.yaml [--weights W] [--epochs 100] [--img 640] [--batch 16|auto] [--device auto|cpu|N]",
        SYNOPSIS,
    ),
    (
        "yolo9 train --resume runs/train/exp [--epochs N] [--data moved/data.yaml]",
        SYNOPSIS,
    ),
    (
        "yolo9 val --data data.yaml [--weights W] [--split val|test] [--img 640] [--batch 32] [--half]",
        SYNOPSIS,
    ),
    (
        "yolo9 plot runs/train/exp other/results.csv --labels yolo9 official [-o curves.png]",
        SYNOPSIS,
    ),
    (
        "yolo9 serve [--weights W] [--device auto|cpu|N] [--addr 127.0.0.1:8080] [--img 640] [--conf 0.25] [--iou 0.45]",
        SYNOPSIS,
    ),
    (
        "yolo9 convert yolov9-s.pt",
        "needs the official yolov9-s.pt (not shipped; tests/model/convert.rs converts it from \
         ../shared/reference)",
    ),
    (
        "yolo9 convert yolov9-s.pt -o w.safetensors --half --infer",
        "needs the official yolov9-s.pt (not shipped; tests/model/convert.rs converts it from \
         ../shared/reference)",
    ),
    ("yolo9 train --cfg yolov9-c --data data.yaml --budget 8GiB", TRAINING),
    ("yolo9 train --cfg gelan-c --data data.yaml", TRAINING),
    ("yolo9 train --weights gelan-c.pt --data data.yaml", TRAINING),
    ("yolo9 train --cfg my-model.yaml --data data.yaml", TRAINING),
    (
        "yolo9 detect --weights yolov9-e-converted.pt img.jpg",
        "needs the official yolov9-e-converted.pt (not shipped; tests/model/sizes.rs builds \
         every size)",
    ),
    (
        "yolo9 train --cfg yolov9-X --data bccd/data.yaml --epochs 3 --img 640 --batch 16 --budget 8GiB --device 0",
        GPU,
    ),
    ("yolo9 serve --device 0", GPU),
    (
        "yolo9 detect 0",
        "needs a webcam (and runs until Ctrl-C); tests/detect/stream.rs checks that a missing \
         one is named",
    ),
    (
        "yolo9 track rtsp://192.168.1.10:554/stream1 --vid-stride 2 --json",
        "needs a camera's RTSP stream; tests/detect/track_cli.rs tracks an image sequence and \
         tests/detect/stream.rs serves a stream on loopback",
    ),
    (
        "yolo9 track SOURCE... [every detect flag] [--tracker bytetrack.yaml] [--track-high-thresh 0.5] [--track-low-thresh 0.1]",
        SYNOPSIS,
    ),
    (
        "yolo9 detect aerial.tif --tile 640",
        "an example of a user's large image; tests/detect/tiles.rs runs detect --tile on a large \
         image it composes from BCCD",
    ),
    (
        "yolo9 val --data large/data.yaml --tile 640",
        "needs a large-image dataset: benches/tiles.sh composes one from BCCD and runs this; \
         tests/detect/tiles.rs validates with tiles",
    ),
    (
        "yolo9 detect rtsp://192.168.1.10:554/stream1 --vid-stride 2 --json",
        "needs a camera's RTSP stream; tests/detect/stream.rs serves a stream on loopback",
    ),
    (
        "yolo9 train --data bccd/data.yaml --device 0 --batch 16 --epochs 50 --amp true|false --close-mosaic 10 --workers 8 --seed 0 --noplots",
        GPU,
    ),
    (
        "yolo9 val --data bccd/data.yaml --weights runs/train/exp/weights/best.safetensors --split test --device 0",
        GPU,
    ),
    (
        "yolo9 train --data bccd/data.yaml --device 0 --budget 8GiB --batch 16 --epochs 50 --close-mosaic 10 --workers 8 --seed 0 --save-interval 1 --project runs/train --name bccd",
        GPU,
    ),
    ("yolo9 train --resume runs/train/bccd", GPU),
    (
        "yolo9 val --data bccd/data.yaml --weights runs/train/bccd/weights/best.safetensors --split test --device 0",
        GPU,
    ),
    (
        "yolo9 convert runs/train/bccd/weights/best.safetensors --half --infer -o weights/yolov9-s-bccd.safetensors",
        "needs the H200 training run's best.safetensors (its sha256 is in weights/README.md)",
    ),
    ("yolo9 val --data bccd/data.yaml --split test --device 0", GPU),
    ("yolo9 detect examples/images --weights yolov9-s", DOWNLOAD),
    (
        "yolo9 detect examples/images --weights yolov9-c-converted",
        DOWNLOAD,
    ),
    (
        "yolo9 val --data coco.yaml --weights yolov9-e-converted",
        "downloads an official checkpoint and needs COCO (not shipped); \
         tests/model/weights_download.rs serves a checkpoint on loopback",
    ),
    ("yolo9 train --weights gelan-c --data data.yaml", TRAINING),
    ("yolo9 convert yolov9-c --infer --half", DOWNLOAD),
    ("yolo9 convert --int8", FRAGMENT),
    (
        "yolo9 convert W --int8 --data data.yaml [--calib-images 100] [--half]",
        SYNOPSIS,
    ),
];

/// A command found in a document: its text (whitespace collapsed), the document and the line it
/// starts on.
#[derive(Debug, Clone)]
struct Found {
    text: String,
    file: String,
    line: usize,
}

/// `yolo9 SUBCOMMAND ...` (not, say, the Cargo.toml line `yolo9 = { ... }`) or
/// `cargo run --release -- ...`.
fn is_command(s: &str) -> bool {
    let sub = s.strip_prefix("yolo9 ").and_then(|r| r.split(' ').next());
    sub.is_some_and(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase()))
        || s.starts_with("cargo run --release -- ")
}

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Cuts a trailing `# comment` (a `#` after whitespace, outside quotes).
fn strip_comment(s: &str) -> &str {
    let mut quoted = false;
    let mut prev_space = false;
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '#' if prev_space && !quoted => return s[..i].trim_end(),
            _ => {}
        }
        prev_space = c.is_whitespace();
    }
    s
}

/// The commands of the markdown text `md` (see the module doc for the rules), with an empty
/// [`Found::file`].
fn readme_commands(md: &str) -> Vec<Found> {
    let lines: Vec<&str> = md.lines().collect();
    let mut found = Vec::new();
    let mut fence = false;
    // The prose (outside code blocks) with the line number of each of its lines.
    let mut prose: Vec<(usize, &str)> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if l.trim_start().starts_with("```") {
            fence = !fence;
            prose.push((i + 1, ""));
            i += 1;
            continue;
        }
        if fence {
            let start = i + 1;
            let mut s = l.trim().to_string();
            while s.ends_with('\\') && i + 1 < lines.len() {
                i += 1;
                s.pop();
                s = format!("{} {}", s.trim_end(), lines[i].trim());
            }
            let s = s.strip_prefix("$ ").unwrap_or(&s);
            if is_command(s) {
                found.push(Found {
                    text: squash(strip_comment(s)),
                    file: String::new(),
                    line: start,
                });
            }
        } else {
            prose.push((i + 1, l));
        }
        i += 1;
    }
    // Inline code spans, which may run over a line break.
    let text: String = prose.iter().map(|(_, l)| format!("{l}\n")).collect();
    let mut line_of = Vec::with_capacity(text.len());
    for (n, l) in &prose {
        line_of.extend(std::iter::repeat_n(*n, l.len() + 1));
    }
    let mut rest = 0;
    while let Some(open) = text[rest..].find('`').map(|k| rest + k) {
        let Some(close) = text[open + 1..].find('`').map(|k| open + 1 + k) else {
            break;
        };
        let span = squash(&text[open + 1..close]);
        if is_command(&span) && span.split(' ').count() > 2 {
            found.push(Found {
                text: span,
                file: String::new(),
                line: line_of[open],
            });
        }
        rest = close + 1;
    }
    found.sort_by_key(|f| f.line);
    found
}

/// The documents whose commands are checked, as (path relative to the repository, text):
/// README.md, then every `docs/*.md` in name order.
fn documents() -> Vec<(String, String)> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut names = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(repo.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(repo.join(&n)).unwrap();
            (n, text)
        })
        .collect()
}

/// The commands of every document of [`documents`].
fn documented_commands() -> Vec<Found> {
    documents()
        .into_iter()
        .flat_map(|(name, text)| {
            readme_commands(&text).into_iter().map(move |f| Found {
                file: name.clone(),
                ..f
            })
        })
        .collect()
}

#[test]
fn readme_is_at_most_300_lines() {
    let readme = &documents()[0];
    assert_eq!(readme.0, "README.md");
    let n = readme.1.lines().count();
    assert!(
        n <= 300,
        "README.md has {n} lines: keep it a README (what it is, set-up, commands, models, a \
         library snippet, one speed table, links) and move topics into docs/"
    );
}

#[test]
fn the_extraction_reads_blocks_continuations_comments_and_inline_spans() {
    let md = "Intro `yolo9 detect a.jpg` and `yolo9 check` and `yolo9 val\n--data d.yaml`.\n\
              `yolo9 = { default-features = false }`\n\
              ```bash\nyolo9 train --data d.yaml \\\n   --epochs 3   # three\ncargo run --release -- detect x\n\
              cargo test\n```\n```\n$ yolo9 plot a.csv --labels \"a # b\"\n   all  3\n```\n";
    let got: Vec<(String, usize)> = readme_commands(md)
        .into_iter()
        .map(|f| (f.text, f.line))
        .collect();
    assert_eq!(
        got,
        vec![
            ("yolo9 detect a.jpg".to_string(), 1),
            ("yolo9 val --data d.yaml".to_string(), 1),
            ("yolo9 train --data d.yaml --epochs 3".to_string(), 5),
            ("cargo run --release -- detect x".to_string(), 7),
            ("yolo9 plot a.csv --labels \"a # b\"".to_string(), 11),
        ]
    );
    assert_eq!(
        split_args("plot a --labels \"x y\" 'z w' -o o.png"),
        ["plot", "a", "--labels", "x y", "z w", "-o", "o.png"]
    );
}

#[test]
fn every_readme_command_is_run_or_skipped_with_a_reason() {
    let found = documented_commands();
    assert!(found.len() >= 20, "only {} commands found", found.len());
    let unlisted: Vec<String> = found
        .iter()
        .filter(|f| !RUN.contains(&f.text.as_str()) && !SKIPPED.iter().any(|(c, _)| *c == f.text))
        .map(|f| format!("{}:{}: {}", f.file, f.line, f.text))
        .collect();
    assert!(
        unlisted.is_empty(),
        "commands of README.md or docs/ neither run nor skipped with a reason (add them to RUN or \
         SKIPPED in tests/project/readme_commands.rs):\n{}",
        unlisted.join("\n")
    );
    let stale: Vec<&str> = RUN
        .iter()
        .copied()
        .chain(SKIPPED.iter().map(|(c, _)| *c))
        .filter(|c| !found.iter().any(|f| f.text == *c))
        .collect();
    assert!(
        stale.is_empty(),
        "not in README.md or docs/*.md any more: {stale:#?}"
    );
    // The README's set-up commands are the main job and the tests.
    let readme = &documents()[0].1;
    for c in [
        "cargo run --release -- detect examples/images",
        "cargo test --locked",
    ] {
        assert!(readme.contains(c), "README.md does not show `{c}`");
    }
    // The intro's example detects a shipped image.
    for f in found.iter().filter(|f| f.text.starts_with("yolo9 detect ")) {
        for arg in f.text.split(' ').skip(2).filter(|a| a.ends_with(".jpg")) {
            assert!(
                SKIPPED.iter().any(|(c, _)| *c == f.text)
                    || Path::new(env!("CARGO_MANIFEST_DIR")).join(arg).is_file(),
                "{}:{}: {arg} is not in the repository",
                f.file,
                f.line
            );
        }
    }
}

/// Splits a command line as a POSIX shell does for these commands: words separated by blanks,
/// `"…"` and `'…'` quoting.
fn split_args(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut in_word = false;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    out
}

/// A fresh folder laid out like a new user's clone (see the module doc); returns the clone's
/// root, the working directory of the commands.
fn clone_like(tag: &str) -> PathBuf {
    let top = common::tmpdir(tag);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = top.join("yolo9");
    for d in [
        "examples/images",
        "examples/videos",
        "weights",
        "docs/bccd-run",
    ] {
        common::copy_tree(&repo.join(d), &root.join(d));
    }
    let shared = common::shared_dir().canonicalize().unwrap();
    std::os::unix::fs::symlink(shared, top.join("shared")).unwrap();
    common::tiny_dataset(&root, 2);
    std::fs::copy(
        repo.join("weights/yolov9-s-bccd.safetensors"),
        root.join("best.safetensors"),
    )
    .unwrap();
    // bccd/: BCCD's data.yaml and the first 3 images of each split.
    let bccd = common::shared_dir().join("datasets/bccd");
    std::fs::create_dir_all(root.join("bccd")).unwrap();
    std::fs::copy(bccd.join("data.yaml"), root.join("bccd/data.yaml")).unwrap();
    for split in ["train", "val", "test"] {
        let mut names: Vec<PathBuf> = std::fs::read_dir(bccd.join("images").join(split))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for (sub, ext) in [("images", None), ("labels", Some("txt"))] {
            std::fs::create_dir_all(root.join("bccd").join(sub).join(split)).unwrap();
            for img in names.iter().take(3) {
                let name = match ext {
                    None => PathBuf::from(img.file_name().unwrap()),
                    Some(e) => Path::new(img.file_name().unwrap()).with_extension(e),
                };
                let from = bccd.join(sub).join(split).join(&name);
                if from.is_file() {
                    std::fs::copy(from, root.join("bccd").join(sub).join(split).join(&name))
                        .unwrap();
                }
            }
        }
    }
    root
}

/// Runs one README command in `cwd`: `(exit code, stdout, stderr)`.
fn run(command: &str, cwd: &Path) -> (i32, String, String) {
    let words = split_args(command);
    let args = match words.first().map(String::as_str) {
        Some("yolo9") => &words[1..],
        Some("cargo") => &words[4..], // cargo run --release -- ARGS
        _ => panic!("not a yolo9 command: {command}"),
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    common::yolo9_in(Some(cwd), &args)
}

/// What each command of [`RUN`] must have done in `root`, beyond exiting with 0.
fn check_outputs(command: &str, root: &Path, out: &str, err: &str) {
    let both = format!("{out}\n{err}");
    let is_file = |p: &str| assert!(root.join(p).is_file(), "{command}: {p} missing\n{both}");
    let loads_nc3 = |p: &str| {
        let w = yolo9::Weights::load(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(w.meta.nc, 3, "{p}");
    };
    let words: Vec<&str> = command.split(' ').collect();
    match (words[1], words.get(2).copied()) {
        ("detect", _) | ("run", _) => {
            let images: &[&str] = if command.ends_with(".jpg") {
                &["BloodImage_00007.jpg"]
            } else {
                &[
                    "BloodImage_00007.jpg",
                    "BloodImage_00011.jpg",
                    "BloodImage_00033.jpg",
                ]
            };
            let noun = if images.len() == 1 { "image" } else { "images" };
            assert!(
                both.contains(&format!("{} {noun} processed, 0 skipped", images.len())),
                "{command}\n{both}"
            );
            for i in images {
                is_file(&format!("runs/detect/exp/{i}"));
            }
            // Blood cells are found in every image (the summary line names a class).
            assert!(
                both.matches("RBC").count() >= images.len(),
                "{command}\n{both}"
            );
        }
        ("convert", _) if command.contains("--int8") => {
            // Calibrated on bccd/'s 3 val images; the ranges are in the file.
            loads_nc3("best-int8.safetensors");
            assert!(
                both.contains("--int8: calibrated on 3 images"),
                "{command}\n{both}"
            );
            let w = yolo9::Weights::load(root.join("best-int8.safetensors")).unwrap();
            assert_eq!(w.meta.int8.map(|c| c.convs.len()), Some(185));
        }
        ("convert", Some("best.safetensors")) => {
            // The default output never replaces the input.
            is_file("best-infer-half.safetensors");
            loads_nc3("best-infer-half.safetensors");
            assert_eq!(
                std::fs::read(root.join("best.safetensors")).unwrap(),
                std::fs::read(root.join("weights/yolov9-s-bccd.safetensors")).unwrap(),
                "the input was changed"
            );
        }
        ("convert", _) => loads_nc3("bccd-official-best.safetensors"),
        ("val", _) => {
            let all = out
                .lines()
                .find(|l| l.trim_start().starts_with("all "))
                .unwrap_or_else(|| panic!("{command}: no `all` row\n{both}"));
            let cols: Vec<f64> = all
                .split_whitespace()
                .skip(1)
                .map(|v| v.parse().unwrap())
                .collect();
            // 3 test images; mAP50 of the shipped weights on them is far from 0.
            assert_eq!(cols[0], 3.0, "{all}");
            assert!(cols[4] > 0.3, "mAP50 {all}");
            if command.contains("--save-json") {
                is_file("runs/val/exp/predictions.json");
                assert!(out.contains("Average Precision"), "{out}");
            }
        }
        ("check", _) => {
            assert!(out.contains("train: 2 images"), "{command}\n{both}");
            assert!(out.contains("val: 1 images"), "{command}\n{both}");
        }
        ("export", _) => {
            let f = if command.contains("-o ") {
                "bccd-nms-half.onnx"
            } else {
                "yolov9-s-bccd.onnx"
            };
            is_file(f);
            assert!(out.contains("exported "), "{out}");
            assert!(std::fs::metadata(root.join(f)).unwrap().len() > 10_000_000);
        }
        ("track", _) => {
            // The README's count for this clip, the annotated video, and the MOTChallenge file:
            // rows of 10 fields whose IDs are the 4 tracks.
            assert!(
                both.contains("cells.mp4: 4 tracks: 1 WBC, 3 Platelets"),
                "{command}\n{both}"
            );
            is_file("runs/track/exp/cells.mp4");
            is_file("runs/track/exp/mot/cells.txt");
            let mot = std::fs::read_to_string(root.join("runs/track/exp/mot/cells.txt")).unwrap();
            let mut ids = std::collections::BTreeSet::new();
            for row in mot.lines() {
                let f: Vec<&str> = row.split(',').collect();
                assert_eq!(f.len(), 10, "{row}");
                ids.insert(f[1].parse::<u32>().unwrap());
            }
            assert_eq!(ids.len(), 4, "track IDs {ids:?}\n{mot}");
        }
        ("plot", _) => {
            is_file("docs/bccd-curves.png");
            let img = image::open(root.join("docs/bccd-curves.png")).unwrap();
            assert_eq!((img.width(), img.height()), (2000, 800));
        }
        _ => panic!("no output check for {command}"),
    }
}

/// Each command in its own copy of the repository, two at a time (a CI machine has 2 cores and
/// most commands wait on one).
#[test]
fn runnable_readme_commands_succeed() {
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(command) = RUN.get(k) else { break };
                    let root = clone_like(&format!("readme-{k}"));
                    let (code, out, err) = run(command, &root);
                    assert_eq!(code, 0, "{command}\n{out}\n{err}");
                    assert!(!err.contains("panicked"), "{command}\n{err}");
                    check_outputs(command, &root, &out, &err);
                    let _ = std::fs::remove_dir_all(root.parent().unwrap());
                })
            })
            .collect();
        for w in workers {
            if let Err(e) = w.join() {
                std::panic::resume_unwind(e);
            }
        }
    });
}
