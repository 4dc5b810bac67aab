//! Named remotes of a ledger: the `REMOTES` file in its directory, a JSON
//! object `{"remotes": {"NAME": "URL"}}` written durably. URLs carrying
//! credentials are refused when added (see `store`), so the file never
//! holds a secret. Also the cache of remote pack indexes
//! (`remote-cache/idx/`), which is derived and may be deleted at any time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{RemoteError, Result};

pub const REMOTES_FILE: &str = "REMOTES";
pub const CACHE_DIR: &str = "remote-cache/idx";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remotes {
    pub remotes: BTreeMap<String, String>,
    /// Set by a lazy clone or pull: the URL whose blobs this ledger leaves
    /// there, fetched when read (the ledger is partial).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_from: Option<String>,
}

/// The index cache of the ledger in `ledger_dir`.
pub fn cache_dir(ledger_dir: &Path) -> PathBuf {
    ledger_dir.join(CACHE_DIR)
}

impl Remotes {
    pub fn load(ledger_dir: &Path) -> Result<Remotes> {
        let path = ledger_dir.join(REMOTES_FILE);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| RemoteError::Config {
                path,
                detail: format!("not a remotes file: {e}"),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Remotes::default()),
            Err(e) => Err(RemoteError::Io { path, source: e }),
        }
    }

    pub fn save(&self, ledger_dir: &Path) -> Result<()> {
        let path = ledger_dir.join(REMOTES_FILE);
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        ledger::write_durably(&ledger::OsFiles, &path, &bytes).map_err(RemoteError::io(path))
    }

    /// Adds `name` for `url` after checking the URL opens (no network).
    pub fn add(&mut self, ledger_dir: &Path, name: &str, url: &str) -> Result<()> {
        if name.is_empty() || name.contains(['/', ':']) || name.chars().any(char::is_whitespace) {
            return Err(RemoteError::Config {
                path: ledger_dir.join(REMOTES_FILE),
                detail: format!("{name:?} is not a remote name (no '/', ':' or spaces)"),
            });
        }
        if let Some(old) = self.remotes.get(name) {
            return Err(RemoteError::Config {
                path: ledger_dir.join(REMOTES_FILE),
                detail: format!(
                    "remote {name:?} exists (at {old}); `mass remote remove {name}` first"
                ),
            });
        }
        crate::store::Store::open(url)?;
        // A folder is kept as an absolute path: the ledger is used from
        // other working directories.
        let url = match crate::store::folder_path(url)? {
            Some(p) => std::path::absolute(&p)
                .map_err(RemoteError::io(&p))?
                .to_string_lossy()
                .into_owned(),
            None => url.to_string(),
        };
        self.remotes.insert(name.to_string(), url);
        Ok(())
    }

    /// The URL that `arg` names: a configured remote, or a URL or path.
    /// Without `arg`: `origin`, or the only remote there is.
    pub fn resolve(&self, ledger_dir: &Path, arg: Option<&str>) -> Result<String> {
        let path = ledger_dir.join(REMOTES_FILE);
        match arg {
            Some(a) => {
                if let Some(url) = self.remotes.get(a) {
                    return Ok(url.clone());
                }
                if looks_like_location(a) {
                    return Ok(a.to_string());
                }
                Err(RemoteError::NoSuchRemote {
                    name: a.to_string(),
                    path,
                })
            }
            None => {
                if let Some(url) = self.remotes.get("origin") {
                    return Ok(url.clone());
                }
                let mut all = self.remotes.values();
                match (all.next(), all.next()) {
                    (Some(one), None) => Ok(one.clone()),
                    _ => Err(RemoteError::Config {
                        path,
                        detail: "name the remote (there is no `origin` and not exactly one remote)"
                            .into(),
                    }),
                }
            }
        }
    }
}

/// Whether a command-line word names a location rather than a remote or a
/// run: a URL, or a path that starts like one (`/`, `./`, `../`, `~/`).
pub fn looks_like_location(word: &str) -> bool {
    word.contains("://")
        || word == "."
        || word == ".."
        || ["/", "./", "../", "~/"].iter().any(|p| word.starts_with(p))
}

/// Best-effort write of a cache file (temp file and rename): the cache is
/// derived, so a failure only costs a download next time.
pub(crate) fn write_cache(path: &Path, bytes: &[u8]) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}
