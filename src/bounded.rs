//! Bounded reading of every file yolo9 reads whole: [`read_capped`] (regular files only, a size
//! cap per [`FileKind`]) and, for the YAML files it parses (`--data`, `--cfg`, `--hyp`),
//! [`read_yaml`]. The YAML parser's time grows with the square of the nesting depth (a 400 KB
//! file of nested brackets took 90 s), so every YAML text is checked here, by a cheap linear
//! scan, **before** it reaches `serde_yaml_ng`:
//!
//! - at most [`MAX_YAML_BYTES`] bytes (the file's size is checked before it is read, and the read
//!   itself stops there; a FIFO or device is refused without blocking);
//! - at most [`MAX_YAML_DEPTH`] levels of nesting, counting block indentation, compact `- - x`
//!   sequence entries and flow brackets `[`/`{` (outside quoted strings and comments).
//!
//! Real files nest a few levels (a model yaml: 4, a data.yaml: 2), so the limits only refuse
//! hostile or broken input, with an error naming the file, the line and the limit.

use anyhow::{bail, Context, Result};
use std::io::Read;
use std::path::Path;

/// The largest YAML file read (a data.yaml listing 100,000 class names is about 2 MB).
pub const MAX_YAML_BYTES: u64 = 8 << 20;

/// The deepest nesting accepted in a YAML file.
pub const MAX_YAML_DEPTH: usize = 64;

/// Reads the YAML file `path` as text (see the module docs) and checks it with [`check_yaml`].
/// `what` names the option (`--data`, `--hyp`) in errors.
///
/// Errors: not a regular file, larger than [`MAX_YAML_BYTES`], not UTF-8, nested too deeply.
pub fn read_yaml(path: &Path, what: &str) -> Result<String> {
    let shown = crate::text::path(&path);
    let f = open_regular(path).with_context(|| format!("{what} {shown}: cannot read"))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > MAX_YAML_BYTES {
        bail!(
            "{what} {shown}: {len} bytes; a YAML file of yolo9 may have at most {MAX_YAML_BYTES} \
             bytes (is it the right file?)"
        );
    }
    let mut bytes = Vec::with_capacity(len as usize);
    f.take(MAX_YAML_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("{what} {shown}: cannot read"))?;
    if bytes.len() as u64 > MAX_YAML_BYTES {
        bail!("{what} {shown}: more than {MAX_YAML_BYTES} bytes; not a YAML file of yolo9");
    }
    let text = String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{what} {shown}: not UTF-8 text ({e})"))?;
    check_yaml(&text).with_context(|| format!("{what} {shown}"))?;
    Ok(text)
}

/// The kinds of file yolo9 reads whole (besides YAML, read by [`read_yaml`], and weights, whose
/// readers check sizes against the file's own header), each with the most bytes it may have. A
/// file over its cap is refused before it is read, so a link to `/dev/zero`, a huge sparse file
/// or a FIFO under a known name costs nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// An encoded image (JPEG, PNG, …): at most the decoding-bomb guard's decoded bytes
    /// (`data::image::MAX_DECODE_BYTES`, 1 GiB), the size of the largest uncompressed BMP
    /// accepted.
    Image,
    /// A YOLO label file (`labels/*.txt`): 64 MiB (about a million boxes).
    LabelText,
    /// A list of image paths (`train: train.txt` of a data.yaml): 256 MiB (about two million
    /// paths).
    ImageList,
    /// The dataset scan's label cache (`labels/*.yolo9-cache.json`): 1 GiB.
    LabelCache,
    /// A COCO annotation JSON (`instances_train2017.json` is 448 MB): 2 GiB.
    CocoJson,
    /// A `results.csv` of a training run (one line per epoch): 64 MiB.
    ResultsCsv,
    /// A small record or manifest (`*.json` of the weights cache, `args.yaml`, the cuDNN
    /// algorithm cache): 16 MiB.
    Record,
    /// A training state or checkpoint copied or read whole (`state.safetensors`, `last.*`): 16 GiB
    /// (yolov9-e with its optimizer state is under 1 GiB).
    Checkpoint,
}

impl FileKind {
    /// The cap in bytes.
    pub const fn cap(self) -> u64 {
        match self {
            FileKind::Image => 1 << 30,
            FileKind::LabelText => 64 << 20,
            FileKind::ImageList => 256 << 20,
            FileKind::LabelCache => 1 << 30,
            FileKind::CocoJson => 2 << 30,
            FileKind::ResultsCsv => 64 << 20,
            FileKind::Record => 16 << 20,
            FileKind::Checkpoint => 16 << 30,
        }
    }

