//! Structure checks that read the source, not run it (see ARCHITECTURE.md).
//!
//! Between crates: each workspace crate depends only on the sluice crates
//! ARCHITECTURE.md's "Crate direction" allows it ([`ALLOWED`]), and the
//! crates below the services (schemas, kernels, models) on no networking,
//! storage or command-line crate.
//!
//! Within a crate, for every crate of the workspace: at every level of its module tree (the
//! crate's top-level modules, then the children of each folder module), no
//! module uses, directly or through its siblings, a sibling that uses it
//! back. A module is its whole subtree here: `job::settle` naming
//! `crate::task::encoder::EncoderEngine` is an edge `job -> task` at the top
//! and nothing inside `job/`. A folder's own file (`mod.rs`) is one more node
//! among its children, `(mod)`: a child that names the folder's own items
//! while the folder's file names that child is a cycle too, so shared types
//! live in a child and siblings name each other by path
//! (`super::delivery::Delivery`), not through the folder's re-exports.
//!
//! References are read from `crate::`, `super::` and `self::` paths outside
//! comments, and from a folder's file naming a child without `self::`
//! (`executor::spawn(..)`), `use` groups expanded. A path that names no module of the crate
//! (a re-export) counts as its longest module prefix.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The modules of a crate from its `src/`, each `a::b` with its source.
fn modules(src: &Path) -> BTreeMap<Vec<String>, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut name: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                name.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                name.pop();
            }
            // Binaries (`main.rs`, `bin/`) are outside the library's tree.
            if rel == Path::new("main") || name.first().map(String::as_str) == Some("bin") {
                continue;
            }
            out.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    out
}

/// Source without `//` comments (doc comments included), string literals
/// and `#[cfg(test)]` modules (whose `super::` is the file's own module,
/// and which are no part of the structure).
fn code_only(text: &str) -> String {
    let text = without_test_modules(text);
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_string = false;
        let mut prev = ' ';
        let mut kept = String::new();
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if !in_string && c == '/' && chars.get(i + 1) == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' {
                in_string = !in_string;
            } else if !in_string {
                kept.push(c);
            }
            prev = c;
            i += 1;
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

/// `text` less each `#[cfg(test)] mod ... { ... }`.
fn without_test_modules(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let attribute = "#[cfg(test)]".len();
        if !after[attribute..].trim_start().starts_with("mod ") {
            // A test-only `use` or item: keep it (its paths are the file's).
            out.push_str(&after[..attribute]);
            rest = &after[attribute..];
            continue;
        }
        let Some(open) = after.find('{') else {
            rest = "";
            break;
        };
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Every path the module names through `crate::`, `super::` or `self::`,
/// made absolute (`use` groups expanded, `as` renames dropped).
fn referenced_paths(module: &[String], text: &str) -> Vec<Vec<String>> {
    let code = code_only(text);
    let bytes: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let rest: String = bytes[i..bytes.len().min(i + 7)].iter().collect();
        let starts_word = i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_');
        let base: Option<(Vec<String>, usize)> = if !starts_word {
            None
        } else if rest.starts_with("crate::") {
            Some((Vec::new(), 7))
        } else if rest.starts_with("super::") {
            // In `a/b.rs` (module a::b), super is `a`; several supers climb.
            let mut base = module.to_vec();
            base.pop();
            Some((base, 7))
        } else if rest.starts_with("self::") {
            Some((module.to_vec(), 6))
        } else {
            None
        };
        let Some((mut base, skip)) = base else {
            i += 1;
            continue;
        };
        i += skip;
        while bytes[i..].iter().collect::<String>().starts_with("super::") {
            base.pop();
            i += 7;
        }
        let (paths, end) = parse_tree(&bytes, i);
        for p in paths {
            let mut full = base.clone();
            full.extend(p);
            out.push(full);
        }
        i = end.max(i + 1);
    }
    out
}

/// Every path a folder's own file names through one of its children
/// without `self::` (`executor::spawn(..)` in `encoder/mod.rs`), made
/// absolute.
fn child_paths(
    module: &[String],
    text: &str,
    modules: &BTreeMap<Vec<String>, String>,
) -> Vec<Vec<String>> {
    let code = code_only(text);
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let word = chars[i].is_alphabetic() || chars[i] == '_';
        let starts = i == 0
            || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_' || chars[i - 1] == ':');
        if !(word && starts) {
            i += 1;
            continue;
        }
        let mut end = i;
        while end < chars.len() && (chars[end].is_alphanumeric() || chars[end] == '_') {
            end += 1;
        }
        let ident: String = chars[i..end].iter().collect();
        let names_child = chars[end..].iter().take(2).collect::<String>() == "::" && {
            let mut child = module.to_vec();
            child.push(ident.clone());
            modules.contains_key(&child)
        };
        if !names_child || matches!(ident.as_str(), "crate" | "super" | "self") {
            i = end;
            continue;
        }
        let (paths, after) = parse_tree(&chars, i);
        for p in paths {
            let mut full = module.to_vec();
            full.extend(p);
            out.push(full);
        }
        i = after.max(end);
    }
    out
}

