//! The crate's layering, read from the source text of `src/` (comments and string literals
//! ignored; the binaries `main.rs` and `bin/` are not part of the library):
//!
//! - no import cycle between **files**: an arrow runs from a file to every file whose item it
//!   names, through `crate::`, `super::`, `self::` or a child module's name (a `use` with a group
//!   over several lines included), to the file that defines the longest module prefix of the
//!   path. A cycle means files that cannot be understood, tested or moved one without the other;
//!   the issue that asked for this check named the circles in `detect/`, `model/`, `loss/`,
//!   `metrics/`, `data/` and `cuda/`, broken by giving each shared item one home (`boxes.rs`,
//!   `detect/nms.rs`, `model/arch.rs`'s `STRIDES`, `model/rename.rs`, `loss/targets.rs`, ...).
//!   The unit tests of a file (`#[cfg(test)] mod ... { }`) may use anything and are not read;
//! - no arrow runs back up to `lib.rs`: the library names `crate::error::Error`, not the root
//!   re-export `crate::Error`, so the root only lists what a user sees;
//! - no import cycle between the top-level modules (`src/<m>.rs` or `src/<m>/`), and the
//!   low-level modules stay low (the earlier issue named `model ⇄ cuda`, `loss ⇄ cuda` and
//!   `model ⇄ convert`, broken by `op_args` and `pt`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// file → (file it uses → first `file:line` that does), files as paths relative to `src/`.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

/// File-level cycles that are known and allowed for now, with the reason. Each must still be a
/// cycle (the test fails when it is gone, so that the entry is removed).
const KNOWN_CYCLES: &[(&str, &str, &str)] = &[];

/// The module path of a library file (`model/mod.rs` and `model.rs` → `model`, `lib.rs` → the
/// root), or `None` for the binaries.
fn module_of(rel: &str) -> Option<Vec<String>> {
    if rel == "main.rs" || rel.starts_with("bin/") {
        return None;
    }
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if parts == ["lib"] {
        return Some(Vec::new());
    }
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    Some(parts)
}

/// Every `.rs` file under `src`, relative, with `/` separators.
fn rust_files(src: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src).unwrap();
                let parts: Vec<_> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push(parts.join("/"));
            }
        }
    }
    out.sort();
    out
}

