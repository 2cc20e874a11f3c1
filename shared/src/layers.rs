//! The structure, checked file by file: every path a file names (`use`
//! lines, grouped ones included, and paths written inline) is resolved to
//! the file that defines it. Then in `shared/src`:
//! - no file names a module through the crate root's re-exports
//!   (`crate::tasks`): it names the floor (`crate::domain::tasks`);
//! - no file imports a floor above its own;
//! - no adapter imports another adapter;
//!
//! and in `shared/src` and `cli/src`, no circle of files. Comments claim a
//! structure; this keeps it.
//!
//! A parent's `pub use` of its own submodules is its public face, not a
//! dependency (`tasks/mod.rs` re-exports `submit::submit`), so it draws no
//! arrow; any other use of a child does. A submodule's use of its parent
//! (`super::Task` in `tasks/submit.rs`) is an arrow for the floors, but no
//! part of a circle: the child is inside the parent.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Floors from the bottom: a file may import its own floor and those below.
const FLOORS: [&str; 4] = ["infra", "domain", "adapters", "startup"];

/// A module path inside a crate: `["domain", "tasks", "submit"]`.
type ModulePath = Vec<String>;

/// One crate's source files, by module path.
struct Tree {
    root: PathBuf,
    files: BTreeMap<ModulePath, PathBuf>,
}

/// An arrow from one file to another, and whether it came from a parent's
/// `pub use` of its own submodule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Import {
    path: ModulePath,
    reexport: bool,
}

impl Tree {
    fn read(root: PathBuf) -> Tree {
        let mut found = Vec::new();
        sources(&root, &mut found);
        let files = found.into_iter().map(|file| (module_path(file.strip_prefix(&root).expect("under src")), file));
        Tree { files: files.collect(), root }
    }

    /// The file `path` lives in: its longest prefix that is a file.
    fn file_of(&self, path: &[String]) -> ModulePath {
        (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| self.files.contains_key(p)).unwrap_or_default()
    }

    fn shown(&self, module: &ModulePath) -> String {
        let file = &self.files[module];
        file.strip_prefix(&self.root).expect("under src").display().to_string()
    }

    /// Every file's arrows to the files it imports (itself left out).
    fn edges(&self) -> BTreeMap<ModulePath, BTreeSet<ModulePath>> {
        let mut edges = BTreeMap::new();
        for (module, file) in &self.files {
            let text = std::fs::read_to_string(file).expect("a readable source file");
            let children = self.children(module);
            let mut targets = BTreeSet::new();
            for import in imports(&code(&text), module, &children) {
                let target = self.file_of(&import.path);
                let into_own_child = target.len() > module.len() && target.starts_with(module);
                if target != *module && !(import.reexport && into_own_child) {
                    targets.insert(target);
                }
            }
            edges.insert(module.clone(), targets);
        }
        edges
    }

    /// The names of a module's submodules that are files.
    fn children(&self, module: &ModulePath) -> BTreeSet<String> {
        self.files
            .keys()
            .filter(|p| p.len() == module.len() + 1 && p.starts_with(module))
            .map(|p| p[module.len()].clone())
            .collect()
    }
}

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable source folder") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// `domain/tasks/submit.rs` is `domain::tasks::submit`, `domain/tasks/mod.rs`
/// is `domain::tasks`, `lib.rs` and `main.rs` are the crate root.
fn module_path(relative: &Path) -> ModulePath {
    let mut parts: ModulePath = relative.iter().map(|p| p.to_str().expect("UTF-8 paths").to_owned()).collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
        parts.push(stem.to_owned());
    }
    parts
}

