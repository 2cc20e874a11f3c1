//! The `[uploads]` section on its own: what presign and the upload guard
//! need of the catalog, read without the task schemas. [`Uploads`] is
//! defined here, not in the catalog's module, so that `domain::uploads`
//! (which the `digest` executor calls) does not reach the module that holds
//! the executors.

use toml::{Table, Value};

use super::read::{Fields, KeyPath, Problems, bounded};
use super::{CatalogError, formats};

/// The longest original file name an upload may declare, in bytes (a
/// common file-system limit).
pub const MAX_FILENAME_BYTES: usize = 255;

/// Limits for presigned uploads (`[uploads]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uploads {
    pub max_bytes: u64,
    pub content_types: Vec<String>,
    pub url_expiry_seconds: u32,
}

impl Default for Uploads {
    fn default() -> Self {
        Uploads {
            max_bytes: 100 * 1024 * 1024,
            content_types: [
                "application/octet-stream",
                "text/plain",
                "application/pdf",
                "image/png",
                "image/jpeg",
                "application/json",
            ]
            .map(String::from)
            .to_vec(),
            url_expiry_seconds: 900,
        }
    }
}

impl Uploads {
    /// The limit in force: `max_bytes`, lowered to the deployment's cap
    /// (`REEVE_UPLOAD_MAX_BYTES`, the template's `UploadMaxBytes`) if it has one.
    pub fn capped(mut self, cap: Option<u64>) -> Uploads {
        self.max_bytes = cap.map_or(self.max_bytes, |cap| cap.min(self.max_bytes));
        self
    }
}

const UPLOADS_KEYS: &[&str] = &["max_bytes", "content_types", "url_expiry_seconds"];
/// The largest object S3 accepts in a single PUT, which is what presigning issues.
const MAX_UPLOAD_BYTES: i64 = 5 * 1024 * 1024 * 1024;
/// The longest a SigV4 presigned URL can live.
const MAX_URL_EXPIRY_SECONDS: i64 = 604_800;

impl Uploads {
    /// The `[uploads]` section of the catalog at `path`, checked as
    /// [`Catalog::load`](super::Catalog) checks it; the other sections are
    /// not read (the functions that serve them check them at their start).
    pub fn load(path: &std::path::Path) -> Result<Uploads, CatalogError> {
        let name = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| CatalogError::Read { path: path.to_owned(), source })?;
        let table: Table = text.parse().map_err(|error| CatalogError::syntax(&name, &text, &error))?;
        let mut problems = Problems::new();
        let uploads = uploads(&Fields::new(KeyPath::default(), &table), &mut problems);
        if problems.is_empty() { Ok(uploads) } else { Err(CatalogError::Invalid { path: name, problems }) }
    }
}

pub(super) fn uploads(root: &Fields, p: &mut Problems) -> Uploads {
    let defaults = Uploads::default();
    let Some(f) = root.table("uploads", p) else {
        return defaults;
    };
    f.deny_unknown(UPLOADS_KEYS, p);
    let max_bytes = f
        .optional("max_bytes", p)
        .and_then(|n| {
            let checked = bounded(n, 1..=MAX_UPLOAD_BYTES)
                .map_err(|message| format!("{message} (5 GiB is S3's limit for a single PUT)"));
            f.verify("max_bytes", checked, p)
        })
        .unwrap_or(defaults.max_bytes);
    let content_types = f
        .optional::<&[Value]>("content_types", p)
        .map(|items| content_types(&f.at("content_types"), items, p))
        .unwrap_or(defaults.content_types);
    let url_expiry_seconds =
        f.int_in("url_expiry_seconds", 1..=MAX_URL_EXPIRY_SECONDS, p).unwrap_or(defaults.url_expiry_seconds);

    Uploads { max_bytes, content_types, url_expiry_seconds }
}

fn content_types(path: &KeyPath, items: &[Value], p: &mut Problems) -> Vec<String> {
    if items.is_empty() {
        path.report(p, "must list at least one content type; uploads would all be refused");
    }
    items
        .iter()
        .enumerate()
        .filter_map(|(index, item)| {
            let path = path.index(index);
            let media_type: &str = path.read(item, p)?;
            path.verify(formats::media_type(media_type), p)?;
            Some(media_type.to_owned())
        })
        .collect()
}
