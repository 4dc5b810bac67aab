//! A remote location: an object store (S3 or S3-compatible, GCS, Azure, or
//! in memory for tests) or a local folder, reduced to the five operations
//! the protocol needs: read (whole or byte ranges), list, create-if-absent
//! and compare-and-swap.
//!
//! Cloud stores go through `object_store`, configured from the environment
//! as its builders read it (`AWS_*`, `GOOGLE_*`, `AZURE_*`); credentials are
//! never taken from a URL (one carrying a user, password or query is
//! refused) so none is ever recorded or printed. Create-if-absent is
//! `PutMode::Create` (S3 `If-None-Match: *`), compare-and-swap is
//! `PutMode::Update` with the ETag and version read before (S3 `If-Match`).
//!
//! A folder is read through `object_store`'s `LocalFileSystem` but written by
//! hand, because that store neither syncs what it writes (a power cut could
//! keep a ref and lose the pack it names) nor offers compare-and-swap: a
//! create is a synced temporary file hard-linked into place (the link fails
//! if the name exists), and a compare-and-swap holds an exclusive `flock`
//! on the folder's `LOCK` file while it compares the current bytes' BLAKE3
//! with the expected one and renames a synced file over them.

use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};

use crate::error::{RemoteError, Result};

/// The version of a file read from a store, for a later compare-and-swap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Version {
    e_tag: Option<String>,
    version: Option<String>,
}

impl Version {
    /// The version as one string (equal strings: the same version).
    pub fn tag(&self) -> String {
        format!(
            "{}/{}",
            self.e_tag.as_deref().unwrap_or(""),
            self.version.as_deref().unwrap_or("")
        )
    }
}

enum Inner {
    Cloud(Arc<dyn ObjectStore>),
    Folder {
        root: PathBuf,
        /// Opened once the folder exists: only a push creates it, so a
        /// mistyped path for a pull or clone leaves nothing behind.
        fs: std::sync::OnceLock<Arc<dyn ObjectStore>>,
    },
}

/// An opened remote location.
pub struct Store {
    inner: Inner,
    prefix: Path,
    location: String,
    /// Said with every store error (which credentials were missing).
    hint: String,
    rt: tokio::runtime::Runtime,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("location", &self.location)
            .finish()
    }
}

fn bad_url(url: &str, detail: impl Into<String>) -> RemoteError {
    RemoteError::BadUrl {
        url: scrub(url),
        detail: detail.into(),
    }
}

/// `url` without what may be a credential (user, password, query), for
/// messages.
pub fn scrub(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.has_host() => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            u.to_string()
        }
        // Not a URL with a host: keep the part before any '@' or '?'.
        _ => match url.find(['@', '?']) {
            Some(i) => format!("{}…", &url[..i]),
            None => url.to_string(),
        },
    }
}

/// Whether `url` names a folder (a path, or `file://`) rather than a store.
pub(crate) fn folder_path(url: &str) -> Result<Option<PathBuf>> {
    if let Some(rest) = url.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(bad_url(
                url,
                "a file:// URL needs an absolute path (file:///path)",
            ));
        }
        return Ok(Some(PathBuf::from(rest)));
    }
    if url.contains("://") {
        return Ok(None);
    }
    Ok(Some(PathBuf::from(url)))
}

