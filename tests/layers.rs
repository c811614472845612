//! The house's structure, checked: modules import only what lies below
//! them, no two files import each other in a circle, and no source file
//! passes 800 lines. The order of the layers is written here, once
//! (docs/architecture.md draws it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom first. A module may import its own layer's modules
/// and those below; never one above.
const LAYERS: &[&[&str]] = &[
    // Data and parsing.
    &[
        "relay", "session", "config", "children", "logging", "procs", "listing",
    ],
    // Decisions.
    &["policy"],
    // Confinement as a value and an interface.
    &["confine"],
    // The sandbox's network proxy, which both platforms run.
    &["network"],
    // The platforms that implement it.
    &["linux", "seatbelt"],
    // Services built on it.
    &["backend", "audit", "run_code", "shell_agent"],
    // The bridge.
    &["bridge"],
    // The command line.
    &["commands", "demo", "main", "lib"],
];

/// The longest a source file may be.
const MAX_LINES: usize = 800;

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Every `.rs` file under `src`, relative to it.
fn sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p.strip_prefix(&root).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// The module path of a source file (`linux/exec.rs` -> `linux::exec`).
fn module_of(file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The code of a file without its `#[cfg(test)]` modules and comments
/// (tests may reach anywhere; a word in a comment is no import).
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut skipping_test_mod = false;
    let mut depth = 0i32;
    let mut pending_cfg_test = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if skipping_test_mod {
            depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
            if depth <= 0 {
                skipping_test_mod = false;
            }
            continue;
        }
        if trimmed.starts_with("#[cfg(test)]") {
            pending_cfg_test = true;
            continue;
        }
        if pending_cfg_test {
            pending_cfg_test = false;
            let module_line = trimmed
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub(super) ")
                .trim_start_matches("pub ");
            if module_line.starts_with("mod ") && module_line.ends_with('{') {
                skipping_test_mod = true;
                depth = 1;
                continue;
            }
            if module_line.starts_with("mod ") {
                continue;
            }
        }
        let code = match trimmed.find("//") {
            Some(i) if !trimmed[..i].contains('"') => &trimmed[..i],
            _ => trimmed,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The files a file refers to through `crate::` paths and `super::`
/// paths (resolved to the longest path that is a file).
fn references(file: &Path, code: &str, files: &BTreeSet<PathBuf>) -> BTreeSet<PathBuf> {
    let module = module_of(file);
    let mut out = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let (start, base): (usize, Vec<String>) = if rest.starts_with("crate::") {
            (7, Vec::new())
        } else if rest.starts_with("super::") && (i == 0 || !is_ident(bytes[i - 1])) {
            // A file's `super` is the module around it: one step up from
            // its own module path (a mod.rs's module is its directory's).
            let mut b = module.clone();
            let mut r = rest;
            while let Some(t) = r.strip_prefix("super::") {
                b.pop();
                r = t;
            }
            (rest.len() - r.len(), b)
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        if i > 0 && is_ident(bytes[i - 1]) {
            i += 1;
            continue;
        }
        let tail = &rest[start..];
        let segs: Vec<String> = tail
            .split("::")
            .map(|s| {
                s.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|s| !s.is_empty())
            .collect();
        // `use crate::a::{b, c}`: each name in braces too.
        let mut candidates: Vec<Vec<String>> = vec![segs.clone()];
        if let Some(brace) = tail.find("::{") {
            let prefix: Vec<String> = tail[..brace].split("::").map(str::to_owned).collect();
            if prefix == segs[..segs.len().min(prefix.len())] {
                let inner = &tail[brace + 3..];
                let inner = &inner[..inner.find('}').unwrap_or(inner.len())];
                for name in inner.split(',') {
                    let name: String = name
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != "self" {
                        let mut c = prefix.clone();
                        c.push(name);
                        candidates.push(c);
                    }
                }
            }
        }
        for segs in candidates {
            let mut path: Vec<String> = base.clone();
            path.extend(segs);
            // The longest prefix that names a file.
            for n in (1..=path.len()).rev() {
                let p = path[..n].join("/");
                let found = [format!("{p}.rs"), format!("{p}/mod.rs")]
                    .into_iter()
                    .map(PathBuf::from)
                    .find(|c| files.contains(c));
                if let Some(f) = found {
                    if f != file {
                        out.insert(f);
                    }
                    break;
                }
            }
        }
        i += start;
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn top_module(file: &Path) -> String {
    let m = module_of(file);
    m.first().cloned().unwrap_or_default()
}

#[test]
fn modules_import_only_what_lies_below_them() {
    let files: BTreeSet<PathBuf> = sources().into_iter().collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut upward = Vec::new();
    for file in &files {
        let top = top_module(file);
        let Some(layer) = layer_of(&top) else {
            panic!(
                "{} is in no layer: add its module to LAYERS in tests/layers.rs",
                file.display()
            );
        };
        let code = code_of(&std::fs::read_to_string(root.join(file)).unwrap());
        for r in references(file, &code, &files) {
            let other = top_module(&r);
            let Some(theirs) = layer_of(&other) else {
                continue;
            };
            if theirs > layer {
                upward.push(format!(
                    "{} ({top}) imports {} ({other})",
                    file.display(),
                    r.display()
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that point up:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_two_files_import_each_other_in_a_circle() {
    let files: BTreeSet<PathBuf> = sources().into_iter().collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in &files {
        let code = code_of(&std::fs::read_to_string(root.join(file)).unwrap());
        // A module's own mod.rs declaring its files is no import of them.
        let refs = references(file, &code, &files);
        graph.insert(file.clone(), refs);
    }
    // Tarjan's strongly connected components.
    struct T<'a> {
        g: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        n: usize,
        out: Vec<Vec<&'a PathBuf>>,
    }
    impl<'a> T<'a> {
        fn visit(&mut self, v: &'a PathBuf) {
            self.index.insert(v, self.n);
            self.low.insert(v, self.n);
            self.n += 1;
            self.stack.push(v);
            self.on.insert(v);
            for w in self.g.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = T {
        g: &graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        n: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    let circles: Vec<String> = t
        .out
        .iter()
        .map(|c| {
            c.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" <-> ")
        })
        .collect();
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn no_source_file_passes_800_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let long: Vec<String> = sources()
        .into_iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(root.join(&f))
                .unwrap()
                .lines()
                .count();
            (n > MAX_LINES).then(|| format!("{}: {n} lines", f.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}
