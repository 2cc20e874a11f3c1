//! The README's environment tables against the code, both ways: every
//! variable a binary reads is documented, and every documented variable is
//! one the code reads. A variable added without its row (or a row left
//! behind by a removed variable) fails here, not in an operator's hands.
//!
//! "Read by the code" is every string literal naming a Reeve variable in
//! `shared/src`, `cli/src` and `functions/*/src`: the names live in
//! `shared/src/startup/settings.rs` (or a lower floor's module, re-exported
//! there), so this finds each once, and a name typed anywhere else is found
//! too.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A name Reeve owns or reads by name: the `REEVE_` ones, the two store
/// URLs and the credentials file's base. `AWS_*` belong to the SDK.
fn is_ours(name: &str) -> bool {
    name.starts_with("REEVE_") || ["DATABASE_URL", "REDIS_URL", "XDG_CONFIG_HOME", "RUST_LOG"].contains(&name)
}

fn is_variable(word: &str) -> bool {
    word.len() > 3
        && word.starts_with(|c: char| c.is_ascii_uppercase())
        && word.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// The backquoted names in the first column of each table row under
/// `### Environment`, up to the next heading of that level or above.
fn documented() -> BTreeSet<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = readme.split("\n### Environment\n").nth(1).expect("README.md has a '### Environment' section");
    let section = section.split("\n## ").next().unwrap();
    let section = section.split("\n### ").next().unwrap();
    let mut names = BTreeSet::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let first = line.split('|').nth(1).unwrap();
        for (i, part) in first.split('`').enumerate() {
            if i % 2 == 1 && is_variable(part) {
                names.insert(part.to_owned());
            }
        }
    }
    names
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `"NAME"` literal in the binaries' sources that [`is_ours`].
fn read_by_the_code() -> BTreeSet<String> {
    let root = repo();
    let mut files = Vec::new();
    rust_files(&root.join("shared/src"), &mut files);
    rust_files(&root.join("cli/src"), &mut files);
    for function in std::fs::read_dir(root.join("functions")).unwrap() {
        let src = function.unwrap().path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        // A quote, a name, a quote: nothing else is taken for a literal.
        let parts: Vec<&str> = text.split('"').collect();
        for part in parts.iter().skip(1).take(parts.len().saturating_sub(2)) {
            if is_variable(part) && is_ours(part) {
                names.insert((*part).to_owned());
            }
        }
    }
    names
}

#[test]
fn the_readme_documents_every_variable_the_code_reads_and_no_other() {
    let documented = documented();
    let read = read_by_the_code();
    assert!(read.contains("REEVE_LEASE_SECONDS") && read.contains("REEVE_ENDPOINT"), "the scan finds names: {read:?}");
    let undocumented: Vec<_> = read.iter().filter(|n| !documented.contains(*n)).collect();
    assert!(undocumented.is_empty(), "read by the code but not in README.md's environment tables: {undocumented:?}");
    let unread: Vec<_> = documented.iter().filter(|n| is_ours(n) && !read.contains(*n)).collect();
    assert!(unread.is_empty(), "in README.md's environment tables but read by no code: {unread:?}");
}
