//! The forms users of the official code and of Ultralytics type first, read before `clap` parses
//! the command line: each either works (rewritten to the yolo9 form, with a one-line note on
//! stderr) or is refused with a one-line hint that shows the yolo9 form.
//!
//! | typed | done |
//! | --- | --- |
//! | `yolo9 predict …` | `yolo9 detect …` (note) |
//! | `--img 480 640` (the official `--imgsz H W`) in detect, track, val, serve | `--img 640`, the longer side (note) |
//! | `yolo9 val --task test` (official `val.py --task`) | `--split test` (note); `--task speed`/`study`: hint |
//! | `model=yolov9s.pt source=img.jpg imgsz=640` (Ultralytics `key=value`) | refused; hint with `--weights … img.jpg --img 640` |
//!
//! `--batch-size` (alias of train's `--batch`), `--classes 0,2` (comma list), a bare `--resume`
//! (the most recent run) and `yolov9s` (a hint naming `yolov9-s`) are handled where those
//! options are defined.

use std::ffi::OsString;

/// Ultralytics `key=value` keys and the yolo9 option each becomes (`""`: a positional source).
const KEYS: &[(&str, &str)] = &[
    ("model", "--weights"),
    ("weights", "--weights"),
    ("source", ""),
    ("imgsz", "--img"),
    ("img", "--img"),
    ("conf", "--conf"),
    ("iou", "--iou"),
    ("data", "--data"),
    ("epochs", "--epochs"),
    ("batch", "--batch"),
    ("device", "--device"),
    ("workers", "--workers"),
    ("project", "--project"),
    ("name", "--name"),
    ("classes", "--classes"),
    ("max_det", "--max-det"),
    ("half", "--half"),
    ("exist_ok", "--exist-ok"),
    ("save_txt", "--save-txt"),
    ("save_conf", "--save-conf"),
    ("save_crop", "--save-crop"),
    ("resume", "--resume"),
    ("split", "--split"),
    ("patience", "--patience"),
    ("seed", "--seed"),
    ("format", ""),
    ("mode", ""),
    ("task", ""),
];

/// Subcommands whose `--img` is one square size (export takes `--img H W` itself).
const SQUARE_IMG: &[&str] = &["detect", "track", "val", "serve"];

/// `args` (the program name first) rewritten to yolo9's forms, and the notes to print; `Err` is
/// the hint for a form that is refused.
pub fn prepare(args: Vec<OsString>) -> Result<(Vec<OsString>, Vec<String>), String> {
    let mut notes = Vec::new();
    let mut out: Vec<OsString> = Vec::with_capacity(args.len());
    let text: Vec<Option<&str>> = args.iter().map(|a| a.to_str()).collect();
    let sub = text.get(1).copied().flatten().unwrap_or("");
    let sub = if sub == "predict" {
        notes.push("note: `yolo9 predict` is `yolo9 detect`".to_string());
        "detect"
    } else {
        sub
    };
    key_values(sub, &text)?;
    let mut i = 0;
    while i < args.len() {
        let a = text[i];
        if i == 1 && a == Some("predict") {
            out.push("detect".into());
        } else if SQUARE_IMG.contains(&sub)
            && matches!(a, Some("--img" | "--imgsz" | "--img-size"))
            && number(text.get(i + 1)).is_some()
            && number(text.get(i + 2)).is_some()
        {
            let (h, w) = (
                number(text.get(i + 1)).unwrap_or(0),
                number(text.get(i + 2)).unwrap_or(0),
            );
            let side = h.max(w);
            notes.push(format!(
                "note: --img {h} {w}: `yolo9 {sub}` letterboxes to one size; using --img {side}, \
                 the longer side (a picture whose shape differs from {h}x{w} may get a larger \
                 input than the official code gives it)"
            ));
            out.push("--img".into());
            out.push(side.to_string().into());
            i += 3;
            continue;
        } else if sub == "val" && a == Some("--task") {
            match text.get(i + 1).copied().flatten() {
                Some(t @ ("train" | "val" | "test")) => {
                    notes.push(format!(
                        "note: --task {t} (official val.py) is `--split {t}` in yolo9"
                    ));
                    out.push("--split".into());
                    out.push(t.into());
                    i += 2;
                    continue;
                }
                Some(t) => {
                    return Err(format!(
                        "--task {}: yolo9 val validates one split (`--split train|val|test`); the \
                         official val.py's speed and study tasks are not commands of yolo9 (time \
                         a run with `yolo9 val --split test`)",
                        crate::text::escape(t)
                    ))
                }
                None => return Err("--task needs a value: use `--split train|val|test`".into()),
            }
        } else {
            out.push(args[i].clone());
        }
        i += 1;
    }
    Ok((out, notes))
}

