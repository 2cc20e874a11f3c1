//! Why a catalog failed to load. Each variant displays as something an
//! operator can act on without a backtrace.

use std::fmt;
use std::path::PathBuf;

/// One broken rule, at one TOML path (`tasks.fetch.accepts[0].asset`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// `line` and `column` are 1-based; the column counts characters.
    #[error("{path}:{line}:{column}: invalid TOML: {message}")]
    Syntax { path: String, line: usize, column: usize, message: String },
    #[error("{path}: {}", ProblemList(problems))]
    Invalid { path: String, problems: Vec<Problem> },
}

impl CatalogError {
    /// toml's own Display quotes the source over several lines; a one-line
    /// `file:line:col` form is what editors and CI logs can jump to.
    pub(super) fn syntax(path: &str, text: &str, error: &toml::de::Error) -> CatalogError {
        let offset = error.span().map_or(0, |span| span.start).min(text.len());
        let before = &text[..text.floor_char_boundary(offset)];
        let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
        CatalogError::Syntax {
            path: path.to_owned(),
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
            message: error.message().lines().next().unwrap_or_default().to_owned(),
        }
    }
}

struct ProblemList<'a>(&'a [Problem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.0.len();
        write!(f, "{count} problem{}:", if count == 1 { "" } else { "s" })?;
        for problem in self.0 {
            write!(f, "\n  {problem}")?;
        }
        Ok(())
    }
}