/// Parses `a::b::{c, d::{e}}` (or a bare `{c, d}`) from `at`: the paths,
/// and where it ended.
fn parse_tree(s: &[char], mut at: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    loop {
        let start = at;
        while at < s.len() && (s[at].is_alphanumeric() || s[at] == '_') {
            at += 1;
        }
        if at > start {
            prefix.push(s[start..at].iter().collect::<String>());
        }
        let group_next = s.get(at) == Some(&'{') && at == start;
        if group_next || s[at..].iter().take(2).collect::<String>() == "::" {
            if !group_next {
                at += 2;
            }
            if s.get(at) == Some(&'{') {
                at += 1;
                let mut paths = Vec::new();
                loop {
                    while at < s.len() && s[at].is_whitespace() {
                        at += 1;
                    }
                    if at >= s.len() || s[at] == '}' {
                        return (
                            paths
                                .into_iter()
                                .map(|p: Vec<String>| {
                                    let mut full = prefix.clone();
                                    full.extend(p);
                                    full
                                })
                                .collect(),
                            at + 1,
                        );
                    }
                    let (inner, end) = parse_tree(s, at);
                    paths.extend(inner);
                    at = end;
                    // Skip an `as name`, then the separator.
                    while at < s.len() && s[at] != ',' && s[at] != '}' {
                        at += 1;
                    }
                    if s.get(at) == Some(&',') {
                        at += 1;
                    }
                }
            }
            continue;
        }
        // `self` inside a group names the prefix itself.
        if prefix.last().map(String::as_str) == Some("self") {
            prefix.pop();
        }
        return (vec![prefix], at);
    }
}

/// The longest prefix of `path` that is a module.
fn resolve<'a>(
    modules: &'a BTreeMap<Vec<String>, String>,
    path: &[String],
) -> Option<&'a Vec<String>> {
    (1..=path.len())
        .rev()
        .find_map(|k| modules.get_key_value(&path[..k]).map(|(key, _)| key))
}

/// A folder's own file among its children.
const OWN: &str = "(mod)";

/// Cycles among the children of every module, as lists of child names.
fn cycles(modules: &BTreeMap<Vec<String>, String>) -> Vec<(String, Vec<String>)> {
    // parent -> child -> children it names
    let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (module, text) in modules {
        let mut paths = referenced_paths(module, text);
        paths.extend(child_paths(module, text, modules));
        for path in paths {
            let Some(target) = resolve(modules, &path) else {
                continue;
            };
            if target == module {
                continue;
            }
            // The deepest common ancestor, and the child of it on each side;
            // a folder's own file (`mod.rs`) is the node `(mod)` among its
            // children.
            let common = module
                .iter()
                .zip(target)
                .take_while(|(a, b)| a == b)
                .count();
            let (level, from, to) = if common == module.len() {
                // A folder's own file naming one of its descendants.
                (module.clone(), OWN.to_string(), target[common].clone())
            } else if common == target.len() {
                // A descendant naming its folder's own items.
                (target.clone(), module[common].clone(), OWN.to_string())
            } else {
                (
                    module[..common].to_vec(),
                    module[common].clone(),
                    target[common].clone(),
                )
            };
            graphs
                .entry(level)
                .or_default()
                .entry(from)
                .or_default()
                .insert(to);
        }
    }
    let mut found = Vec::new();
    for (parent, graph) in &graphs {
        for cycle in strongly_connected(graph) {
            let name = if parent.is_empty() {
                "crate".to_string()
            } else {
                parent.join("::")
            };
            found.push((name, cycle));
        }
    }
    found
}

