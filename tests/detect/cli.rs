//! `yolo9 detect` argument validation (../shared/cases/cli_args_edges): bad values are refused at
//! parse time naming the flag and the range; the binary exits non-zero without a panic.
use crate::common;

use common::yolo9;

use clap::Parser;
use yolo9::device::DeviceSpec;
use yolo9::internals::cli::{Cli, Command as Sub};

fn parse(args: &[&str]) -> Result<yolo9::internals::cli::detect::DetectArgs, String> {
    let mut v = vec!["yolo9", "detect", "x.jpg"];
    v.extend_from_slice(args);
    match Cli::try_parse_from(v) {
        Ok(c) => match c.command {
            Sub::Detect(a) => Ok(a),
            _ => Err("not detect".into()),
        },
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn defaults_like_detect_dual() {
    let a = parse(&[]).unwrap();
    // The flags are the library's options: their defaults are `DetectorConfig::default()`.
    assert_eq!(a.config, yolo9::DetectorConfig::default());
    assert_eq!(a.config.img_size, 640);
    assert_eq!(a.config.conf, 0.25);
    assert_eq!(a.config.iou, 0.45);
    assert_eq!(a.config.max_det, 1000);
    // The official default `--device ''`: the first CUDA GPU when there is one, else the CPU.
    assert_eq!(a.device, DeviceSpec::Auto);
    #[cfg(not(feature = "cuda"))]
    assert_eq!(
        yolo9::device::select(a.device).unwrap().location(),
        candle_core::Device::Cpu.location()
    );
    assert_eq!(parse(&["--device", "cpu"]).unwrap().device, DeviceSpec::Cpu);
    assert!(yolo9::device::parse_devices("auto,0").is_err());
    assert_eq!(a.job.project, std::path::PathBuf::from("runs/detect"));
    assert_eq!(a.job.name, "exp");
    assert_eq!(
        a.job.output.draw,
        yolo9::detect::draw::DrawOptions::default()
    );
    assert_eq!(a.job.output.draw.line_thickness, 3);
    assert!(!a.config.half);
    assert!(parse(&["--half"]).unwrap().config.half);
    // --half is f32 on the CPU (as the official detect), f16 on a GPU.
    let cpu = candle_core::Device::Cpu;
    assert_eq!(
        yolo9::internals::cli::detect::inference_dtype(true, &cpu),
        candle_core::DType::F32
    );
    let a = parse(&[
        "--conf",
        "0.5",
        "--iou",
        "0.6",
        "--imgsz",
        "320",
        "--classes",
        "0",
        "2",
        "--device",
        "cuda:1",
    ])
    .unwrap();
    assert_eq!(
        (a.config.conf, a.config.iou, a.config.img_size),
        (0.5, 0.6, 320)
    );
    assert_eq!(a.config.classes, Some(vec![0, 2]));
    assert_eq!(a.device, DeviceSpec::Cuda(1));
}

#[test]
fn img_values() {
    assert_eq!(parse(&["--img", "650"]).unwrap().config.img_size, 650);
    assert_eq!(yolo9::internals::cli::detect::effective_img(650).0, 672);
    assert_eq!(yolo9::internals::cli::detect::effective_img(31).0, 32);
    for bad in ["0", "-5", "abc", "99999"] {
        let e = parse(&["--img", bad]).unwrap_err();
        assert!(e.contains("--img"), "{bad}: {e}");
        assert!(e.contains("1..=8192"), "{bad}: {e}");
    }
}

#[test]
fn thresholds_in_unit_range() {
    assert_eq!(parse(&["--conf", "0"]).unwrap().config.conf, 0.0);
    assert_eq!(parse(&["--conf", "1"]).unwrap().config.conf, 1.0);
    assert_eq!(parse(&["--iou", "0"]).unwrap().config.iou, 0.0);
    assert_eq!(parse(&["--iou", "1"]).unwrap().config.iou, 1.0);
    for (flag, v) in [
        ("--conf", "1.5"),
        ("--conf", "-0.1"),
        ("--iou", "1.2"),
        ("--conf-thres", "x"),
    ] {
        let e = parse(&[flag, v]).unwrap_err();
        assert!(e.contains("[0, 1]"), "{flag} {v}: {e}");
        assert!(e.contains("-thres"), "{flag} {v}: {e}");
    }
}

#[test]
fn device_values() {
    for bad in ["cuda:x", "-1", "0,0", "gpu7x"] {
        let e = parse(&["--device", bad]).unwrap_err();
        assert!(e.contains("--device"), "{bad}: {e}");
        assert!(e.contains(bad), "{bad}: {e}");
    }
}

#[test]
fn binary_exit_codes_without_panics() {
    let img = common::case("cli_args_edges").join("crowd_640x480.jpg");
    let img = img.to_str().unwrap();
    for args in [
        vec!["detect", img, "--img", "0"],
        vec!["detect", img, "--conf", "1.5"],
        vec!["detect", img, "--device", "cuda:x"],
    ] {
        let (code, _, err) = yolo9(&args);
        assert_ne!(code, 0, "{args:?}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // A GPU on a CPU-only build: error listing the devices, before loading anything
    // (the "weights" file is an image here; it is never read).
    if !candle_core::utils::cuda_is_available() {
        let (code, _, err) = yolo9(&["detect", img, "--device", "0", "--weights", img]);
        assert_ne!(code, 0);
        assert!(err.contains("available: cpu"), "{err}");
        assert!(err.contains("--features cuda"), "{err}");
    }
    // --cfg names the model: the shipped yolov9-s weights are refused as yolov9-c, naming the
    // option and the first tensor that differs; an unknown model lists the built-in ones.
    let (code, _, err) = yolo9(&["detect", img, "--device", "cpu", "--cfg", "yolov9-c"]);
    assert_ne!(code, 0);
    assert!(err.contains("--cfg yolov9-c"), "{err}");
    assert!(err.contains("tensor model."), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let (code, _, err) = yolo9(&["detect", img, "--device", "cpu", "--cfg", "yolov9-x"]);
    assert_ne!(code, 0);
    assert!(err.contains("yolov9-x") && err.contains("gelan-e"), "{err}");
    // Missing weights are named.
    let (code, _, err) = yolo9(&["detect", img, "--weights", "/nonexistent/w.safetensors"]);
    assert_ne!(code, 0);
    assert!(err.contains("/nonexistent/w.safetensors"), "{err}");
    assert!(!err.contains("panicked"));
}

#[test]
fn binary_end_to_end_with_default_weights() {
    // --img 650 runs at 672 with a notice; boxes in original 640x480 pixels; txt and jsonl saved.
    let img = common::case("cli_args_edges").join("crowd_640x480.jpg");
    let tmp = std::env::temp_dir().join(format!("yolo9-cli-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let (code, out, err) = yolo9(&[
        "detect",
        img.to_str().unwrap(),
        "--img",
        "650",
        "--save-txt",
        "--save-conf",
        "--json",
        "--project",
        tmp.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.contains("using --img 672"), "{err}");
    assert!(out.contains(": 512x672 "), "{out}");
    assert!(out.contains("1 image processed, 0 skipped"), "{out}");
    let run = tmp.join("exp");
    assert!(run.join("crowd_640x480.jpg").is_file());
    let jsonl = std::fs::read_to_string(run.join("predictions.jsonl")).unwrap();
    let labels = std::fs::read_to_string(run.join("labels/crowd_640x480.txt")).unwrap();
    assert_eq!(jsonl.lines().count(), labels.lines().count());
    assert!(jsonl.lines().count() > 0);
    for line in jsonl.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let b: Vec<f64> = v["xyxy"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert!(
            b[0] >= 0.0 && b[2] <= 640.0 && b[1] >= 0.0 && b[3] <= 480.0,
            "{line}"
        );
        assert!(["RBC", "WBC", "Platelets"].contains(&v["class_name"].as_str().unwrap()));
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `--exist-ok` into the folder that holds the sources: the annotated `<stem>.jpg` and
/// `labels/<stem>.txt` would replace the inputs, so detect refuses before any work, naming the
/// input and the option, and leaves every file as it was. Into a folder holding no input it
/// still works.
#[test]
fn exist_ok_into_the_source_folder_is_refused_and_nothing_is_overwritten() {
    let tmp = common::tmpdir("cli-exist-ok");
    let src = tmp.join("imgs");
    std::fs::create_dir_all(src.join("labels")).unwrap();
    let img = common::case("cli_args_edges").join("crowd_640x480.jpg");
    std::fs::copy(&img, src.join("crowd_640x480.jpg")).unwrap();
    std::fs::write(src.join("labels/crowd_640x480.txt"), "0 0.5 0.5 0.1 0.1\n").unwrap();
    let before = |p: &str| std::fs::read(src.join(p)).unwrap();
    let (jpg, txt) = (
        before("crowd_640x480.jpg"),
        before("labels/crowd_640x480.txt"),
    );
    let args = |name: &str| {
        vec![
            "detect".to_string(),
            src.to_str().unwrap().to_string(),
            "--save-txt".into(),
            "--exist-ok".into(),
            "--img".into(),
            "320".into(),
            "--project".into(),
            tmp.to_str().unwrap().to_string(),
            "--name".into(),
            name.to_string(),
        ]
    };
    let a = args("imgs");
    let (code, out, err) = yolo9(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(
        err.contains("--exist-ok") && err.contains("crowd_640x480.jpg"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(before("crowd_640x480.jpg"), jpg);
    assert_eq!(before("labels/crowd_640x480.txt"), txt);
    // A reused folder without inputs is fine.
    std::fs::create_dir_all(tmp.join("out")).unwrap();
    let a = args("out");
    let (code, out, err) = yolo9(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(tmp.join("out/crowd_640x480.jpg").is_file());
    let _ = std::fs::remove_dir_all(&tmp);
}

/// clap checks a command's definition (unique argument ids across flattened option groups, ...)
/// only when it builds it, in debug builds: every subcommand is checked here, so a clash such as
/// two `match_thresh` ids fails this test, not a user's first `yolo9 track`.
#[test]
fn every_subcommand_is_well_formed() {
    use clap::CommandFactory;
    yolo9::internals::cli::Cli::command().debug_assert();
}