impl Store {
    /// Opens the location `url`: `s3://BUCKET/PREFIX`, `gs://…`, `az://…`
    /// (or any URL `object_store` recognises for those), `memory://`, or a
    /// folder (a path or `file:///path`).
    pub fn open(url: &str) -> Result<Store> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(RemoteError::io("<tokio runtime>"))?;
        if let Some(dir) = folder_path(url)? {
            return Store::open_folder(url, &dir, rt);
        }
        let parsed = url::Url::parse(url).map_err(|e| bad_url(url, e.to_string()))?;
        if !parsed.username().is_empty() || parsed.password().is_some() || parsed.query().is_some()
        {
            return Err(bad_url(
                url,
                "credentials are never taken from a URL (give them in the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_ACCOUNT_KEY, ...)",
            ));
        }
        let (scheme, prefix) = object_store::ObjectStoreScheme::parse(&parsed).map_err(|e| {
            bad_url(
                url,
                format!("{e}; use s3://, gs://, az://, a folder path or memory://"),
            )
        })?;
        let store = build_cloud(url, &scheme)?;
        Ok(Store {
            inner: Inner::Cloud(store),
            prefix,
            location: url.to_string(),
            hint: credentials_hint(&scheme),
            rt,
        })
    }

    fn open_folder(url: &str, dir: &FsPath, rt: tokio::runtime::Runtime) -> Result<Store> {
        let root = std::path::absolute(dir).map_err(|e| bad_url(url, e.to_string()))?;
        Ok(Store {
            inner: Inner::Folder {
                root,
                fs: std::sync::OnceLock::new(),
            },
            prefix: Path::default(),
            location: url.to_string(),
            hint: String::new(),
            rt,
        })
    }

    /// The location as the user gave it (it carries no credentials).
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Whether this is a folder (written by hand, see the module docs).
    pub fn is_folder(&self) -> bool {
        matches!(self.inner, Inner::Folder { .. })
    }

    fn path(&self, key: &str) -> Path {
        let mut p = self.prefix.clone();
        // No empty parts: `""` is the location itself, not `PREFIX//`.
        for part in key.split('/').filter(|p| !p.is_empty()) {
            p = p.child(part);
        }
        p
    }

    /// The reading side; `None` for a folder that does not exist (yet).
    fn reader(&self) -> Option<Arc<dyn ObjectStore>> {
        match &self.inner {
            Inner::Cloud(s) => Some(s.clone()),
            Inner::Folder { root, fs } => {
                if let Some(f) = fs.get() {
                    return Some(f.clone());
                }
                let opened = object_store::local::LocalFileSystem::new_with_prefix(root).ok()?;
                Some(fs.get_or_init(|| Arc::new(opened)).clone())
            }
        }
    }

    fn err(&self, op: &str, key: &str) -> impl FnOnce(object_store::Error) -> RemoteError {
        let op = format!("{op} {key} on");
        let location = self.location.clone();
        let hint = self.hint.clone();
        move |e| RemoteError::Store {
            op,
            location,
            reason: format!("{}{hint}", crate::error::store_reason(&e)),
        }
    }

    /// A whole file and its version, or `None` if there is none.
    pub fn get(&self, key: &str) -> Result<Option<(Bytes, Version)>> {
        let path = self.path(key);
        let Some(store) = self.reader() else {
            return Ok(None);
        };
        let got = self.rt.block_on(async move {
            match store.get(&path).await {
                Ok(r) => {
                    let meta = r.meta.clone();
                    Ok(Some((r.bytes().await?, meta)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        let Some((bytes, meta)) = got.map_err(self.err("read", key))? else {
            return Ok(None);
        };
        let version = match &self.inner {
            Inner::Cloud(_) => Version {
                e_tag: meta.e_tag,
                version: meta.version,
            },
            Inner::Folder { .. } => content_version(&bytes),
        };
        Ok(Some((bytes, version)))
    }

    /// Byte ranges of a file (nearby ranges are fetched together).
    pub fn get_ranges(&self, key: &str, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let path = self.path(key);
        let gone = || RemoteError::Corrupt {
            key: format!("{}/{key}", self.location),
            detail: "its index lists it but the store does not have it".into(),
        };
        let store = self.reader().ok_or_else(gone)?;
        let ranges = ranges.to_vec();
        match self
            .rt
            .block_on(async move { store.get_ranges(&path, &ranges).await })
        {
            Ok(b) => Ok(b),
            Err(object_store::Error::NotFound { .. }) => Err(gone()),
            Err(e) => Err(self.err("read ranges of", key)(e)),
        }
    }

    /// Every key under `dir` (relative to the location), sorted.
    pub fn list(&self, dir: &str) -> Result<Vec<String>> {
        use futures::TryStreamExt;
        let path = self.path(dir);
        let Some(store) = self.reader() else {
            return Ok(Vec::new());
        };
        let metas: Vec<object_store::ObjectMeta> = self
            .rt
            .block_on(async move { store.list(Some(&path)).try_collect().await })
            .map_err(self.err("list", dir))?;
        let skip = self.prefix.parts().count();
        let mut keys: Vec<String> = metas
            .into_iter()
            .map(|m| {
                m.location
                    .parts()
                    .skip(skip)
                    .map(|p| p.as_ref().to_string())
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// Writes `bytes` at `key` unless something is there already. Returns
    /// whether this call created it.
    pub fn create(&self, key: &str, bytes: Bytes) -> Result<bool> {
        crash_point();
        match &self.inner {
            Inner::Folder { root, .. } => folder::create(root, key, &bytes),
            Inner::Cloud(s) => self.put(s.clone(), key, bytes, PutMode::Create),
        }
    }

    /// Replaces `key` only if it is still at `expected` (`None`: only if it
    /// does not exist). Returns false, changing nothing, if it moved.
    pub fn swap(&self, key: &str, bytes: Bytes, expected: Option<&Version>) -> Result<bool> {
        crash_point();
        match &self.inner {
            Inner::Folder { root, .. } => folder::swap(
                root,
                key,
                &bytes,
                expected.map(|v| v.e_tag.as_deref().unwrap_or("")),
            ),
            Inner::Cloud(s) => {
                let mode = match expected {
                    None => PutMode::Create,
                    Some(v) => PutMode::Update(UpdateVersion {
                        e_tag: v.e_tag.clone(),
                        version: v.version.clone(),
                    }),
                };
                self.put(s.clone(), key, bytes, mode)
            }
        }
    }

    /// Unconditional write: only for `Unprotected::unconditional_refs`.
    #[doc(hidden)]
    pub fn overwrite(&self, key: &str, bytes: Bytes) -> Result<bool> {
        match &self.inner {
            Inner::Folder { root, .. } => {
                let p = root.join(key);
                std::fs::write(&p, &bytes).map_err(RemoteError::io(p))?;
                Ok(true)
            }
            Inner::Cloud(s) => self.put(s.clone(), key, bytes, PutMode::Overwrite),
        }
    }

    fn put(
        &self,
        store: Arc<dyn ObjectStore>,
        key: &str,
        bytes: Bytes,
        mode: PutMode,
    ) -> Result<bool> {
        let path = self.path(key);
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        let res = self.rt.block_on(async move {
            store
                .put_opts(&path, PutPayload::from_bytes(bytes), opts)
                .await
        });
        match res {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(false),
            Err(e) => Err(self.err("write", key)(e)),
        }
    }
}

/// Test-only switch: with `MASS_REMOTE_KILL_AT_WRITE=N` the process
/// SIGKILLs itself as it starts its N-th write to a store (from 1), so the
/// crash tests can stop a push before every write it makes.
fn crash_point() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let Some(n) = std::env::var("MASS_REMOTE_KILL_AT_WRITE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return;
    };
    if WRITES.fetch_add(1, Ordering::SeqCst) + 1 == n {
        // SAFETY: signalling our own process.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// When no credential variable of the store's kind is set, errors say so
/// (the builders then fall back to instance metadata, whose failure names
/// an address the user never gave).
fn credentials_hint(scheme: &object_store::ObjectStoreScheme) -> String {
    use object_store::ObjectStoreScheme as S;
    let (vars, kind): (&[&str], &str) = match scheme {
        S::AmazonS3 => (
            &["AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"],
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT for an S3-compatible server)",
        ),
        S::GoogleCloudStorage => (
            &["GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_SERVICE_ACCOUNT_KEY", "GOOGLE_APPLICATION_CREDENTIALS"],
            "GOOGLE_APPLICATION_CREDENTIALS or GOOGLE_SERVICE_ACCOUNT",
        ),
        S::MicrosoftAzure => (
            &["AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_TOKEN", "AZURE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE", "AZURE_STORAGE_USE_EMULATOR"],
            "AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY",
        ),
        _ => return String::new(),
    };
    if vars.iter().any(|v| std::env::var_os(v).is_some()) {
        String::new()
    } else {
        format!(" (no credentials in the environment: set {kind})")
    }
}

fn content_version(bytes: &[u8]) -> Version {
    Version {
        e_tag: Some(blake3::hash(bytes).to_hex().to_string()),
        version: None,
    }
}

/// How long one store call retries a transient failure (a refused
/// connection, a 5xx) before it fails: bounded, so the callers' own
/// policies decide how long an unreachable store is waited for (a push
/// fails; a coordinator waits `--store-patience`, a worker keeps trying).
fn retry() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 4,
        retry_timeout: std::time::Duration::from_secs(10),
        ..Default::default()
    }
}

fn build_cloud(
    url: &str,
    scheme: &object_store::ObjectStoreScheme,
) -> Result<Arc<dyn ObjectStore>> {
    use object_store::ObjectStoreScheme as S;
    let built: std::result::Result<Arc<dyn ObjectStore>, object_store::Error> = match scheme {
        S::AmazonS3 => object_store::aws::AmazonS3Builder::from_env()
            .with_url(url)
            .with_retry(retry())
            .build()
            .map(|s| Arc::new(s) as _),
        S::GoogleCloudStorage => object_store::gcp::GoogleCloudStorageBuilder::from_env()
            .with_url(url)
            .with_retry(retry())
            .build()
            .map(|s| Arc::new(s) as _),
        S::MicrosoftAzure => object_store::azure::MicrosoftAzureBuilder::from_env()
            .with_url(url)
            .with_retry(retry())
            .build()
            .map(|s| Arc::new(s) as _),
        S::Memory => Ok(Arc::new(object_store::memory::InMemory::new())),
        other => {
            return Err(bad_url(url, format!("{other:?} stores are not supported; use s3://, gs://, az://, a folder path or memory://")));
        }
    };
    built.map_err(|e| {
        bad_url(
            url,
            format!("{e} (endpoints and credentials come from the environment)"),
        )
    })
}

/// Durable writes to a folder remote (see the module docs).
mod folder {
    use std::fs::{self, File, OpenOptions};
    use std::io::Write;
    use std::os::unix::io::AsRawFd;
    use std::path::{Path, PathBuf};

    use crate::error::{RemoteError, Result};

    /// The file of `key`, its directories created and, when new, synced
    /// into their parents (up to the folder's own parent), so a power cut
    /// cannot lose a directory a synced file sits in.
    fn place(root: &Path, key: &str) -> Result<PathBuf> {
        let p = root.join(key);
        let Some(dir) = p.parent() else {
            return Ok(p);
        };
        if !dir.is_dir() {
            fs::create_dir_all(dir).map_err(RemoteError::io(dir))?;
            let top = root.parent().unwrap_or(root);
            let mut at = dir;
            while let Some(parent) = at.parent() {
                sync_dir(at)?;
                if at == top || parent == at {
                    break;
                }
                at = parent;
            }
        }
        Ok(p)
    }

    fn temp_beside(p: &Path) -> PathBuf {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let mut s = p.as_os_str().to_owned();
        s.push(format!(
            ".tmp-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        PathBuf::from(s)
    }

    fn write_synced(p: &Path, bytes: &[u8]) -> Result<()> {
        let mut f = File::create(p).map_err(RemoteError::io(p))?;
        f.write_all(bytes).map_err(RemoteError::io(p))?;
        f.sync_all().map_err(RemoteError::io(p))
    }

    fn sync_dir(p: &Path) -> Result<()> {
        let dir = p.parent().unwrap_or(Path::new("."));
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(RemoteError::io(dir))
    }

    pub fn create(root: &Path, key: &str, bytes: &[u8]) -> Result<bool> {
        let p = place(root, key)?;
        if p.exists() {
            return Ok(false);
        }
        let tmp = temp_beside(&p);
        write_synced(&tmp, bytes)?;
        let linked = fs::hard_link(&tmp, &p);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                sync_dir(&p)?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(RemoteError::Io { path: p, source: e }),
        }
    }

    /// Compare-and-swap under the folder's lock; `expected` is the BLAKE3
    /// (hex) of the bytes the caller read, or `None` for "absent".
    pub fn swap(root: &Path, key: &str, bytes: &[u8], expected: Option<&str>) -> Result<bool> {
        fs::create_dir_all(root).map_err(RemoteError::io(root))?;
        let lock_path = root.join("LOCK");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(RemoteError::io(&lock_path))?;
        // SAFETY: flock on a descriptor we own; released when `lock` drops.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(RemoteError::Io {
                path: lock_path,
                source: std::io::Error::last_os_error(),
            });
        }
        let p = place(root, key)?;
        let current = match fs::read(&p) {
            Ok(b) => Some(blake3::hash(&b).to_hex().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(RemoteError::Io { path: p, source: e }),
        };
        if current.as_deref() != expected {
            return Ok(false);
        }
        let tmp = temp_beside(&p);
        write_synced(&tmp, bytes)?;
        fs::rename(&tmp, &p).map_err(RemoteError::io(&p))?;
        sync_dir(&p)?;
        Ok(true)
    }
}