/// The code of a file without its comments (line, doc and block comments)
/// and with every string literal emptied, so a path named in prose or in a
/// message is not an import.
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |i| &after[i..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |i| &after[i + 2..]);
        } else if let Some(after) = ["'\"'", "'\\\"'"].iter().find_map(|c| rest.strip_prefix(c)) {
            // A quote as a character starts no string.
            out.push_str("' '");
            rest = after;
        } else if let Some(hashes) = raw_string_hashes(rest) {
            let close = format!("\"{}", "#".repeat(hashes));
            let body = &rest[hashes + 2..];
            rest = body.find(&close).map_or("", |i| &body[i + close.len()..]);
            out.push_str("\"\"");
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

/// `Some(n)` when `text` opens a raw string with `n` hashes (`r#"`).
fn raw_string_hashes(text: &str) -> Option<usize> {
    let after = text.strip_prefix('r')?;
    let hashes = after.len() - after.trim_start_matches('#').len();
    after[hashes..].starts_with('"').then_some(hashes)
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The identifier at the start of `text`.
fn ident(text: &str) -> &str {
    &text[..text.find(|c: char| !is_ident(c)).unwrap_or(text.len())]
}

/// Every path `code` names that points into the crate, as absolute module
/// paths. `module` is the file's own path and `children` its submodules
/// that are files (a parent may name them without `self::`). Inline
/// modules (`mod tests { use super::*; }`) are followed, so their `super`
/// is the file itself.
fn imports(code: &str, module: &ModulePath, children: &BTreeSet<String>) -> BTreeSet<Import> {
    // Where each inline module opens and closes.
    let mut scopes: Vec<(usize, usize, String)> = Vec::new();
    let mut open: Vec<Option<String>> = Vec::new();
    let mut pending: Option<String> = None;
    for (at, c) in code.char_indices() {
        match c {
            '{' => open.push(pending.take().map(|name| format!("{at}:{name}"))),
            '}' => {
                if let Some(Some(tag)) = open.pop() {
                    let (start, name) = tag.split_once(':').expect("tagged");
                    scopes.push((start.parse().expect("a position"), at, name.to_owned()));
                }
            }
            ';' => pending = None,
            'm' if code[at..].starts_with("mod ") && (at == 0 || !code[..at].ends_with(is_ident)) => {
                pending = Some(ident(code[at + 4..].trim_start()).to_owned());
            }
            _ => {}
        }
    }
    let base_at = |at: usize| -> ModulePath {
        let mut inner: Vec<&(usize, usize, String)> = scopes.iter().filter(|(s, e, _)| *s < at && at < *e).collect();
        inner.sort();
        module.iter().cloned().chain(inner.into_iter().map(|(_, _, name)| name.clone())).collect()
    };

    let mut found = BTreeSet::new();
    let mut in_use = Vec::new();
    // `use` statements, their trees expanded.
    for (at, _) in code.match_indices("use ") {
        if at > 0 && code[..at].ends_with(is_ident) {
            continue;
        }
        let end = code[at..].find(';').map_or(code.len(), |i| at + i);
        in_use.push((at, end));
        let before = code[..at].trim_end();
        let reexport = before.ends_with("pub")
            || (before.ends_with(')')
                && before.rfind("pub(").is_some_and(|p| before[p..].find(')') == Some(before.len() - p - 1)));
        let mut paths = Vec::new();
        expand("", &code[at + 4..end], &mut paths);
        let base = base_at(at);
        for path in paths {
            if let Some(path) = resolve(&path, &base, children) {
                found.insert(Import { path, reexport });
            }
        }
    }
    // Paths written inline: `crate::…`, `super::…`, `self::…`, `child::…`.
    for (at, c) in code.char_indices() {
        if !is_ident(c)
            || (at > 0 && (code[..at].ends_with(is_ident) || code[..at].ends_with("::") || code[..at].ends_with('$')))
        {
            continue;
        }
        if in_use.iter().any(|(s, e)| *s <= at && at < *e) {
            continue;
        }
        let first = ident(&code[at..]);
        let relative = matches!(first, "crate" | "super" | "self") || children.contains(first);
        if !relative || !code[at + first.len()..].starts_with("::") {
            continue;
        }
        let path: String = code[at..].chars().take_while(|c| is_ident(*c) || *c == ':').collect();
        if let Some(path) = resolve(path.trim_end_matches(':'), &base_at(at), children) {
            found.insert(Import { path, reexport: false });
        }
    }
    found
}

/// A use tree as its paths: `a::{b::{self, C}, d as e}` gives `a::b`,
/// `a::b::C` and `a::d`.
fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    let join = |rest: &str| if prefix.is_empty() { rest.to_owned() } else { format!("{prefix}::{rest}") };
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or_default().trim().trim_end_matches("::*");
        if path == "self" {
            out.push(prefix.to_owned());
        } else if !path.is_empty() {
            out.push(join(path));
        }
        return;
    };
    let head = join(tree[..open].trim().trim_end_matches("::"));
    let head = head.trim_end_matches("::");
    let body = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut item) = (0, String::new());
    for c in body.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(head, &std::mem::take(&mut item), out);
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    expand(head, &item, out);
}

/// `path` as an absolute module path, seen from `base`; `None` for a path
/// into another crate.
fn resolve(path: &str, base: &ModulePath, children: &BTreeSet<String>) -> Option<ModulePath> {
    let mut segments = path.split("::").map(str::trim).filter(|s| !s.is_empty()).peekable();
    let mut absolute = match *segments.peek()? {
        "crate" => {
            segments.next();
            Vec::new()
        }
        "super" | "self" => {
            let mut at = base.clone();
            while let Some(&step) = segments.peek() {
                match step {
                    "super" => at.pop(),
                    "self" => None,
                    _ => break,
                };
                segments.next();
            }
            at
        }
        first if children.contains(first) => base.clone(),
        _ => return None,
    };
    absolute.extend(segments.map(str::to_owned));
    Some(absolute)
}