    /// What the file is, for messages.
    pub const fn what(self) -> &'static str {
        match self {
            FileKind::Image => "an image file",
            FileKind::LabelText => "a label file",
            FileKind::ImageList => "an image list",
            FileKind::LabelCache => "a label cache",
            FileKind::CocoJson => "a COCO annotation file",
            FileKind::ResultsCsv => "a results.csv",
            FileKind::Record => "a record file",
            FileKind::Checkpoint => "a checkpoint",
        }
    }
}

/// The bytes of the regular file `path`, at most `kind.cap()` of them: the one reader of every
/// file yolo9 reads whole. Opened by [`open_regular`] (a FIFO, device or folder is refused
/// without blocking); the size is checked on the open descriptor before anything is read, and
/// the read itself stops one byte past the cap (a file that grows while it is read).
///
/// Errors (`std::io::Error`, so callers add the file's name): the open's own error;
/// `InvalidInput` for a file that is not a regular file; `InvalidData` for a file over the cap,
/// naming its size, the cap and the kind.
pub fn read_capped(path: &Path, kind: FileKind) -> std::io::Result<Vec<u8>> {
    let f = open_regular(path)?;
    let len = f.metadata()?.len();
    let cap = kind.cap();
    let over = |n: u64| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{n} bytes; {} may have at most {cap} bytes (is it the right file?)",
                kind.what()
            ),
        )
    };
    if len > cap {
        return Err(over(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    f.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(over(bytes.len() as u64));
    }
    Ok(bytes)
}

/// [`read_capped`] as UTF-8 text. Errors: those of [`read_capped`], or `InvalidData` for text
/// that is not UTF-8.
pub fn read_text_capped(path: &Path, kind: FileKind) -> std::io::Result<String> {
    String::from_utf8(read_capped(path, kind)?).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text ({e})"),
        )
    })
}

/// Opens `path` for reading if it is a regular file (after following symlinks), without blocking
/// on a FIFO: on Unix the open is made with `O_NONBLOCK` and the kind is checked on the open
/// descriptor (`fstat`), so there is no window between a check and the open. Errors: the open's
/// own error, or `InvalidInput` naming the kind (`a FIFO (named pipe), not a regular file`). Used
/// for the YAML files, the weights, and the dataset's files (`crate::data::fsio`).
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    #[cfg(unix)]
    let f = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?
    };
    #[cfg(not(unix))]
    let f = std::fs::File::open(path)?;
    let ft = f.metadata()?.file_type();
    if !ft.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}, not a regular file", crate::outfile::kind_of(&ft)),
        ));
    }
    Ok(f)
}

/// Checks YAML `text` against [`MAX_YAML_BYTES`] and [`MAX_YAML_DEPTH`] in one pass over its
/// bytes. Errors: the limit and the line where it is passed.
pub fn check_yaml(text: &str) -> Result<()> {
    if text.len() as u64 > MAX_YAML_BYTES {
        bail!(
            "{} bytes of YAML; at most {MAX_YAML_BYTES} are read",
            text.len()
        );
    }
    // Indentations of the open block levels; flow bracket depth; quote state (a quoted scalar
    // may span lines inside a flow collection).
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    let mut quote: Option<u8> = None;
    for (n, line) in text.lines().enumerate() {
        let b = line.as_bytes();
        let mut i = 0;
        let mut block = indents.len();
        if flow == 0 && quote.is_none() {
            let ind = b.iter().take_while(|&&c| c == b' ').count();
            let rest = &b[ind..];
            if !rest.is_empty() && rest[0] != b'#' && !line.trim().is_empty() {
                while indents.last().is_some_and(|&x| x >= ind) {
                    indents.pop();
                }
                indents.push(ind);
                // Compact sequences: each `- ` on the line opens a level (`- - x`: two).
                let mut dashes = 0;
                let mut j = ind;
                while j + 1 < b.len() && b[j] == b'-' && (b[j + 1] == b' ' || b[j + 1] == b'\t') {
                    j += 2;
                    while j < b.len() && (b[j] == b' ' || b[j] == b'\t') {
                        j += 1;
                    }
                    dashes += 1;
                }
                block = indents.len() + dashes;
                i = ind;
            }
        }
        let too_deep = |depth: usize| -> Result<()> {
            if depth > MAX_YAML_DEPTH {
                bail!(
                    "line {}: nested more than {MAX_YAML_DEPTH} levels deep; yolo9's YAML files \
                     nest a few levels (a hostile or damaged file?)",
                    n + 1
                );
            }
            Ok(())
        };
        too_deep(block)?;
        // The last byte that is not a space, to tell a flow opener from a bracket inside a plain
        // scalar (`name: a[1`).
        let mut prev: Option<u8> = None;
        while i < b.len() {
            let c = b[i];
            match quote {
                Some(q) => {
                    if q == b'"' && c == b'\\' {
                        i += 1;
                    } else if c == q {
                        quote = None;
                    }
                }
                None => match c {
                    b'#' if prev.is_none() || i == 0 || b[i - 1] == b' ' || b[i - 1] == b'\t' => {
                        break
                    }
                    b'\'' | b'"' if opens(prev) => quote = Some(c),
                    b'[' | b'{' if opens(prev) => {
                        flow += 1;
                        too_deep(block + flow)?;
                    }
                    b']' | b'}' if flow > 0 => flow -= 1,
                    _ => {}
                },
            }
            if c != b' ' && c != b'\t' {
                prev = Some(c);
            }
            i += 1;
        }
    }
    Ok(())
}