/// Components of more than one node (Tarjan).
fn strongly_connected(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.stack.contains(&w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// The workspace's crates (`[workspace] members` of the root `Cargo.toml`).
fn workspace_members() -> Vec<String> {
    let root = sluice_tests::repo_root();
    let text = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let manifest: toml::Table = text.parse().unwrap();
    manifest["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect()
}

/// Every crate's module tree has no import cycle at any level.
#[test]
fn no_crate_has_import_cycles() {
    let members = workspace_members();
    assert!(members.len() >= 9, "read {members:?}");
    let mut all = Vec::new();
    for member in &members {
        let src = sluice_tests::repo_root().join(member).join("src");
        let modules = modules(&src);
        // A crate of binaries alone (bench's) has no library tree to check.
        let binaries_only = !src.join("lib.rs").exists() && src.join("bin").is_dir();
        assert!(
            !modules.is_empty() || binaries_only,
            "read no module in {}",
            src.display()
        );
        let found = cycles(&modules);
        if !found.is_empty() {
            all.push((member.clone(), found));
        }
    }
    assert!(
        all.is_empty(),
        "import cycles (crate, then at which level: the modules that use each other): {all:?}"
    );
}

/// The sluice crates each crate may depend on (normal, dev and build
/// dependencies alike), by folder; ARCHITECTURE.md's "Crate direction" says
/// why. `tests` is the harness and may use them all.
const ALLOWED: &[(&str, &[&str])] = &[
    ("schemas", &[]),
    ("kernels", &[]),
    ("connect", &["schemas"]),
    ("status", &["schemas"]),
    ("models", &["kernels"]),
    ("producer", &["schemas", "connect", "status"]),
    ("consumer", &["schemas", "connect", "status", "models"]),
    ("gateway", &["schemas", "connect", "status", "producer"]),
    (
        "tests",
        &[
            "schemas", "connect", "status", "kernels", "models", "consumer", "producer", "gateway",
        ],
    ),
    (
        "bench",
        &["schemas", "models", "consumer", "producer", "tests"],
    ),
];

/// Outside crates the lower crates never take: the wire, storage, the
/// command line and the async runtime belong to the services.
const SERVICE_ONLY: &[&str] = &[
    "async-nats",
    "aws-config",
    "aws-sdk-s3",
    "axum",
    "clap",
    "reqwest",
    "tokio",
];

/// The dependencies of `member`'s manifest, every section.
fn dependencies(member: &str) -> Vec<String> {
    let path = sluice_tests::repo_root().join(member).join("Cargo.toml");
    let manifest: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
    let mut out = Vec::new();
    for section in ["dependencies", "dev-dependencies", "build-dependencies"] {
        if let Some(table) = manifest.get(section).and_then(|t| t.as_table()) {
            out.extend(table.keys().cloned());
        }
    }
    out
}

#[test]
fn crates_depend_in_one_direction() {
    let members = workspace_members();
    let mut wrong = Vec::new();
    for member in &members {
        let Some((_, allowed)) = ALLOWED.iter().find(|(m, _)| m == member) else {
            panic!(
                "{member} is not in ALLOWED: say what it may depend on here and in ARCHITECTURE.md"
            );
        };
        for dep in dependencies(member) {
            let Some(inner) = dep.strip_prefix("sluice-") else {
                if ["schemas", "kernels", "models"].contains(&member.as_str())
                    && SERVICE_ONLY.contains(&dep.as_str())
                {
                    wrong.push(format!("{member} -> {dep}"));
                }
                continue;
            };
            if !allowed.contains(&inner) {
                wrong.push(format!("{member} -> sluice-{inner}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "dependencies against the crate direction (ARCHITECTURE.md): {wrong:?}"
    );
}

/// The check itself finds what it is for: a cycle through a `use` group,
/// one through `super::`, one between a folder's own file and its child,
/// and none where a child names a folder that does not name it back.
#[test]
fn the_cycle_check_finds_cycles() {
    let m = |path: &str, text: &str| {
        let name = path.split("::").map(str::to_string).collect::<Vec<_>>();
        (name, text.to_string())
    };
    let tree: BTreeMap<_, _> = [
        m("a", "use crate::{b::B, c};"),
        m("b", "fn f() { crate::c::g() }"),
        m(
            "c",
            "// use crate::a; in a comment is no edge\nuse crate::a::A as X;",
        ),
        m("d", "pub use self::e::E; mod e;"),
        m("d::e", "use super::f; use super::super::a::A;"),
        m("d::f", "use crate::d::e::E;"),
        m("g", "let s = \"crate::a\";"),
        m("h", "pub use self::i::I; pub struct H;"),
        m("h::i", "use super::H;"),
        m("k", "pub struct K;"),
        m("k::l", "use super::K;"),
        m("m", "pub use self::n::N;"),
        m(
            "m::n",
            "pub struct N;\n#[cfg(test)]\nmod tests { use super::*; }",
        ),
        // A folder's file naming its child without `self::` is an edge too
        // (`o::p::run`), and a foreign crate's path (`std::`) is none.
        m("o", "pub struct O; fn f() { p::run(); std::mem::drop(1); }"),
        m("o::p", "use super::O; pub fn run() {}"),
        m("q", "fn f() { r::go() }"),
        m("q::r", "pub fn go() { std::process::exit(0) }"),
    ]
    .into_iter()
    .collect();
    let found = cycles(&tree);
    assert_eq!(
        found,
        vec![
            (
                "crate".to_string(),
                vec!["a".to_string(), "b".to_string(), "c".to_string()]
            ),
            ("d".to_string(), vec!["e".to_string(), "f".to_string()]),
            ("h".to_string(), vec![OWN.to_string(), "i".to_string()]),
            ("o".to_string(), vec![OWN.to_string(), "p".to_string()]),
        ]
    );
}
