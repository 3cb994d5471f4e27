//! Bounded work from small or hostile input (issue 36, "unbounded work"): every YAML the tools
//! read (`--data`, `--cfg`, `--hyp`) is checked for size and nesting depth before it is parsed
//! (before: a 400 KB file of nested brackets took 90 s), and a weights file's header and the sizes
//! it declares are checked against the file's size before any bulk read (before: a 3 GB file of
//! garbage was read whole into memory).
use crate::common;

use common::tmpdir;
use std::path::Path;
use std::time::{Duration, Instant};
use yolo9::internals::data::yaml::DataConfig;
use yolo9::model::arch::Arch;
use yolo9::train::Hyp;
use yolo9::Weights;

fn fast(t0: Instant, what: &str) {
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "{what}: {:?}",
        t0.elapsed()
    );
}

/// Peak resident memory of this test process (VmHWM), in bytes.
fn peak_rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = s
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

#[test]
fn deeply_nested_yaml_fails_fast_for_data_cfg_and_hyp() {
    let d = tmpdir("deep-yaml");
    // 400 KB of flow brackets, and 100 levels of block indentation.
    let flow = format!(
        "train: images\nval: [{}{}]\n",
        "[".repeat(200_000),
        "]".repeat(200_000)
    );
    let block: String = (0..100)
        .map(|k| format!("{}k{k}:\n", " ".repeat(k)))
        .collect();
    for (name, text, line) in [("flow", &flow, "line 2"), ("block", &block, "line 65")] {
        let p = d.join(format!("{name}.yaml"));
        std::fs::write(&p, text).unwrap();
        let shown = p.display().to_string();

        let t0 = Instant::now();
        let e = format!("{:#}", DataConfig::load(&p).unwrap_err());
        fast(t0, "--data");
        assert!(
            e.contains("--data") && e.contains(&shown) && e.contains(line),
            "{e}"
        );
        assert!(e.contains("nested more than 64 levels"), "{e}");

        let t0 = Instant::now();
        let e = format!("{:#}", Hyp::load(&p).unwrap_err());
        fast(t0, "--hyp");
        assert!(
            e.contains("--hyp") && e.contains(&shown) && e.contains("64 levels"),
            "{e}"
        );

        let t0 = Instant::now();
        let e = format!(
            "{:#}",
            Arch::from_name_or_path(p.to_str().unwrap()).unwrap_err()
        );
        fast(t0, "--cfg");
        assert!(e.contains(&shown) && e.contains("64 levels"), "{e}");
    }
    // An ordinary nesting still loads (a model yaml nests 4 levels).
    let ok = d.join("ok.yaml");
    std::fs::create_dir_all(d.join("images")).unwrap();
    std::fs::write(
        &ok,
        "train: images\nval: images\nnames: [a, 'b[', \"c{\"]\n",
    )
    .unwrap();
    assert_eq!(DataConfig::load(&ok).unwrap().names, ["a", "b[", "c{"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// A YAML file over the size limit is refused from its size (a sparse file: nothing is read),
/// and a FIFO given as `--data` is refused without blocking.
#[test]
fn oversized_and_fifo_yaml_are_refused_without_reading() {
    let d = tmpdir("big-yaml");
    let big = d.join("big.yaml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(yolo9::internals::bounded::MAX_YAML_BYTES + 1)
        .unwrap();
    let t0 = Instant::now();
    let e = format!("{:#}", DataConfig::load(&big).unwrap_err());
    fast(t0, "big");
    assert!(e.contains("big.yaml") && e.contains("at most"), "{e}");

    let fifo = d.join("fifo.yaml");
    let st = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(st.success());
    let t0 = Instant::now();
    let e = format!("{:#}", Hyp::load(&fifo).unwrap_err());
    fast(t0, "fifo");
    assert!(
        e.contains("fifo.yaml") && e.contains("not a regular file"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// 3 GB weights files (sparse: no disk used) are refused from their first bytes: garbage, a JSON
/// header that does not parse, a header whose tensors are 8 bytes in a 3 GB file; none is read
/// into memory (this process's peak RSS stays far below the file's size).
#[test]
fn huge_weights_files_are_refused_from_their_header() {
    const SIZE: u64 = 3 << 30;
    let d = tmpdir("huge-weights");
    let sparse = |name: &str, head: &[u8]| {
        let p = d.join(name);
        let mut f = std::fs::File::create(&p).unwrap();
        std::io::Write::write_all(&mut f, head).unwrap();
        f.set_len(SIZE).unwrap();
        p
    };
    let json = br#"{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let framed = |j: &[u8]| {
        let mut v = (j.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(j);
        v
    };
    let cases = [
        (sparse("zeros.safetensors", b""), "garbage header"),
        (
            sparse("bad-json.safetensors", &framed(b"{\"t\": [1, 2")),
            "does not parse",
        ),
        (
            sparse("trailing.safetensors", &framed(json)),
            "trailing bytes",
        ),
    ];
    for (p, want) in &cases {
        let t0 = Instant::now();
        let Err(e) = Weights::load(p) else {
            panic!("{}: loaded garbage", p.display())
        };
        let e = e.to_string();
        fast(t0, want);
        assert!(
            e.contains(want) && e.contains(&p.display().to_string()),
            "{e}"
        );
    }
    // A header declaring more data than the file holds: truncated, named, before reading it.
    let mut short = framed(br#"{"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#);
    short.extend_from_slice(&[0; 8]);
    let p = d.join("short.safetensors");
    std::fs::write(&p, &short).unwrap();
    let Err(e) = Weights::load(&p) else {
        panic!("short.safetensors loaded")
    };
    let e = e.to_string();
    assert!(e.contains("truncated") && e.contains("16 bytes"), "{e}");
    assert!(peak_rss() < 1 << 30, "peak RSS {} MB", peak_rss() >> 20);
    let _ = std::fs::remove_dir_all(&d);
    // Shipped weights still load.
    let w = Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors");
    assert_eq!(Weights::load(&w).unwrap().meta.nc, 3);
}
