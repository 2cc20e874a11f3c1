//! The credentials file, `$XDG_CONFIG_HOME/reeve/credentials.toml` (or
//! `--config-home`'s; else `~/.config/reeve/credentials.toml`), the way `gh`
//! and `aws` keep theirs:
//! one profile per endpoint (named after it unless `--profile` says
//! otherwise), each with its Space ID and the cached session token. The file
//! holds a bearer secret, so it is created with mode 0600 and rewritten
//! whole through a temporary file of the same mode.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::ClientError;

#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct Profile {
    /// The deployment this profile talks to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "time::serde::rfc3339::option")]
    pub token_expires_at: Option<OffsetDateTime>,
}

impl Profile {
    /// The cached token if it still has a little life left: one about to
    /// expire is renewed rather than sent and refused.
    pub fn live_token(&self, now: OffsetDateTime) -> Option<&str> {
        let expires = self.token_expires_at?;
        (expires - time::Duration::seconds(30) > now).then_some(self.token.as_deref()?)
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct CredentialsFile {
    #[serde(default)]
    pub profiles: BTreeMap<String, Profile>,
}

/// The file under `config_home` (`--config-home`, or `XDG_CONFIG_HOME` as
/// clap read it), else under `~/.config`. Blank counts as unset, as the XDG
/// spec says.
pub fn path(config_home: Option<&Path>) -> Result<PathBuf, ClientError> {
    let blank = |dir: &Path| dir.as_os_str().is_empty();
    let base = match config_home.filter(|dir| !blank(dir)) {
        Some(dir) => dir.to_owned(),
        None => match std::env::home_dir().filter(|home| !blank(home)) {
            Some(home) => home.join(".config"),
            None => return Err(ClientError::Usage("no home directory: set XDG_CONFIG_HOME or --config-home".into())),
        },
    };
    Ok(base.join("reeve").join("credentials.toml"))
}

impl CredentialsFile {
    pub fn load(path: &Path) -> Result<CredentialsFile, ClientError> {
        match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str(&text)
                .map_err(|e| ClientError::Usage(format!("{} is not a valid credentials file: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(CredentialsFile::default()),
            Err(e) => Err(ClientError::Usage(format!("cannot read {}: {e}", path.display()))),
        }
    }

    pub fn save(&self, path: &Path) -> Result<(), ClientError> {
        let fail = |e: std::io::Error| ClientError::Usage(format!("cannot write {}: {e}", path.display()));
        let dir = path.parent().expect("the path has a directory");
        std::fs::create_dir_all(dir).map_err(fail)?;
        let text = toml::to_string_pretty(self).expect("profiles serialise");
        let tmp = path.with_extension("toml.tmp");
        let mut file =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(fail)?;
        // A temporary file left by an older run may have kept a wider mode.
        file.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(fail)?;
        file.write_all(text.as_bytes()).map_err(fail)?;
        file.sync_all().map_err(fail)?;
        std::fs::rename(&tmp, path).map_err(fail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_under_the_config_home_given_else_under_home() {
        let file = path(Some(Path::new("/xdg"))).unwrap();
        assert_eq!(file, Path::new("/xdg/reeve/credentials.toml"));
        // A blank XDG_CONFIG_HOME is unset (the process's home is not ours
        // to change here; the suite's `cli` tests set HOME).
        if let Some(home) = std::env::home_dir().filter(|h| !h.as_os_str().is_empty()) {
            assert_eq!(path(Some(Path::new(""))).unwrap(), home.join(".config/reeve/credentials.toml"));
            assert_eq!(path(None).unwrap(), home.join(".config/reeve/credentials.toml"));
        }
    }
}