/// Whether a bracket or quote after the byte `prev` (the last non-space one) starts a flow
/// collection or a quoted scalar rather than sitting inside a plain scalar.
fn opens(prev: Option<u8>) -> bool {
    matches!(
        prev,
        None | Some(b':' | b'-' | b'?' | b',' | b'[' | b'{' | b'!' | b'&' | b'|' | b'>')
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn capped_reads_refuse_devices_fifos_and_oversized_files_without_reading_them() {
        let d = std::env::temp_dir().join(format!("yolo9-bounded-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        // A link to /dev/zero: refused as a device, at once.
        let zero = d.join("labels.yolo9-cache.json");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let e = read_capped(&zero, FileKind::LabelCache).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("a device"), "{e}");
        // A FIFO: refused without blocking.
        let fifo = d.join("results.csv");
        let st = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(st.success());
        let e = read_capped(&fifo, FileKind::ResultsCsv).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        // A sparse file one byte over the cap: refused by its size, nothing read.
        let big = d.join("args.yaml");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(FileKind::Record.cap() + 1).unwrap();
        let e = read_capped(&big, FileKind::Record).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(
            e.to_string()
                .contains(&format!("{} bytes", FileKind::Record.cap() + 1)),
            "{e}"
        );
        // At the cap: read.
        f.set_len(FileKind::Record.cap()).unwrap();
        assert_eq!(
            read_capped(&big, FileKind::Record).unwrap().len() as u64,
            FileKind::Record.cap()
        );
        let small = d.join("r.json");
        std::fs::write(&small, "{\"a\":1}").unwrap();
        assert_eq!(
            read_text_capped(&small, FileKind::Record).unwrap(),
            "{\"a\":1}"
        );
        std::fs::write(&small, [0xffu8, 0xfe]).unwrap();
        assert!(read_text_capped(&small, FileKind::Record).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn ordinary_yaml_passes_and_deep_nesting_is_refused_by_line() {
        let ok = "path: .\ntrain: images/train  # a comment [\nnames: [RBC, 'W[BC', \"P{l\"]\n\
                  backbone:\n  [[-1, 1, Conv, [64, 3, 2]],\n   [-1, 1, Conv, [128, 3, 2]]]\n\
                  list:\n  - - a\n    - b\nname: a[1\n";
        check_yaml(ok).unwrap();
        let deep = format!("a: {}{}\n", "[".repeat(65), "]".repeat(65));
        let e = format!("{:#}", check_yaml(&deep).unwrap_err());
        assert!(e.contains("line 1") && e.contains("64 levels"), "{e}");
        check_yaml(&format!("a: {}{}\n", "[".repeat(60), "]".repeat(60))).unwrap();
        let block: String = (0..70)
            .map(|k| format!("{}k{k}:\n", " ".repeat(k)))
            .collect();
        let e = format!("{:#}", check_yaml(&block).unwrap_err());
        assert!(e.contains("line 65"), "{e}");
        let dashes = format!("{}x\n", "- ".repeat(80));
        assert!(check_yaml(&dashes).is_err());
    }
}
