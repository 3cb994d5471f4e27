//! The crate's layering: no import cycle between its top-level modules (`src/<m>.rs` or
//! `src/<m>/`), read from the `crate::` paths of the source (comments ignored). A cycle means two
//! modules cannot be understood, tested or moved one without the other; the issue that asked for
//! this named `model ⇄ cuda`, `loss ⇄ cuda` and `model ⇄ convert`, now broken by `op_args` (the
//! custom ops' shared arguments) and `pt` (the `.pt` reader, which knows nothing of the model).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeMap<String, String>>;

/// Top-level module names referenced as `crate::<name>` or `crate::{<name>, ...}` in one line
/// of code.
fn referenced(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Only the first path segment of each item at the top level of the group.
            let mut depth = 0;
            let mut item = String::new();
            let take = |item: &mut String, out: &mut Vec<String>| {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
                item.clear();
            };
            for ch in group.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        take(&mut item, &mut out);
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(ch);
                }
            }
            take(&mut item, &mut out);
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// module → (module it uses → first `file:line` that does).
fn module_graph(src: &Path) -> Graph {
    let mut g = Graph::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(src).unwrap();
            let first = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let module = first.trim_end_matches(".rs").to_string();
            let text = std::fs::read_to_string(&p).unwrap();
            for (i, line) in text.lines().enumerate() {
                let t = line.trim_start();
                if t.starts_with("//") {
                    continue;
                }
                let code = t.split("//").next().unwrap_or("");
                for m in referenced(code) {
                    if m != module && m != "self" && m != "super" {
                        g.entry(module.clone())
                            .or_default()
                            .entry(m)
                            .or_insert_with(|| format!("{}:{}", rel.display(), i + 1));
                    }
                }
            }
        }
    }
    g
}

/// Every edge a → b that lies on a cycle (b reaches a), with the line that makes it.
fn cycle_edges(g: &Graph) -> Vec<(String, String, String)> {
    let reaches = |from: &str, to: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(x) = stack.pop() {
            if x == to {
                return true;
            }
            if seen.insert(x.clone()) {
                if let Some(next) = g.get(&x) {
                    stack.extend(next.keys().cloned());
                }
            }
        }
        false
    };
    let mut out = Vec::new();
    for (a, next) in g {
        for (b, at) in next {
            if reaches(b, a) {
                out.push((a.clone(), b.clone(), at.clone()));
            }
        }
    }
    out
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = module_graph(&src);
    assert!(
        g.contains_key("cli") && g["cli"].contains_key("train"),
        "{g:?}"
    );
    let cycles = cycle_edges(&g);
    assert!(
        cycles.is_empty(),
        "import cycles between modules (edge, first use): {cycles:#?}"
    );
    // The low-level modules stay low: CUDA launches and the .pt reader use no model code.
    for low in ["cuda", "pt", "op_args"] {
        for high in ["model", "loss", "train", "detect", "cli", "convert"] {
            assert!(
                !g.get(low).is_some_and(|n| n.contains_key(high)),
                "{low} uses {high} at {}",
                g[low][high]
            );
        }
    }
}

#[test]
fn the_checker_finds_a_cycle_and_reads_grouped_imports() {
    assert_eq!(
        referenced("use crate::{model::{a, b}, loss, cuda::x as y};"),
        ["model", "loss", "cuda"]
    );
    assert_eq!(referenced("let d = crate::device::select(s)?;"), ["device"]);
    let mut g = Graph::new();
    g.entry("a".into())
        .or_default()
        .insert("b".into(), "a.rs:1".into());
    g.entry("b".into())
        .or_default()
        .insert("c".into(), "b.rs:1".into());
    g.entry("c".into())
        .or_default()
        .insert("a".into(), "c.rs:1".into());
    g.entry("c".into())
        .or_default()
        .insert("d".into(), "c.rs:2".into());
    let e = cycle_edges(&g);
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(!e.iter().any(|(_, b, _)| b == "d"));
}