/// A positive integer argument.
fn number(a: Option<&Option<&str>>) -> Option<u32> {
    a.copied().flatten()?.parse().ok().filter(|n| *n > 0)
}

/// Refuses Ultralytics' `key=value` arguments with the yolo9 form of the whole command.
fn key_values(sub: &str, text: &[Option<&str>]) -> Result<(), String> {
    let kv = |a: &str| -> Option<(&'static str, String)> {
        let (k, v) = a.split_once('=')?;
        KEYS.iter()
            .find(|(key, _)| *key == k)
            .map(|(_, opt)| (*opt, v.to_string()))
    };
    // Only where an option is not expecting the value (`--name a=b` is a name).
    let found = text.iter().enumerate().skip(1).any(|(i, a)| {
        a.is_some_and(|a| kv(a).is_some())
            && !text[i - 1].is_some_and(|p| p.starts_with("--") && !p.contains('='))
    });
    if !found {
        return Ok(());
    }
    let mut form = vec!["yolo9".to_string(), sub.to_string()];
    for (i, a) in text.iter().enumerate().skip(2) {
        let Some(a) = a else { continue };
        let prev_is_opt = text[i - 1].is_some_and(|p| p.starts_with("--") && !p.contains('='));
        match kv(a) {
            Some(("", v)) if !prev_is_opt => {
                if a.starts_with("source=") {
                    form.push(v)
                }
            }
            Some((opt, v)) if !prev_is_opt => {
                form.push(opt.to_string());
                if !matches!(v.as_str(), "True" | "true") {
                    form.push(v);
                }
            }
            _ => form.push(a.to_string()),
        }
    }
    Err(format!(
        "yolo9 takes options as `--key value`, not Ultralytics' `key=value`; try: {}",
        crate::text::escape(&form.join(" "))
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(s: &str) -> Result<(String, Vec<String>), String> {
        let args: Vec<OsString> = s.split(' ').map(OsString::from).collect();
        prepare(args).map(|(a, n)| {
            (
                a.iter()
                    .map(|x| x.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" "),
                n,
            )
        })
    }

    #[test]
    fn official_and_ultralytics_forms_work_or_get_a_hint() {
        // Unchanged.
        let (a, n) = run("yolo9 detect img.jpg --img 640 --name a=b").unwrap();
        assert_eq!(a, "yolo9 detect img.jpg --img 640 --name a=b");
        assert!(n.is_empty());
        // predict → detect; --img H W → the longer side.
        let (a, n) = run("yolo9 predict img.jpg --img 480 640").unwrap();
        assert_eq!(a, "yolo9 detect img.jpg --img 640");
        assert_eq!(n.len(), 2, "{n:?}");
        // export keeps its two values.
        let (a, _) = run("yolo9 export --img 480 640").unwrap();
        assert_eq!(a, "yolo9 export --img 480 640");
        // A webcam index after one --img value stays a source.
        let (a, _) = run("yolo9 detect --img 640 0").unwrap();
        assert_eq!(a, "yolo9 detect --img 640 0");
        // val --task.
        let (a, n) = run("yolo9 val --data d.yaml --task test").unwrap();
        assert_eq!(a, "yolo9 val --data d.yaml --split test");
        assert!(n[0].contains("--split test"));
        assert!(run("yolo9 val --task speed")
            .unwrap_err()
            .contains("--split"));
        // key=value: refused with the yolo9 form.
        let e =
            run("yolo9 predict model=yolov9s.pt source=img.jpg imgsz=640 conf=0.5").unwrap_err();
        assert!(
            e.ends_with("try: yolo9 detect --weights yolov9s.pt img.jpg --img 640 --conf 0.5"),
            "{e}"
        );
        let e = run("yolo9 train data=d.yaml epochs=3 batch-size").unwrap_err();
        assert!(e.contains("yolo9 train --data d.yaml --epochs 3"), "{e}");
    }
}