/// The code of a source file with comments removed and string and character literals emptied
/// (line breaks kept, so that line numbers stay).
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let keep_lines = |out: &mut String, s: &[char]| {
        out.extend(s.iter().filter(|&&ch| ch == '\n'));
    };
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let rest = &c[i..];
        if rest.starts_with(&['/', '/']) {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if rest.starts_with(&['/', '*']) {
            let mut depth = 0;
            let start = i;
            while i < c.len() {
                if c[i..].starts_with(&['/', '*']) {
                    depth += 1;
                    i += 2;
                } else if c[i..].starts_with(&['*', '/']) {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            keep_lines(&mut out, &c[start..i]);
            continue;
        }
        let prev_ident = i > 0 && ident(c[i - 1]);
        // Raw strings: r"..", r#".."#, br"..".
        let raw_at = if rest.starts_with(&['b', 'r']) { 2 } else { 1 };
        if !prev_ident && (rest[0] == 'r' || rest.starts_with(&['b', 'r'])) {
            let mut j = i + raw_at;
            let mut hashes = 0;
            while j < c.len() && c[j] == '#' {
                hashes += 1;
                j += 1;
            }
            if j < c.len() && c[j] == '"' {
                let start = i;
                j += 1;
                loop {
                    if j >= c.len() {
                        break;
                    }
                    if c[j] == '"'
                        && c[j + 1..]
                            .iter()
                            .take(hashes)
                            .filter(|&&h| h == '#')
                            .count()
                            == hashes
                    {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                keep_lines(&mut out, &c[start..j.min(c.len())]);
                out.push_str("\"\"");
                i = j;
                continue;
            }
        }
        if c[i] == '"' {
            let start = i;
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            keep_lines(&mut out, &c[start..i.min(c.len())]);
            out.push_str("\"\"");
            continue;
        }
        if c[i] == '\'' {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            let end = if rest.get(1) == Some(&'\\') {
                rest.iter()
                    .skip(3)
                    .position(|&ch| ch == '\'')
                    .map(|p| p + 4)
            } else if rest.get(2) == Some(&'\'') {
                Some(3)
            } else {
                None
            };
            if let Some(n) = end {
                out.push_str("' '");
                i += n;
                continue;
            }
        }
        out.push(c[i]);
        i += 1;
    }
    out
}

fn is_ident(ch: char) -> bool {
    ch.is_ascii_alphanumeric() || ch == '_'
}

fn skip_ws(c: &[char], mut i: usize) -> usize {
    while i < c.len() && c[i].is_whitespace() {
        i += 1;
    }
    i
}

fn read_ident(c: &[char], i: usize) -> (String, usize) {
    let mut j = i;
    while j < c.len() && is_ident(c[j]) {
        j += 1;
    }
    (c[i..j].iter().collect(), j)
}

/// The paths of a path expression or `use` tree starting at `i` (`a::b::{c, d::{e, f}}` gives
/// `a::b::c`, `a::b::d::e`, `a::b::d::f`; `self` in a group names the group's prefix), and
/// where it ends.
fn parse_path(c: &[char], i: usize) -> (Vec<Vec<String>>, usize) {
    let mut segs = Vec::new();
    let mut i = i;
    loop {
        let (name, j) = read_ident(c, i);
        if name.is_empty() {
            break;
        }
        segs.push(name);
        i = j;
        let k = skip_ws(c, i);
        if !c[k..].starts_with(&[':', ':']) {
            break;
        }
        i = skip_ws(c, k + 2);
        if i < c.len() && c[i] == '{' {
            let (inner, end) = parse_group(c, i + 1);
            let paths = inner
                .into_iter()
                .map(|p| segs.iter().cloned().chain(p).collect())
                .collect();
            return (paths, end);
        }
        if i >= c.len() || !is_ident(c[i]) {
            break; // `*`, `<T>`
        }
    }
    (vec![segs], i)
}

/// The items of a `use` group after its `{`, and where the group ends.
fn parse_group(c: &[char], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut out = Vec::new();
    loop {
        while i < c.len() && (c[i].is_whitespace() || c[i] == ',') {
            i += 1;
        }
        if i >= c.len() {
            return (out, i);
        }
        match c[i] {
            '}' => return (out, i + 1),
            '*' => {
                out.push(Vec::new());
                i += 1;
            }
            _ if is_ident(c[i]) => {
                let (paths, end) = parse_path(c, i);
                for p in paths {
                    out.push(if p == ["self"] { Vec::new() } else { p });
                }
                i = end;
                // `as name`
                let k = skip_ws(c, i);
                let (w, e) = read_ident(c, k);
                if w == "as" {
                    i = read_ident(c, skip_ws(c, e)).1;
                }
            }
            _ => i += 1,
        }
    }
}

/// Per line of stripped code: the inline module path it is in (`mod name {` at some indent up to
/// the `}` at the same indent, as rustfmt writes them), or `None` inside a `#[cfg(test)]` module.
fn line_contexts(code: &str) -> Vec<Option<Vec<String>>> {
    let mut stack: Vec<(usize, String, bool)> = Vec::new();
    let mut out = Vec::new();
    let mut prev = "";
    for line in code.lines() {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        let ctx = |stack: &[(usize, String, bool)]| {
            (!stack.iter().any(|s| s.2)).then(|| stack.iter().map(|s| s.1.clone()).collect())
        };
        out.push(ctx(&stack));
        if t == "}" && stack.last().is_some_and(|s| s.0 == indent) {
            stack.pop();
        } else {
            let words: Vec<&str> = t.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "mod");
            if let Some(k) = at {
                let vis_only = words[..k].iter().all(|w| w.starts_with("pub"));
                if vis_only && words.get(k + 2) == Some(&"{") {
                    let test = prev.replace(' ', "").starts_with("#[cfg(test)]");
                    stack.push((indent, words[k + 1].to_string(), test));
                }
            }
        }
        if !t.is_empty() {
            prev = t;
        }
    }
    out
}

/// Every path a file's code names that starts at `crate`, `self`, `super` or a child module of
/// `module` (from `children`), made absolute, with its line.
fn references(
    code: &str,
    module: &[String],
    children: &BTreeMap<Vec<String>, BTreeSet<String>>,
) -> Vec<(Vec<String>, usize)> {
    let ctx = line_contexts(code);
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 0);
    let mut counted = 0; // chars up to which `line` is counted
    while i < c.len() {
        if !is_ident(c[i]) || (i > 0 && (is_ident(c[i - 1]) || matches!(c[i - 1], ':' | '.'))) {
            i += 1;
            continue;
        }
        let (name, after) = read_ident(&c, i);
        let k = skip_ws(&c, after);
        if !c[k..].starts_with(&[':', ':']) || name.starts_with(|ch: char| ch.is_ascii_digit()) {
            i = after;
            continue;
        }
        line += c[counted..i].iter().filter(|&&ch| ch == '\n').count();
        counted = i;
        let (paths, end) = parse_path(&c, i);
        i = end;
        let Some(inline) = ctx.get(line).cloned().flatten() else {
            continue; // a unit-test module
        };
        let cur: Vec<String> = module.iter().cloned().chain(inline).collect();
        for p in paths {
            let abs = match p.first().map(String::as_str) {
                Some("crate") => p[1..].to_vec(),
                Some("self") => cur.iter().chain(&p[1..]).cloned().collect(),
                Some("super") => {
                    let ups = p.iter().take_while(|s| *s == "super").count();
                    let base = &cur[..cur.len().saturating_sub(ups)];
                    base.iter().chain(&p[ups..]).cloned().collect()
                }
                Some(first) if children.get(&cur).is_some_and(|ch| ch.contains(first)) => {
                    cur.iter().chain(&p).cloned().collect()
                }
                _ => continue,
            };
            out.push((abs, line + 1));
        }
    }
    out
}

/// The file-level graph of the library under `src`.
fn file_graph(src: &Path) -> Graph {
    let files: BTreeMap<Vec<String>, String> = rust_files(src)
        .into_iter()
        .filter_map(|rel| module_of(&rel).map(|m| (m, rel)))
        .collect();
    let mut children: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    for m in files.keys().filter(|m| !m.is_empty()) {
        children
            .entry(m[..m.len() - 1].to_vec())
            .or_default()
            .insert(m[m.len() - 1].clone());
    }
    let mut g = Graph::new();
    for (module, rel) in &files {
        let code = strip(&std::fs::read_to_string(src.join(rel)).unwrap());
        g.entry(rel.clone()).or_default();
        for (path, line) in references(&code, module, &children) {
            let target = (0..=path.len())
                .rev()
                .find_map(|k| files.get(&path[..k]))
                .unwrap();
            if target != rel {
                g.entry(rel.clone())
                    .or_default()
                    .entry(target.clone())
                    .or_insert_with(|| format!("{rel}:{line} {}", path.join("::")));
            }
        }
    }
    g
}

/// The graph between top-level modules (`model/net.rs` → `model`, `lib.rs` → `lib`).
fn top_level(g: &Graph) -> Graph {
    let top = |f: &str| {
        f.split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string()
    };
    let mut t = Graph::new();
    for (a, next) in g {
        for (b, at) in next {
            if top(a) != top(b) {
                t.entry(top(a))
                    .or_default()
                    .entry(top(b))
                    .or_insert_with(|| at.clone());
            }
        }
    }
    t
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

fn src_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn src_graph() -> Graph {
    file_graph(&src_dir())
}

/// Every file of `src/`: its path relative to `src/` and its text.
fn src_texts() -> Vec<(String, String)> {
    let src = src_dir();
    rust_files(&src)
        .into_iter()
        .map(|rel| {
            let text = std::fs::read_to_string(src.join(&rel)).unwrap();
            (rel, text)
        })
        .collect()
}

#[test]
fn no_import_cycle_between_files() {
    let g = src_graph();
    // The reader sees the arrows it should (a grouped `use` over lines, `super::`, a child).
    assert!(
        g["detect/detector.rs"].contains_key("detect/nms.rs"),
        "{g:#?}"
    );
    assert!(g["model/net.rs"].contains_key("model/head.rs"), "{g:#?}");
    assert!(g["lib.rs"].contains_key("error.rs"), "{g:#?}");
    let known = |a: &str, b: &str| {
        KNOWN_CYCLES
            .iter()
            .any(|k| (k.0 == a && k.1 == b) || (k.0 == b && k.1 == a))
    };
    let cycles = cycle_edges(&g);
    let new: Vec<_> = cycles.iter().filter(|c| !known(&c.0, &c.1)).collect();
    assert!(
        new.is_empty(),
        "import cycles between files (edge, first use): {new:#?}"
    );
    for (a, b, why) in KNOWN_CYCLES {
        assert!(
            cycles.iter().any(|c| &c.0 == a && &c.1 == b),
            "{a} ⇄ {b} is no longer a cycle: remove it from KNOWN_CYCLES ({why})"
        );
    }
}

#[test]
fn no_arrow_runs_back_up_to_lib_rs() {
    let g = src_graph();
    let up: Vec<_> = g
        .iter()
        .filter_map(|(a, next)| next.get("lib.rs").map(|at| (a, at)))
        .collect();
    assert!(
        up.is_empty(),
        "files that use the crate root's re-exports instead of the item's own module: {up:#?}"
    );
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let g = top_level(&src_graph());
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
fn the_checker_reads_paths_groups_and_contexts() {
    let children: BTreeMap<Vec<String>, BTreeSet<String>> =
        [(vec!["m".to_string()], ["kid".to_string()].into())].into();
    let code = strip(
        "use crate::{model::{a, b as c}, loss,\n    cuda::x as y};\n\
         // crate::comment::ignored\n\
         let s = \"crate::string::ignored\"; let ch = '{'; let q = '\\'';\n\
         fn f<'a>() { super::up::f(); self::me(); kid::g(); other::h(); }\n\
         #[cfg(test)]\n\
         mod tests {\n    use crate::tested::T;\n}\n\
         mod inner {\n    use super::sib;\n}\n",
    );
    let m = ["m".to_string()];
    let got: Vec<(String, usize)> = references(&code, &m, &children)
        .into_iter()
        .map(|(p, l)| (p.join("::"), l))
        .collect();
    let want = [
        ("model::a", 1),
        ("model::b", 1),
        ("loss", 1),
        ("cuda::x", 1),
        ("up::f", 5),
        ("m::me", 5),
        ("m::kid::g", 5),
        ("m::sib", 11),
    ];
    assert_eq!(got, want.map(|(p, l)| (p.to_string(), l)), "{code}");
    let mut g = Graph::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        g.entry(a.into())
            .or_default()
            .insert(b.into(), format!("{a}.rs:1"));
    }
    let e = cycle_edges(&g);
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(!e.iter().any(|(_, b, _)| b == "d"));
}

/// Files that may print with the standard macros or show a path with `Path::display`, and why.
const RAW_OUTPUT_ALLOWED: &[(&str, &str)] = &[
    ("text.rs", "the escaping writers themselves"),
    (
        "launcher.rs",
        "also compiled alone into the `cuda` launcher binary (standard library only); it prints \
         only its own program's path and the names of missing system libraries",
    ),
];

/// The lines of stripped code, outside `#[cfg(test)]` modules, that print with `println!`,
/// `print!`, `eprintln!` or `eprint!` (rather than `text::outln!` and its kin) or show a path
/// with `.display()` (rather than `text::path`): `(line number, what)`.
fn raw_output(code: &str) -> Vec<(usize, &'static str)> {
    let ctx = line_contexts(code);
    let mut found = Vec::new();
    for (i, line) in code.lines().enumerate() {
        if ctx[i].is_none() {
            continue;
        }
        for what in ["println!", "print!", "eprintln!", "eprint!"] {
            let raw = line.match_indices(what).any(|(at, _)| {
                let head = &line[..at];
                !head.ends_with("text::") && !head.chars().next_back().is_some_and(is_ident)
            });
            if raw {
                found.push((i + 1, what));
            }
        }
        if line.contains(".display()") {
            found.push((i + 1, ".display()"));
        }
    }
    found
}

/// Issue 36, "hygiene", for its whole kind: every line the library and the commands print goes
/// through `yolo9::internals::text` (control characters and bidirectional overrides escaped, URL
/// credentials redacted), and every path shown in a message or error through `text::path`.
#[test]
fn every_print_and_every_shown_path_goes_through_text() {
    let mut bad = Vec::new();
    for (rel, text) in src_texts() {
        if RAW_OUTPUT_ALLOWED.iter().any(|a| a.0 == rel) {
            continue;
        }
        let code = strip(&text);
        for (line, what) in raw_output(&code) {
            bad.push(format!("src/{rel}:{line}: {what}"));
        }
    }
    assert!(
        bad.is_empty(),
        "raw output (use crate::text::outln!/out!/errln!/err! and crate::text::path): {bad:#?}"
    );
    // The checker finds what it should, and not in tests or through the writers.
    let sample = "fn f(p: &Path) {\n    println!(\"{}\", p.display());\n    \
                  crate::text::outln!(\"x\");\n    std::eprint!(\"y\");\n}\n\
                  #[cfg(test)]\nmod tests {\n    fn g() { println!(\"z\"); }\n}\n";
    assert_eq!(
        raw_output(&strip(sample)),
        vec![(2, "println!"), (2, ".display()"), (4, "eprint!")]
    );
}

/// Functions of `src/` longer than `limit` lines (from the `fn` line to its closing brace, as
/// rustfmt lays them out) without a plain `//` comment line right above them (attributes
/// skipped) saying why they are one piece: `file:line name (lines)`.
fn long_functions(rel: &str, text: &str, limit: usize) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let t = lines[i].trim_start();
        let indent = &lines[i][..lines[i].len() - t.len()];
        let head = t
            .split_whitespace()
            .skip_while(|w| w.starts_with("pub") || matches!(*w, "const" | "async" | "unsafe"))
            .collect::<Vec<_>>();
        if head.first() != Some(&"fn") {
            i += 1;
            continue;
        }
        let name = head
            .get(1)
            .map_or("", |n| n.split(['(', '<']).next().unwrap_or(""));
        // The signature ends at the line that opens the body (or a `;`: no body).
        let mut j = i;
        while j < lines.len() && !lines[j].ends_with('{') && !lines[j].ends_with(';') {
            j += 1;
        }
        if j >= lines.len() || lines[j].ends_with(';') {
            i = j + 1;
            continue;
        }
        let close = format!("{indent}}}");
        let end = (j + 1..lines.len())
            .find(|&k| lines[k] == close)
            .unwrap_or(lines.len() - 1);
        let n = end - i + 1;
        if n > limit {
            let above = (0..i)
                .rev()
                .map(|k| lines[k].trim())
                .find(|l| !l.starts_with("#["));
            let why = above.is_some_and(|l| l.starts_with("// "));
            if !why {
                out.push(format!("src/{rel}:{} {name} ({n} lines)", i + 1));
            }
        }
        i = end + 1;
    }
    out
}

