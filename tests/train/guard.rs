//! Training that cannot die (CPU, tiny BCCD runs at 64x64): out-of-memory recovery, the NaN/Inf
//! guard, stop/kill and exact resume, memory-budget sizing, and clear errors for finished runs
//! and torn checkpoints. Faults are injected with `Faults` / `YOLO9_FAULTS` (see
//! `yolo9::internals::train::guard`).

use crate::common;

use common::tmpdir;

use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use yolo9::internals::memory::MemoryProbe;
use yolo9::internals::train::budget::{plan, BudgetRequest};
use yolo9::internals::train::checkpoint::load_state;
use yolo9::internals::train::guard::Faults;
use yolo9::train::trainer::{train, train_with, StopFlag, TrainEvent, TrainObserver, TrainOptions};

/// 2 train images, batch 1 (2 iterations per epoch), 3 epochs, no augmentation.
fn options(dir: &Path, name: &str) -> TrainOptions {
    common::tiny_run_options(dir, name)
}

fn tensors(path: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(path, &Device::Cpu).unwrap()
}

/// Largest |a − b| over the float tensors of two weight files (both must hold the same names).
fn max_diff(a: &Path, b: &Path) -> f32 {
    let (a, b) = (tensors(a), tensors(b));
    assert_eq!(a.len(), b.len());
    let mut m = 0f32;
    for (k, ta) in &a {
        if ta.dtype() != DType::F32 {
            continue;
        }
        m = m.max(common::max_abs(ta, &b[k]) as f32);
    }
    m
}

fn all_finite(path: &Path) -> bool {
    tensors(path).values().all(|t| {
        t.dtype() != DType::F32
            || t.flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .all(|v| v.is_finite())
    })
}

