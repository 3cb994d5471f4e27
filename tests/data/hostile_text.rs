//! Text that used to be read wrong or shown raw (issue "bounded under hostile input", item 7):
//! label files with classic-Mac line ends, and class names with terminal control sequences in a
//! `data.yaml` or in the weights' metadata.

use crate::common;

use common::tmpdir;

use std::path::Path;
use yolo9::internals::data::labels::parse_labels;
use yolo9::internals::data::yaml::DataConfig;
use yolo9::model::weights::{sanitize_names, Weights};

#[test]
fn cr_only_crlf_and_lf_label_files_give_the_same_boxes() {
    let rows: Vec<String> = (0..19)
        .map(|i| format!("{} 0.{:02} 0.5 0.1 0.1", i % 3, 10 + i * 4))
        .collect();
    let p = Path::new("labels/x.txt");
    let lf = parse_labels(&(rows.join("\n") + "\n"), 3, p);
    assert_eq!(lf.boxes.len(), 19);
    for sep in ["\r", "\r\n"] {
        let got = parse_labels(&(rows.join(sep) + sep), 3, p);
        assert_eq!(got.boxes, lf.boxes, "line end {sep:?}");
        assert_eq!(
            got.polygons, 0,
            "line end {sep:?}: no line read as a polygon"
        );
        assert!(got.issues.is_empty(), "{:?}", got.issues);
    }
    // Issues keep their line numbers with CR-only ends.
    let bad = parse_labels("0 0.5 0.5 0.1 0.1\r7 0.5 0.5 0.1 0.1\r", 3, p);
    assert_eq!(bad.boxes.len(), 1);
    assert_eq!(bad.issues[0].line, Some(2), "{:?}", bad.issues);
}

#[test]
fn control_characters_in_class_names_are_escaped() {
    let mut names = vec!["cell".to_string(), "\u{1b}[2Jwipe".into(), "a\rb".into()];
    assert_eq!(sanitize_names(&mut names), [1, 2]);
    assert_eq!(names, ["cell", "\\u{1b}[2Jwipe", "a\\u{d}b"]);
    assert!(names.iter().all(|n| !n.chars().any(char::is_control)));

    let d = tmpdir("yaml");
    std::fs::create_dir_all(d.join("images")).unwrap();
    std::fs::write(
        d.join("data.yaml"),
        "train: images\nval: images\nnames: [\"ok\", \"\\e]0;pwned\\a\"]\n",
    )
    .unwrap();
    let cfg = DataConfig::load(&d.join("data.yaml")).unwrap();
    assert_eq!(cfg.names[0], "ok");
    assert!(
        !cfg.names[1].chars().any(char::is_control),
        "{:?}",
        cfg.names
    );
    assert!(cfg.names[1].contains("pwned"));

    // Weights whose metadata carries such a name load with it escaped, and say so.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors");
    let mut w = Weights::load(&src).unwrap();
    w.meta.names[0] = "\u{1b}[31mRBC".into();
    let f = tmpdir("weights").join("w.safetensors");
    w.save(&f, true).unwrap();
    let (back, notes, _, _) = Weights::load_detailed(&f).unwrap();
    assert_eq!(back.meta.names[0], "\\u{1b}[31mRBC");
    assert!(
        notes.iter().any(|n| n.contains("control characters")),
        "{notes:?}"
    );
}

/// Weights holding NaN or Inf are refused at load, naming the first tensor and the count, instead
/// of loading and detecting nothing.
#[test]
fn non_finite_weights_are_refused() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors");
    let mut w = Weights::load(&src).unwrap();
    let name = "model.2.cv1.conv.weight";
    let t = &w.tensors[name];
    let mut v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    v[0] = f32::NAN;
    v[5] = f32::INFINITY;
    w.tensors.insert(
        name.into(),
        candle_core::Tensor::from_vec(v, t.dims(), &candle_core::Device::Cpu).unwrap(),
    );
    let f = tmpdir("nan").join("nan.safetensors");
    w.save(&f, false).unwrap();
    let e = match Weights::load(&f) {
        Ok(_) => panic!("weights with NaN loaded"),
        Err(e) => format!("{e:#}"),
    };
    assert!(e.contains("2 NaN/Inf values") && e.contains(name), "{e}");
}