fn shared_tree() -> Tree {
    Tree::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

fn cli_tree() -> Tree {
    Tree::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../cli/src"))
}

/// What `tree`'s files do wrong against the floors.
fn floor_violations(tree: &Tree) -> Vec<String> {
    let rank = |module: &ModulePath| module.first().and_then(|first| FLOORS.iter().position(|f| f == first));
    let mut wrong = Vec::new();
    for (from, targets) in tree.edges() {
        let Some(from_rank) = rank(&from) else { continue }; // the crate root and this file
        for to in targets {
            let shown = || format!("{} imports {}", tree.shown(&from), tree.shown(&to));
            match rank(&to) {
                None if to.is_empty() => {
                    wrong.push(format!("{}: names a module through the crate root; name its floor", shown()))
                }
                None => {}
                Some(to_rank) if to_rank > from_rank => wrong.push(format!("{}, a floor above its own", shown())),
                Some(_) if FLOORS[from_rank] == "adapters" && to[0] == "adapters" && from.get(1) != to.get(1) => {
                    wrong.push(format!("{}: one adapter imports another", shown()))
                }
                Some(_) => {}
            }
        }
    }
    wrong
}

/// Every circle of files in `tree`, each once. A file's arrow into a
/// module that holds it (`super::Task` from `tasks/submit.rs`) is not one of
/// a circle's: a submodule is part of its parent and may use what the
/// parent defines; the parent's use of a child (anything but a `pub use`)
/// is.
fn circles(tree: &Tree) -> Vec<String> {
    let mut edges = tree.edges();
    for (from, targets) in &mut edges {
        targets.retain(|to| !from.starts_with(to));
    }
    fn visit<'a>(
        node: &'a ModulePath,
        edges: &'a BTreeMap<ModulePath, BTreeSet<ModulePath>>,
        path: &mut Vec<&'a ModulePath>,
        done: &mut BTreeSet<&'a ModulePath>,
        found: &mut Vec<Vec<&'a ModulePath>>,
    ) {
        if let Some(at) = path.iter().position(|n| *n == node) {
            found.push(path[at..].to_vec());
            return;
        }
        if done.contains(node) {
            return;
        }
        path.push(node);
        for next in edges.get(node).into_iter().flatten() {
            visit(next, edges, path, done, found);
        }
        path.pop();
        done.insert(node);
    }
    let mut found = Vec::new();
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        visit(node, &edges, &mut Vec::new(), &mut done, &mut found);
    }
    let mut shown: Vec<String> = found
        .into_iter()
        .map(|circle| {
            let mut names: Vec<String> = circle.iter().map(|m| tree.shown(m)).collect();
            names.push(names[0].clone());
            names.join(" → ")
        })
        .collect();
    shown.sort();
    shown.dedup();
    shown
}

#[test]
fn no_file_imports_upward_a_sibling_adapter_or_through_the_root() {
    let wrong = floor_violations(&shared_tree());
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn no_circle_of_files_in_shared_or_the_cli() {
    let mut found = circles(&shared_tree());
    found.extend(circles(&cli_tree()).into_iter().map(|c| format!("cli: {c}")));
    assert!(found.is_empty(), "circles of files:\n{}", found.join("\n"));
}

#[test]
fn the_scan_sees_grouped_inline_relative_and_nested_paths() {
    let text = r#"
        use crate::{domain::{auth::{self, Secret}, ids}, infra::db as store};
        pub use child::Thing;
        use super::sibling::Item;
        // crate::adapters::worker in prose
        fn f() { crate::infra::metrics::flush("crate::adapters::sweeper"); child::go(); }
        mod tests { use super::*; use super::super::up; }
    "#;
    let module: ModulePath = ["domain", "tasks"].map(str::to_owned).to_vec();
    let children = BTreeSet::from(["child".to_owned()]);
    let found: Vec<(String, bool)> =
        imports(&code(text), &module, &children).into_iter().map(|i| (i.path.join("::"), i.reexport)).collect();
    let want = [
        ("domain::auth", false),
        ("domain::auth::Secret", false),
        ("domain::ids", false),
        ("domain::sibling::Item", false),
        ("domain::tasks", false),
        ("domain::tasks::child::Thing", true),
        ("domain::tasks::child::go", false),
        ("domain::up", false),
        ("infra::db", false),
        ("infra::metrics::flush", false),
    ];
    assert_eq!(found, want.map(|(p, r)| (p.to_owned(), r)));
}
