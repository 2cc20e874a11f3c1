//! The crate's structure, checked: the import graph between its modules
//! (each `crate::…` path in `shared/src`, grouped `use crate::{…}` lines
//! included) has no circle, no module imports a floor above its own, and no
//! adapter imports another. Comments claim a structure; this keeps it.
//!
//! A module is a floor's top-level module (`domain/tasks/*.rs` is `tasks`),
//! so a parent and its own submodules may refer to each other freely.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Floors from the bottom: a module may import its own floor and those below.
const FLOORS: [&str; 4] = ["infra", "domain", "adapters", "startup"];

/// `(floor, module)` of a source file; `None` for the crate root and this file.
fn module_of(path: &Path) -> Option<(&'static str, String)> {
    let mut parts = path.iter().map(|p| p.to_str().expect("UTF-8 paths"));
    let first = parts.next()?;
    let floor = FLOORS.iter().find(|f| **f == first)?;
    if *floor == "startup" {
        return Some((floor, "startup".to_owned()));
    }
    let module = parts.next()?.trim_end_matches(".rs");
    (module != "mod").then(|| (*floor, module.to_owned()))
}

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("shared/src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The code of a file without its comments (line comments, doc comments and
/// block comments), so a path named in prose is not an import.
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |i| &after[i..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |i| &after[i + 2..]);
        } else if rest.starts_with('"') {
            // Strings may hold `//` (URLs) and are not imports either.
            let end = rest[1..].char_indices().scan(false, |escaped, (i, c)| {
                let done = c == '"' && !*escaped;
                *escaped = c == '\\' && !*escaped;
                Some((i, done))
            });
            let end = end.filter(|(_, done)| *done).map(|(i, _)| i + 2).next().unwrap_or(rest.len());
            out.push_str("\"\"");
            rest = &rest[end..];
        } else {
            let c = rest.chars().next().expect("not empty");
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The first segment of every `crate::` path in `code`: `crate::tasks::X`
/// gives `tasks`, `crate::{auth::Secret, db}` gives `auth` and `db`, and a
/// floor is looked through (`crate::domain::tasks` gives `tasks`).
fn imported(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        segments(&code[at + "crate::".len()..], &mut names);
    }
    names
}

fn segments(path: &str, names: &mut BTreeSet<String>) {
    let path = path.trim_start();
    if let Some(group) = path.strip_prefix('{') {
        let mut depth = 0;
        let mut item = String::new();
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    segments(&std::mem::take(&mut item), names);
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        segments(&item, names);
        return;
    }
    let name: String = path.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    if FLOORS.contains(&name.as_str()) && name != "startup" {
        if let Some(inner) = path[name.len()..].strip_prefix("::") {
            segments(inner, names);
        }
        return;
    }
    if !name.is_empty() && name != "self" {
        names.insert(name);
    }
}

/// Every module's floor and the modules it imports.
fn graph() -> (BTreeMap<String, &'static str>, BTreeMap<String, BTreeSet<String>>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut floors = BTreeMap::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some((floor, module)) = module_of(file.strip_prefix(&root).expect("under src")) else { continue };
        floors.insert(module.clone(), floor);
        let text = std::fs::read_to_string(file).expect("a readable source file");
        let imports = imported(&code(&text));
        edges.entry(module.clone()).or_default().extend(imports.into_iter().filter(|m| *m != module));
    }
    (floors, edges)
}

#[test]
fn no_module_imports_upward_or_a_sibling_adapter() {
    let (floors, edges) = graph();
    let rank = |floor: &str| FLOORS.iter().position(|f| *f == floor).expect("a floor");
    let mut wrong = Vec::new();
    for (from, targets) in &edges {
        let from_floor = floors[from];
        for to in targets {
            let Some(&to_floor) = floors.get(to) else { continue }; // a root item, such as a macro
            if rank(to_floor) > rank(from_floor) {
                wrong.push(format!("{from} ({from_floor}) imports {to} ({to_floor}), a floor above it"));
            } else if from_floor == "adapters" && to_floor == "adapters" {
                wrong.push(format!("adapter {from} imports adapter {to}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_import_graph_has_no_circle() {
    let (_, edges) = graph();
    // Depth-first, reporting the first circle found through each module.
    fn visit<'a>(
        node: &'a str,
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        circles: &mut Vec<String>,
    ) {
        if let Some(at) = path.iter().position(|n| *n == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node);
            circles.push(circle.join(" → "));
            return;
        }
        if !done.insert(node) {
            return;
        }
        path.push(node);
        for next in edges.get(node).into_iter().flatten() {
            visit(next, edges, path, done, circles);
        }
        path.pop();
    }
    let mut circles = Vec::new();
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        visit(node, &edges, &mut Vec::new(), &mut done, &mut circles);
    }
    assert!(circles.is_empty(), "import circles:\n{}", circles.join("\n"));
}

#[test]
fn the_scan_sees_grouped_and_inline_paths() {
    let text = "use crate::{auth::{self, Secret}, db};\n// crate::worker in prose\nlet x = crate::domain::tasks::f(\"crate::sweeper\");";
    let names: Vec<String> = imported(&code(text)).into_iter().collect();
    assert_eq!(names, ["auth", "db", "tasks"]);
}