/// A label file of 200,000 repeats of one row is parsed in linear time and reported in one short
/// line (before: a 51 MB line listing every repeat, and a quadratic duplicate search).
#[test]
fn a_file_of_duplicates_gives_one_short_report() {
    let text = "0 0.5 0.5 0.1 0.1\n".repeat(200_000);
    let t0 = std::time::Instant::now();
    let got = parse_labels(&text, 1, Path::new("labels/dup.txt"));
    assert!(t0.elapsed().as_secs_f64() < 10.0, "{:?}", t0.elapsed());
    assert_eq!(got.boxes.len(), 1);
    assert_eq!(got.duplicates, 199_999);
    assert_eq!(got.issues.len(), 1);
    let v = &got.issues[0].value;
    assert!(v.len() < 200, "{} bytes: {v}", v.len());
    assert!(
        v.starts_with("199999 duplicate rows (lines 2, 3,") && v.contains("and 199989 more"),
        "{v}"
    );
}

/// Hostile pickle streams are refused early and by name (`yolo9::internals::pt::pickle::parse`): millions
/// of MARKs hit the stack bound (before: 18 GB of RSS), and globals referenced by opcodes other
/// than GLOBAL are named in the error with the file.
#[test]
fn hostile_pickles_are_refused_by_name() {
    use yolo9::internals::pt::pickle::{parse, MAX_STACK_ITEMS};
    let mut marks = vec![0x80, 0x02];
    marks.extend(std::iter::repeat_n(b'(', 3_000_000));
    marks.push(b'.');
    let t0 = std::time::Instant::now();
    let e = format!("{:#}", parse(&marks, "marks.pt: data.pkl").unwrap_err());
    assert!(
        e.contains("marks.pt") && e.contains(&MAX_STACK_ITEMS.to_string()),
        "{e}"
    );
    assert!(t0.elapsed().as_secs_f64() < 10.0);

    // Protocol 4 streams stop at their first protocol-4 opcode, by name.
    let p4 = [0x80, 0x04, 0x95, 0, 0, 0, 0, 0, 0, 0, 0, b'.'];
    let e = format!("{:#}", parse(&p4, "p4.pt: data.pkl").unwrap_err());
    assert!(
        e.contains("p4.pt") && e.contains("FRAME") && e.contains("protocol 4"),
        "{e}"
    );
    // STACK_GLOBAL after two protocol-2 strings names the global.
    let mut sg = vec![0x80, 0x02, b'X', 2, 0, 0, 0];
    sg.extend_from_slice(b"os");
    sg.extend_from_slice(&[b'X', 6, 0, 0, 0]);
    sg.extend_from_slice(b"system");
    sg.extend_from_slice(&[0x93, b'.']);
    let e = format!("{:#}", parse(&sg, "evil.pt: data.pkl").unwrap_err());
    assert!(
        e.contains("evil.pt") && e.contains("`os.system`") && e.contains("STACK_GLOBAL"),
        "{e}"
    );
    // INST names its global inline.
    let mut inst = vec![0x80, 0x02, b'('];
    inst.push(b'i');
    inst.extend_from_slice(b"posix\nsystem\n");
    inst.push(b'.');
    let e = format!("{:#}", parse(&inst, "inst.pt: data.pkl").unwrap_err());
    assert!(
        e.contains("inst.pt") && e.contains("INST") && e.contains("posix.system"),
        "{e}"
    );
}

/// A tensor record with a negative size is refused naming the tensor and the value.
#[test]
fn negative_tensor_sizes_name_the_tensor_and_the_value() {
    use candle_core::pickle::Object;
    let class = |m: &str, n: &str| Object::Class {
        module_name: m.into(),
        class_name: n.into(),
    };
    let rebuild = |size: Vec<i64>| Object::Reduce {
        callable: Box::new(class("torch._utils", "_rebuild_tensor_v2")),
        args: Box::new(Object::Tuple(vec![
            Object::PersistentLoad(Box::new(Object::Tuple(vec![
                Object::Unicode("storage".into()),
                class("torch", "FloatStorage"),
                Object::Unicode("0".into()),
                Object::Unicode("cpu".into()),
                Object::Int(4),
            ]))),
            Object::Int(0),
            Object::Tuple(size.iter().map(|&v| Object::Int(v as i32)).collect()),
            Object::Tuple(vec![Object::Int(2), Object::Int(1)]),
        ])),
    };
    let ok = yolo9::internals::pt::pickle::tensor_ref(&rebuild(vec![2, 2]), "model.0.conv.weight")
        .unwrap();
    assert_eq!(ok.unwrap().shape, [2, 2]);
    let e = format!(
        "{:#}",
        yolo9::internals::pt::pickle::tensor_ref(&rebuild(vec![-1, 2]), "model.0.conv.weight")
            .unwrap_err()
    );
    assert!(e.contains("model.0.conv.weight") && e.contains("-1"), "{e}");
}