/// Issue 35: every function of `src/` over 150 lines is split along the steps it has, or says
/// in one `//` line above it why it is one piece.
#[test]
fn long_functions_are_split_or_say_why() {
    let mut long = Vec::new();
    for (rel, text) in src_texts() {
        long.extend(long_functions(&rel, &text, 150));
    }
    assert!(long.is_empty(), "functions over 150 lines: {long:#?}");
    let body = |n: usize| "    x();\n".repeat(n);
    let sample = format!(
        "/// Docs.\npub fn a() {{\n{}}}\n\n// One match over the opcodes.\n#[inline]\nfn b(\n    x: u8,\n) -> u8 {{\n{}}}\nfn c() {{\n{}}}\n",
        body(4),
        body(4),
        body(2)
    );
    assert_eq!(
        long_functions("s.rs", &sample, 5),
        vec!["src/s.rs:2 a (6 lines)"]
    );
}

/// Issue 52, "one home for switches": `src/switches.rs` is the only code of `src/` that reads the
/// environment (`std::env::var`, `var_os`, `vars`, tracing's `try_from_env`).
#[test]
fn the_environment_is_read_in_one_module() {
    let mut bad = Vec::new();
    for (rel, text) in src_texts() {
        if rel == "switches.rs" {
            continue;
        }
        for (n, line) in strip(&text).lines().enumerate() {
            for what in ["env::var(", "env::var_os(", "env::vars(", "try_from_env("] {
                if line.contains(what) {
                    bad.push(format!("src/{rel}:{}: {what}", n + 1));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "environment read outside yolo9::internals::switches: {bad:#?}"
    );
}

/// Every `YOLO9_*` name the code of `src/` uses is a switch of the table, every switch of the
/// table is used somewhere, and `docs/configuration.md` holds the table as the code prints it.
#[test]
fn every_switch_is_in_the_table_and_the_table_is_documented() {
    let mut used = std::collections::BTreeSet::new();
    for (rel, text) in src_texts() {
        if rel == "switches.rs" {
            continue;
        }
        let mut rest = text.as_str();
        while let Some(at) = rest.find("\"YOLO9_") {
            let name: String = rest[at + 1..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            used.insert(name);
            rest = &rest[at + 1..];
        }
    }
    let table: std::collections::BTreeSet<String> = yolo9::internals::switches::SWITCHES
        .iter()
        .map(|s| s.name.to_string())
        .collect();
    let unlisted: Vec<_> = used.difference(&table).collect();
    let unused: Vec<_> = table.difference(&used).collect();
    assert!(
        unlisted.is_empty(),
        "switches read but not in yolo9::internals::switches::SWITCHES: {unlisted:?}"
    );
    assert!(
        unused.is_empty(),
        "switches listed but read nowhere: {unused:?}"
    );
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md"),
    )
    .unwrap();
    let expected = yolo9::internals::switches::markdown_table();
    assert!(
        doc.contains(&expected),
        "docs/configuration.md does not hold the table of yolo9::internals::switches; it should read:\n{expected}"
    );
}

/// Issue 52, "the CLI is thin": `src/cli/` holds argument parsing and one library call per
/// command (at most 1,600 lines in all), and no frame loop: the readers of videos and streams
/// and the image decoder are used by the library's jobs only.
#[test]
fn the_command_line_is_thin_and_holds_no_frame_loop() {
    let mut lines = 0;
    let mut loops = Vec::new();
    for (rel, text) in src_texts() {
        let Some(cli) = rel.strip_prefix("cli/") else {
            continue;
        };
        lines += text.lines().count();
        for (n, line) in strip(&text).lines().enumerate() {
            for what in [
                "FrameReader",
                "LiveReader",
                "next_frame(",
                "load_rgb8(",
                "detect_rgb(",
            ] {
                if line.contains(what) {
                    loops.push(format!("src/cli/{cli}:{}: {what}", n + 1));
                }
            }
        }
    }
    assert!(lines <= 1600, "src/cli/ has {lines} lines (at most 1,600)");
    assert!(
        loops.is_empty(),
        "frame loops in the command line: {loops:#?}"
    );
}

/// The public items of the default build, as `module::item-line`: every top-level `pub` item
/// (fn, struct, enum, trait, type, const, static, `pub use`) of each file reached from `lib.rs`
/// through `pub mod` declarations only (a `pub(crate) mod`, a `#[doc(hidden)]` one such as
/// `internals`, and one compiled only with the `cuda` feature are not followed).
fn public_items(src: &Path) -> Vec<String> {
    fn child(file: &Path, name: &str) -> Option<std::path::PathBuf> {
        let f = file.file_name().unwrap().to_str().unwrap();
        let dir = if f == "mod.rs" || f == "lib.rs" {
            file.parent().unwrap().to_path_buf()
        } else {
            file.with_extension("")
        };
        [
            dir.join(format!("{name}.rs")),
            dir.join(name).join("mod.rs"),
        ]
        .into_iter()
        .find(|p| p.exists())
    }
    fn walk(file: &Path, module: &str, out: &mut Vec<String>) {
        let text = std::fs::read_to_string(file).unwrap();
        let item = |l: &str| {
            [
                "fn ",
                "struct ",
                "enum ",
                "trait ",
                "type ",
                "const ",
                "static ",
                "use ",
                "unsafe fn ",
                "async fn ",
            ]
            .iter()
            .any(|k| l.strip_prefix("pub ").is_some_and(|r| r.starts_with(k)))
        };
        let (mut hidden, mut cuda) = (false, false);
        for l in text.lines() {
            if l.starts_with("#[doc(hidden)]") {
                hidden = true;
                continue;
            }
            if l.starts_with("#[cfg(") && l.contains("\"cuda\"") && !l.contains("not(") {
                cuda = true;
                continue;
            }
            if l.starts_with("#[") {
                continue;
            }
            if !hidden && !cuda {
                if let Some(name) = l.strip_prefix("pub mod ").and_then(|r| r.strip_suffix(';')) {
                    if let Some(f) = child(file, name) {
                        walk(&f, &format!("{module}::{name}"), out);
                    }
                } else if item(l) {
                    out.push(format!("{module}: {}", l.trim_end_matches(['{', ' '])));
                }
            }
            (hidden, cuda) = (false, false);
        }
    }
    let mut out = vec![];
    walk(&src.join("lib.rs"), "yolo9", &mut out);
    out
}

/// Issue 52, "a small public face": the default build exposes at most 450 top-level items, so
/// an internal change does not break an embedder; the rest is `pub(crate)`, reached by the
/// crate's own tests, benches and binaries through the hidden `yolo9::internals` (the compiler
/// refuses any other path to it).
#[test]
fn the_public_face_stays_small() {
    let items = public_items(&src_dir());
    // What an embedder needs is there, the engine's internals are not.
    for needed in [
        "yolo9::detect::detector: pub struct Detector",
        "yolo9::detect::config: pub struct DetectorConfig",
        "yolo9::model::weights: pub struct Weights",
        "yolo9::track::byte: pub struct ByteTracker",
    ] {
        assert!(
            items.iter().any(|i| i.starts_with(needed)),
            "{needed} is missing from the public items"
        );
    }
    for internal in [
        "yolo9::loss",
        "yolo9::cli",
        "yolo9::detect::nms",
        "yolo9::internals",
    ] {
        assert!(
            !items.iter().any(|i| i.starts_with(&format!("{internal}:"))
                || i.starts_with(&format!("{internal}::"))),
            "{internal} is public"
        );
    }
    assert!(
        items.len() <= 450,
        "{} public items (at most 450): make what an embedder does not need pub(crate) and \
         reach it through yolo9::internals:\n{}",
        items.len(),
        items.join("\n")
    );
}