#[test]
fn oom_halves_the_micro_batch_redoes_the_batch_and_matches_a_run_at_that_size() {
    let dir = tmpdir("oom");
    // Batch 2 (one batch per epoch); every micro-batch above 1 image fails after its forward
    // pass (BN statistics already updated), so the first batch is redone as 2 x 1.
    let mut a = options(&dir, "oom");
    a.batch = 2;
    a.faults = Faults {
        oom_above: Some(1),
        ..Faults::default()
    };
    let ra = train(&a).unwrap();
    assert_eq!(ra.epochs.len(), 3, "an epoch was lost");
    assert_eq!(ra.epochs[0].oom_events, 1);
    assert_eq!(ra.epochs[1].oom_events + ra.epochs[2].oom_events, 0);
    assert!(ra.epochs.iter().all(|e| e.micro == 1));
    // The same run with micro-batch 1 from the start: identical weights, so the failed attempt
    // left no trace (BN statistics restored, partial gradients dropped).
    let mut b = options(&dir, "micro1");
    b.batch = 2;
    b.micro_batch = Some(1);
    let rb = train(&b).unwrap();
    let d = max_diff(&ra.last, &rb.last);
    assert!(
        d <= 1e-6,
        "OOM-recovered run differs from the micro-batch-1 run by {d}"
    );
    // And micro-batching is visible: the whole-batch run differs (the test can fail).
    let mut c = options(&dir, "micro2");
    c.batch = 2;
    let rc = train(&c).unwrap();
    assert!(max_diff(&rb.last, &rc.last) > 1e-6);
    let csv = std::fs::read_to_string(ra.run_dir.join("results.csv")).unwrap();
    let row1: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = header.iter().position(|h| *h == "oom_events").unwrap();
    assert_eq!(row1[col], "1");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nan_losses_skip_steps_are_counted_and_roll_back_with_half_the_lr() {
    let dir = tmpdir("nan");
    let reference = train(&options(&dir, "ref")).unwrap();
    let mut o = options(&dir, "nan");
    o.nan_patience = 3;
    // Iterations 2, 3, 4 (epoch 1 batches 0 and 1, epoch 2 batch 0): three in a row.
    o.faults = Faults {
        nan_at: vec![2, 3, 4],
        ..Faults::default()
    };
    let r = train(&o).unwrap();
    let nan: Vec<usize> = r.epochs.iter().map(|e| e.nan_events).collect();
    assert_eq!(nan, vec![0, 2, 1]);
    // After the rollback the LR is half the scheduled one.
    let (lr, lr_ref) = (r.epochs[2].lr, reference.epochs[2].lr);
    for g in 0..3 {
        assert!(
            (lr[g] - 0.5 * lr_ref[g]).abs() <= 1e-12 * lr_ref[g].abs().max(1.0),
            "group {g}: lr {} vs scheduled {}",
            lr[g],
            lr_ref[g]
        );
    }
    assert!((r.epochs[1].lr[1] - reference.epochs[1].lr[1]).abs() < 1e-15);
    assert!(all_finite(&r.last) && all_finite(&r.run_dir.join("weights/state.safetensors")));
    let st = load_state(&r.run_dir.join("weights/state.safetensors")).unwrap();
    assert_eq!(
        (st.meta.counters.nan_rollbacks, st.meta.counters.lr_scale),
        (1, 0.5)
    );
    // The skipped steps changed the result.
    assert!(max_diff(&r.last, &reference.last) > 1e-6);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stop_mid_accumulation_then_resume_ends_with_the_uninterrupted_weights() {
    let dir = tmpdir("stop");
    let full = train(&options(&dir, "full")).unwrap();
    // Stop after iteration 3 (the last batch of epoch 1), with gradients accumulated since the
    // optimizer step at iteration 2 still pending.
    let mut o = options(&dir, "stopped");
    o.faults = Faults {
        stop_at: Some(3),
        ..Faults::default()
    };
    let s = train(&o).unwrap();
    assert!(s.interrupted);
    assert_eq!(s.epochs.len(), 1, "only epoch 0 finished");
    let st = load_state(&s.run_dir.join("weights/state.safetensors")).unwrap();
    assert_eq!((st.meta.epoch, st.meta.next_batch), (1, 2));
    assert!(!st.acc.is_empty(), "pending gradients were not saved");
    let mut r = TrainOptions::new(PathBuf::new());
    r.resume = Some(s.run_dir.clone());
    r.verbose = false;
    let done = train(&r).unwrap();
    assert!(!done.interrupted);
    assert_eq!(
        done.epochs.iter().map(|e| e.epoch).collect::<Vec<_>>(),
        vec![1, 2]
    );
    let d = max_diff(&full.last, &done.last);
    assert!(
        d <= 1e-6,
        "resumed run differs from the uninterrupted one by {d}"
    );
    let csv = std::fs::read_to_string(done.run_dir.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 4, "{csv}");
    // A finished run says so and offers --epochs; --epochs extends it.
    let err = format!("{:#}", train(&r).unwrap_err());
    assert!(
        err.contains("already finished") && err.contains("--epochs"),
        "{err}"
    );
    r.extend_epochs = Some(4);
    let more = train(&r).unwrap();
    assert_eq!(
        more.epochs.iter().map(|e| e.epoch).collect::<Vec<_>>(),
        vec![3]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a library caller sees: its observer receives the run's output (nothing is printed), in
/// order, and its own stop flag, set from the observer after the first batch, stops the run at
/// the next batch boundary with the state saved there.
#[test]
fn an_observer_records_the_run_and_the_callers_stop_flag_stops_it() {
    struct Recorder {
        events: Vec<String>,
        stop: StopFlag,
    }
    impl TrainObserver for Recorder {
        fn event(&mut self, e: &TrainEvent<'_>) {
            let r = match *e {
                TrainEvent::Line(l) => format!("line {l}"),
                TrainEvent::Text(t) => format!("text {t}"),
                TrainEvent::Note(l) => format!("note {l}"),
                TrainEvent::EpochStart {
                    epoch,
                    epochs,
                    batches,
                    first,
                    header,
                } => {
                    assert!(header.contains("box_loss"), "{header}");
                    assert_eq!((epoch, epochs), (0, 3));
                    format!("start {batches} {first}")
                }
                TrainEvent::EpochLine(l) => format!("epoch_line {l}"),
                TrainEvent::Batch {
                    epoch,
                    batch,
                    losses,
                    instances,
                    size,
                    status,
                    ..
                } => {
                    assert!(status.contains("1/3"), "{status}");
                    assert_eq!((epoch, batch, size), (0, 0, 64));
                    assert!(instances > 0 && losses.iter().all(|l| l.is_finite() && *l > 0.0));
                    self.stop.request();
                    "batch".into()
                }
                TrainEvent::EpochAbandoned { .. } => "abandoned".into(),
                TrainEvent::EpochTrained { .. } => "trained".into(),
                TrainEvent::EpochEnd { .. } => "end".into(),
                TrainEvent::EpochClosed { .. } => "closed".into(),
                _ => "other".into(),
            };
            self.events.push(r);
        }
    }
    let dir = tmpdir("observer");
    let mut o = options(&dir, "observed");
    o.verbose = true;
    o.device = yolo9::device::DeviceSpec::Cpu;
    let stop = StopFlag::install().unwrap();
    let mut rec = Recorder {
        events: Vec::new(),
        stop: stop.clone(),
    };
    let s = train_with(&o, &stop, &mut rec).unwrap();
    assert!(s.interrupted && s.epochs.is_empty());
    let st = load_state(&s.run_dir.join("weights/state.safetensors")).unwrap();
    assert_eq!((st.meta.epoch, st.meta.next_batch), (0, 1));
    let e = &rec.events;
    let at = |p: &str| {
        e.iter()
            .position(|x| x.starts_with(p))
            .unwrap_or_else(|| panic!("no `{p}` in {e:#?}"))
    };
    assert!(at("text train: ") < at("line training 2 images"), "{e:#?}");
    let start = at("start 2 0");
    assert_eq!(
        e[start..start + 4],
        ["start 2 0", "batch", "abandoned", "closed"],
        "{e:#?}"
    );
    let last = e.last().unwrap();
    assert!(
        last.starts_with("line stopped on request")
            && last.contains(&format!("yolo9 train --resume {}", s.run_dir.display())),
        "{e:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn cli_args(dir: &Path, name: &str, epochs: usize) -> Vec<String> {
    let epochs = epochs.to_string();
    let mut v: Vec<String> = vec![
        "train".into(),
        "--data".into(),
        dir.join("data.yaml").display().to_string(),
    ];
    for (k, val) in [
        ("--epochs", epochs.as_str()),
        ("--img", "64"),
        ("--batch", "1"),
        ("--workers", "1"),
        ("--close-mosaic", "0"),
        ("--save-interval", "0"),
        ("--name", name),
        // The model of common::tiny_run_options.
        ("--cfg", "yolov9-t"),
    ] {
        v.push(k.into());
        v.push(val.into());
    }
    v.push("--project".into());
    v.push(dir.join("runs").display().to_string());
    v.push("--hyp".into());
    v.push(dir.join("hyp.yaml").display().to_string());
    v.push("--noval".into());
    v
}

fn wait_for(path: &Path, child: &mut std::process::Child) {
    let t0 = std::time::Instant::now();
    while !path.is_file() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "training exited before writing {}",
            path.display()
        );
        assert!(t0.elapsed().as_secs() < 300, "no checkpoint after 300 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn sigkill_at_a_random_moment_then_resume_gives_the_same_weights_and_sigterm_saves() {
    let dir = tmpdir("kill");
    let mut reference = options(&dir, "ref");
    reference.save_interval = 0.0;
    reference.epochs = 6;
    let full = train(&reference).unwrap();
    let exe = env!("CARGO_BIN_EXE_yolo9");

    // SIGKILL at random moments, five times in a row (each resumed run killed again), with a
    // checkpoint written after every batch so kills also land inside checkpoint writes.
    let run = dir.join("runs/killed");
    let state = run.join("weights/state.safetensors");
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    let mut kills = 0;
    let mut torn_writes = 0;
    for round in 0..5 {
        let args: Vec<String> = if round == 0 {
            cli_args(&dir, "killed", 6)
        } else {
            vec!["train".into(), "--resume".into(), run.display().to_string()]
        };
        let mut child = std::process::Command::new(exe)
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        if round == 0 {
            wait_for(&state, &mut child);
        }
        let tmp_exists = || {
            std::fs::read_dir(run.join("weights")).is_ok_and(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            })
        };
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Short enough that the resumed runs (a few seconds of training in all) are still going.
        let delay = 200 + (seed >> 33) % 1300;
        if round % 2 == 1 {
            // Odd rounds: kill the moment a checkpoint is being written.
            let t0 = std::time::Instant::now();
            while !tmp_exists()
                && t0.elapsed().as_secs() < 60
                && child.try_wait().unwrap().is_none()
            {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        } else {
            std::thread::sleep(std::time::Duration::from_millis(delay));
        }
        if child.try_wait().unwrap().is_some() {
            break; // finished (or refused: finished run) before the kill
        }
        let _ = child.kill();
        let _ = child.wait();
        kills += 1;
        // A temporary file left behind means the kill hit a checkpoint write (the next resume
        // removes it).
        torn_writes += tmp_exists() as usize;
        eprintln!(
            "round {round}: killed ({})",
            if round % 2 == 1 {
                "during a checkpoint write".to_string()
            } else {
                format!("after {delay} ms")
            }
        );
    }
    eprintln!("{kills} SIGKILLs, {torn_writes} inside a checkpoint write");
    assert!(kills >= 5, "only {kills} kills landed");
    assert!(torn_writes >= 1, "no kill landed inside a checkpoint write");
    // Whatever instants it died at, the state file is complete and the run resumes to the end.
    let out = std::process::Command::new(exe)
        .args(["train", "--resume", &run.display().to_string()])
        .output()
        .unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        assert!(log.contains("already finished"), "{log}");
    }
    let d = max_diff(&full.last, &run.join("weights/last.safetensors"));
    assert!(d <= 1e-6, "killed+resumed run differs by {d}\n{log}");

    // SIGTERM: the current batch finishes, the state is saved, the resume command printed, exit 0.
    let mut child = std::process::Command::new(exe)
        .args(cli_args(&dir, "term", 3))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let run = dir.join("runs/term");
    wait_for(&run.join("weights/state.safetensors"), &mut child);
    let st = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exit {:?}\n{stdout}", out.status);
    if !stdout.contains("epochs done") {
        assert!(
            stdout.contains(&format!("yolo9 train --resume {}", run.display())),
            "{stdout}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn budget_sizing_measures_cpu_steps_and_refuses_a_budget_below_one_image() {
    let probe = MemoryProbe::new(&Device::Cpu).unwrap();
    let req = |budget: u64| BudgetRequest {
        nc: 3,
        img: 64,
        targets_per_image: 40,
        max_batch: 4,
        budget,
        seed: 0,
        amp: false,
        arch: yolo9::model::weights::default_arch(yolo9::Graph::Train),
        graphs: false,
        fixed_batch: true,
    };
    let d = plan(&req(64 << 30), &Device::Cpu, &probe).unwrap();
    assert_eq!(d.micro, 4);
    assert!(
        d.points.len() >= 3 && d.points.iter().all(|p| p.peak > 0),
        "{d:?}"
    );
    assert!(d.describe().contains("micro-batch 4"), "{}", d.describe());
    let e = format!(
        "{:#}",
        plan(&req(1 << 20), &Device::Cpu, &probe).unwrap_err()
    );
    assert!(
        e.contains("too small") && e.contains("--img 64") && e.contains("raise --budget"),
        "{e}"
    );
    // Through the trainer: the decision is kept in the summary and the state.
    let dir = tmpdir("budget");
    let mut o = options(&dir, "budget");
    o.epochs = 1;
    o.batch = 0; // auto
    o.budget = Some(64 << 30);
    let r = train(&o).unwrap();
    let b = r.budget.expect("no budget decision");
    assert_eq!(
        b.micro, 2,
        "auto batch is capped by the 2 train images: {b:?}"
    );
    assert!(r.epochs[0].peak_mem > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_torn_or_foreign_state_file_is_a_clear_error() {
    let dir = tmpdir("torn");
    std::fs::create_dir_all(dir.join("run/weights")).unwrap();
    let p = dir.join("run/weights/state.safetensors");
    std::fs::write(&p, b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":").unwrap();
    let mut r = TrainOptions::new(PathBuf::new());
    r.resume = Some(dir.join("run"));
    r.verbose = false;
    let e = format!("{:#}", train(&r).unwrap_err());
    assert!(
        e.contains("state.safetensors") && e.contains("--resume"),
        "{e}"
    );
    let w = common::reference("yolov9-s.pt");
    r.resume = Some(w.clone());
    let e = format!("{:#}", train(&r).unwrap_err());
    assert!(e.contains("yolov9-s.pt"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn inference_budget_sizes_the_val_batch_and_detect_refuses_a_tiny_budget() {
    use yolo9::internals::budget::plan_inference;
    use yolo9::internals::model::yolov9::YoloV9;
    let wpath = Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors");
    let w = yolo9::Weights::load(&wpath).unwrap();
    let m = YoloV9::load(&w, &Device::Cpu).unwrap();
    let probe = MemoryProbe::new(&Device::Cpu).unwrap();
    let d = plan_inference(&m, 64, 8, 64 << 30, &probe).unwrap();
    assert_eq!(d.micro, 8, "{d:?}");
    assert!(d.points.iter().any(|p| p.batch == 8 && p.peak > 0), "{d:?}");
    let e = format!(
        "{:#}",
        plan_inference(&m, 64, 8, 1 << 20, &probe).unwrap_err()
    );
    assert!(
        e.contains("too small") && e.contains("one image at --img 64"),
        "{e}"
    );
    // The CLI: detect with a budget below one image stops before the first image, exit != 0.
    let img = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/images");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_yolo9"))
        .args([
            "detect",
            &img.display().to_string(),
            "--img",
            "64",
            "--budget",
            "1MiB",
        ])
        .args(["--project", &tmpdir("detect-budget").display().to_string()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--budget 1MiB is too small"),
        "{stderr}"
    );
}

/// A validation split without any image gives no metrics, so there is nothing to rank epochs by:
/// `best.safetensors` is the last epoch's weights (before: the first epoch's, "best" on nothing).
#[test]
fn an_empty_validation_split_makes_the_last_weights_the_best() {
    let d = tmpdir("empty-val");
    let yaml = common::tiny_dataset(&d, 2);
    for e in std::fs::read_dir(d.join("images/val")).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let mut o = options(&d, "run");
    o.data = yaml;
    o.epochs = 2;
    o.noval = false;
    let s = train(&o).unwrap();
    assert_eq!(s.epochs.len(), 2);
    assert!(s.epochs.iter().all(|e| !e.validated));
    assert_eq!(
        max_diff(&s.best, &s.last),
        0.0,
        "best must be the last epoch's weights"
    );
}

/// `--resume RUN --data NEW` after the dataset moved: the run continues on the new path (before,
/// `--data` was ignored and the error that asked for it repeated itself).
#[test]
fn resume_after_the_dataset_moved_uses_the_given_data() {
    let dir = tmpdir("moved");
    let ds = dir.join("ds");
    std::fs::create_dir_all(&ds).unwrap();
    common::tiny_dataset(&ds, 2);
    let mut o = options(&ds, "run");
    o.project = dir.join("runs");
    o.epochs = 2;
    o.faults = Faults {
        stop_at: Some(1),
        ..Faults::default()
    };
    let s = train(&o).unwrap();
    assert!(s.interrupted);
    // Move the dataset (the hyp file stays where the run recorded it).
    let moved = dir.join("moved");
    std::fs::rename(&ds, &moved).unwrap();
    std::fs::create_dir_all(&ds).unwrap();
    std::fs::copy(moved.join("hyp.yaml"), ds.join("hyp.yaml")).unwrap();
    let mut r = TrainOptions::new(PathBuf::new());
    r.resume = Some(s.run_dir.clone());
    r.verbose = false;
    let e = format!("{:#}", train(&r).unwrap_err());
    assert!(e.contains("--data"), "{e}");
    r.data = moved.join("data.yaml");
    let done = train(&r).unwrap();
    assert!(!done.interrupted);
    assert_eq!(done.epochs.last().map(|e| e.epoch), Some(1));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 18 item 4: a stop request is honoured in every phase, not only between batches. During
/// the scan or the sizing the run ends before its folder exists (nothing trained, nothing to
/// save); during validation it ends after saving the epoch's end position, and `--resume`
/// validates that epoch and finishes the run.
#[test]
fn a_stop_is_honoured_in_the_scan_the_sizing_and_validation() {
    use yolo9::internals::train::guard::Phase;
    let dir = tmpdir("stop_phases");
    for (phase, budget) in [(Phase::Scan, false), (Phase::Sizing, true)] {
        let mut o = options(&dir, &format!("{phase:?}"));
        if budget {
            o.batch = 0; // auto: sized under the budget
            o.budget = Some(64 << 30);
        }
        o.faults = Faults {
            stop_in: Some(phase),
            ..Faults::default()
        };
        let t0 = std::time::Instant::now();
        let s = train(&o).unwrap();
        assert!(s.interrupted, "{phase:?}");
        assert!(s.epochs.is_empty() && s.budget.is_none(), "{phase:?}");
        assert_eq!(s.run_dir, PathBuf::new(), "{phase:?}: no run folder");
        assert!(!dir.join("runs").join(format!("{phase:?}")).exists());
        println!("stopped in {phase:?} after {:?}", t0.elapsed());
    }
    // Validation: epoch 0's batches run, its validation is cut short.
    let mut o = options(&dir, "val");
    o.noval = false;
    o.epochs = 2;
    o.faults = Faults {
        stop_in: Some(Phase::Val),
        ..Faults::default()
    };
    let s = train(&o).unwrap();
    assert!(s.interrupted);
    assert!(s.epochs.is_empty(), "the stopped epoch has no report");
    let st = load_state(&s.run_dir.join("weights/state.safetensors")).unwrap();
    assert_eq!(st.meta.epoch, 0);
    let csv = std::fs::read_to_string(s.run_dir.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1, "no epoch line yet: {csv}");
    let mut r = TrainOptions::new(PathBuf::new());
    r.resume = Some(s.run_dir.clone());
    r.verbose = false;
    let done = train(&r).unwrap();
    assert!(!done.interrupted);
    assert_eq!(
        done.epochs.iter().map(|e| e.epoch).collect::<Vec<_>>(),
        vec![0, 1]
    );
    let csv = std::fs::read_to_string(done.run_dir.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "{csv}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stop_phases_parse_from_the_fault_variable() {
    use yolo9::internals::train::guard::Phase;
    for (s, p) in [
        ("stop@scan", Phase::Scan),
        ("stop@sizing", Phase::Sizing),
        ("stop@val", Phase::Val),
    ] {
        assert_eq!(Faults::parse(s).unwrap().stop_in, Some(p));
    }
    assert_eq!(Faults::parse("stop@4").unwrap().stop_at, Some(4));
    let e = format!("{:#}", Faults::parse("stop@later").unwrap_err());
    assert!(e.contains("stop@later"), "{e}");
}

/// `--exist-ok` with the run folder set to the dataset folder, which holds the run's own
/// `hyp.yaml` and `data.yaml`: the run would write its `hyp.yaml` over the input. Refused before
/// any work (no `weights/` folder, no results.csv), naming the option and the input; every
/// input byte is kept.
#[test]
fn exist_ok_into_a_folder_holding_an_input_is_refused() {
    let dir = tmpdir("exist-ok-input");
    let ds = dir.join("ds");
    std::fs::create_dir_all(&ds).unwrap();
    common::tiny_dataset(&ds, 2);
    let hyp = std::fs::read(ds.join("hyp.yaml")).unwrap();
    let mut o = options(&ds, "unused");
    o.project = dir.clone();
    o.name = "ds".into();
    o.exist_ok = true;
    o.epochs = 1;
    let e = format!("{:#}", train(&o).unwrap_err());
    assert!(e.contains("--exist-ok") && e.contains("ds"), "{e}");
    assert!(
        e.contains("hyp.yaml") || e.contains("data.yaml") || e.contains("BloodImage"),
        "{e}"
    );
    assert_eq!(std::fs::read(ds.join("hyp.yaml")).unwrap(), hyp);
    assert!(!ds.join("weights").exists() && !ds.join("results.csv").exists());
    // --exist-ok into a folder without inputs trains as before.
    std::fs::create_dir_all(dir.join("runs/reuse")).unwrap();
    o.project = dir.join("runs");
    o.name = "reuse".into();
    let s = train(&o).unwrap();
    assert_eq!(s.run_dir, dir.join("runs/reuse"));
    // Issue 51, "two writers in one run folder": while another process owns the folder (this
    // test's process, through the run's lock file), a second --exist-ok run into it and a
    // --resume of it are both refused naming the owner, and the folder's files are untouched.
    let run = dir.join("runs/reuse");
    let csv = std::fs::read(run.join("results.csv")).unwrap();
    let last = std::fs::read(run.join("weights/last.safetensors")).unwrap();
    let owner = yolo9::internals::runs::lock_run_dir(&run).unwrap();
    let pid = std::process::id().to_string();
    let again = format!("{:#}", train(&o).unwrap_err());
    assert!(
        again.contains("in use by another yolo9 process") && again.contains(&pid),
        "{again}"
    );
    let mut r = o.clone();
    r.exist_ok = false;
    r.resume = Some(run.clone());
    r.extend_epochs = Some(2);
    let resumed = format!("{:#}", train(&r).unwrap_err());
    assert!(
        resumed.contains("in use by another yolo9 process") && resumed.contains(&pid),
        "{resumed}"
    );
    assert_eq!(std::fs::read(run.join("results.csv")).unwrap(), csv);
    assert_eq!(
        std::fs::read(run.join("weights/last.safetensors")).unwrap(),
        last
    );
    // Freed: the folder is usable again.
    drop(owner);
    let _ = std::fs::remove_dir_all(&dir);
}
