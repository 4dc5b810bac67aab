//! What opening a ledger rests on, apart from the scan itself: the `FORMAT`
//! file and the ledger's salt, the writer's lock and the watermark it
//! publishes for lock-free readers, the evidence the log is checked against,
//! the durable list of damaged ranges with their quarantine copies, and the
//! atomic swap of a rebuilt index.
//!
//! Every write here goes through the [`FileLayer`], so the power-loss tests
//! cut each of them, and each is durable before anything relies on it.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{LedgerError, Result};
use crate::files::{self, FileLayer};
use crate::recovery::{Damage, Evidence};
use crate::segment::{self, HeaderRead, Salt, FORMAT_VERSION};
use crate::store::{INDEX_DIR, QUARANTINE_DIR};

pub(crate) const FORMAT_FILE: &str = "FORMAT";
pub(crate) const LOCK_FILE: &str = "LOCK";
/// Where the writer publishes how far the log is durable.
pub(crate) const WATERMARK_FILE: &str = "WATERMARK";
/// Where a rebuilt index is made before it replaces the old one.
pub(crate) const INDEX_NEW_DIR: &str = "index.new";
/// The old index while a rebuilt one is swapped in.
pub(crate) const INDEX_OLD_DIR: &str = "index.old";
/// Written last into `index.new/`: the rebuild is complete.
const COMPLETE_FILE: &str = "COMPLETE";
/// The damaged ranges set aside, one JSON object per line.
pub(crate) const DAMAGED_FILE: &str = "damaged.jsonl";
/// A quarantine copy holds at most this many bytes of a range (the bytes
/// themselves stay in the segment either way).
const QUARANTINE_COPY_MAX: u64 = 64 << 20;

/// The `FORMAT` file's text for a ledger with `salt`.
pub(crate) fn format_text(salt: &Salt) -> String {
    format!(
        "mass-ledger {FORMAT_VERSION}\nsalt {}\n",
        hex::encode(salt.bytes())
    )
}

/// Reads `FORMAT`: the version must be this build's; the salt, if its line
/// is intact (every segment header holds it too).
pub(crate) fn check_format(dir: &Path) -> Result<Option<Salt>> {
    let fmt_path = dir.join(FORMAT_FILE);
    let bytes = match fs::read(&fmt_path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(LedgerError::NotALedger {
                path: dir.to_path_buf(),
            })
        }
        Err(e) => return Err(LedgerError::io(&fmt_path, e)),
    };
    let text = String::from_utf8_lossy(&bytes);
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("").trim();
    if first != format!("mass-ledger {FORMAT_VERSION}") {
        let found = first.strip_prefix("mass-ledger ").unwrap_or(first);
        return Err(LedgerError::UnsupportedFormat {
            path: fmt_path,
            found: found.chars().take(40).collect(),
            supported: FORMAT_VERSION,
        });
    }
    let salt = lines
        .find_map(|l| l.strip_prefix("salt "))
        .and_then(|h| hex::decode(h.trim()).ok())
        .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
        .map(Salt::from_bytes);
    Ok(salt)
}

/// The ledger's salt. Segment headers carry a checksum and `FORMAT` does
/// not, so the salt the intact segment headers name wins (the one most of
/// them name, should they disagree); `FORMAT`'s only when no header copy is
/// intact.
pub(crate) fn resolve_salt(
    dir: &Path,
    seg_dir: &Path,
    segs: &[u32],
    from_format: Option<Salt>,
) -> Result<Salt> {
    let mut votes: Vec<([u8; 32], usize)> = Vec::new();
    for &seg in segs {
        let path = segment::segment_path(seg_dir, seg);
        let f = File::open(&path).map_err(|e| LedgerError::io(&path, e))?;
        if let Ok(HeaderRead::Ok(h)) = segment::read_header(&f, seg, None) {
            match votes.iter_mut().find(|(s, _)| *s == h.salt) {
                Some(v) => v.1 += 1,
                None => votes.push((h.salt, 1)),
            }
        }
    }
    if let Some((salt, _)) = votes.iter().max_by_key(|(_, n)| *n) {
        return Ok(Salt::from_bytes(*salt));
    }
    from_format.ok_or_else(|| LedgerError::CorruptLog {
        path: dir.join(FORMAT_FILE),
        offset: 0,
        detail: "the ledger's salt is unreadable in FORMAT and in every segment header; \
                 restore FORMAT from a backup"
            .into(),
    })
}

/// The segment numbers, which must run without gaps: a missing segment in
/// the middle is lost data, reported rather than read around.
pub(crate) fn list_segments_checked(seg_dir: &Path) -> Result<Vec<u32>> {
    let segs = segment::list_segments(seg_dir)?;
    let Some(&first) = segs.first() else {
        return Err(LedgerError::LogBehindIndex {
            detail: format!("{} holds no segment files", seg_dir.display()),
        });
    };
    for (i, &s) in segs.iter().enumerate() {
        let want = first + i as u32;
        if s != want {
            return Err(LedgerError::LogBehindIndex {
                detail: format!(
                    "segment {want} is missing from {} (found {} next); restore it from a backup",
                    seg_dir.display(),
                    s
                ),
            });
        }
    }
    Ok(segs)
}

/// What segment headers prove: each names the committed end of the
/// segment before it.
pub(crate) fn header_evidence(
    seg_dir: &Path,
    segs: &[u32],
    salt: &Salt,
    ev: &mut Evidence,
) -> Result<()> {
    for &seg in segs.iter().filter(|&&s| s > 1) {
        let path = segment::segment_path(seg_dir, seg);
        let f = File::open(&path).map_err(|e| LedgerError::io(&path, e))?;
        let h = segment::read_header(&f, seg, Some(salt)).map_err(|e| LedgerError::io(&path, e))?;
        if let HeaderRead::Ok(h) = h {
            ev.note(seg - 1, h.prev_end, format!("the header of segment {seg}"));
        }
    }
    Ok(())
}

/// `struct flock` for an OFD lock over the whole file.
fn whole_file(kind: libc::c_short) -> libc::flock {
    // SAFETY: `flock` is a plain C struct; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl
}

/// Takes the writer's lock: an open-file-description lock on `LOCK` (held
/// until the file is closed, also when the process dies), so that readers
/// can ask whether a writer is alive without taking it.
pub(crate) fn take_lock(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| LedgerError::io(&path, e))?;
    let fl = whole_file(libc::F_WRLCK as libc::c_short);
    // SAFETY: fcntl on an fd we own with a valid `flock`.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) {
            let mut s = String::new();
            let _ = f.read_to_string(&mut s);
            let pid = s.trim().to_string();
            return Err(LedgerError::Locked {
                path: dir.to_path_buf(),
                pid: if pid.is_empty() {
                    "unknown".into()
                } else {
                    pid
                },
            });
        }
        return Err(LedgerError::io(&path, e));
    }
    f.set_len(0)
        .and_then(|_| f.write_all(format!("{}\n", std::process::id()).as_bytes()))
        .map_err(|e| LedgerError::io(&path, e))?;
    Ok(f)
}

/// True while some process holds the writer's lock.
pub(crate) fn writer_alive(dir: &Path) -> bool {
    let Ok(f) = File::open(dir.join(LOCK_FILE)) else {
        return false;
    };
    let mut fl = whole_file(libc::F_WRLCK as libc::c_short);
    // SAFETY: fcntl on an fd we own with a valid `flock`.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    r == 0 && fl.l_type != libc::F_UNLCK as libc::c_short
}

/// The writer's watermark: after each `fdatasync` it writes the durable
/// end of the log here, in place (a reader sees the old value or the new
/// one; a torn read fails the check and is read again). Readers stop there
/// while the writer is alive, so they never return what was not durable;
/// and since a value is written only once the log is durable up to it, it
/// is evidence for everyone of what was committed. Keyed with the salt, so
/// a copied file from another ledger proves nothing.
pub(crate) struct Watermark {
    file: File,
    salt: Salt,
}

const WATERMARK_MAGIC: &[u8; 8] = b"MASS-WM2";
const WATERMARK_LEN: usize = 32;

impl Watermark {
    /// Opens (creating) the file. Its old value stays until the first
    /// `publish`: it never exceeds what is durable, so it stays true (and
    /// stays evidence, should this open fail).
    pub fn open(dir: &Path, salt: Salt) -> Result<Watermark> {
        let path = dir.join(WATERMARK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| LedgerError::io(&path, e))?;
        Ok(Watermark { file, salt })
    }

    fn encode(salt: &Salt, seg: u32, off: u64) -> [u8; WATERMARK_LEN] {
        let mut b = [0u8; WATERMARK_LEN];
        b[..8].copy_from_slice(WATERMARK_MAGIC);
        b[8..12].copy_from_slice(&seg.to_le_bytes());
        b[16..24].copy_from_slice(&off.to_le_bytes());
        let c = salt.file_check(b"mass.watermark", &b[..24]);
        b[24..].copy_from_slice(&c);
        b
    }

    /// Publishes that the log is durable up to `seg`/`off`.
    pub fn publish(&self, seg: u32, off: u64) -> std::io::Result<()> {
        self.file
            .write_all_at(&Self::encode(&self.salt, seg, off), 0)
    }

    /// Makes the last published value durable (at close).
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    /// The published durable end, if the file holds a valid one.
    pub fn read(dir: &Path, salt: &Salt) -> Option<(u32, u64)> {
        let f = File::open(dir.join(WATERMARK_FILE)).ok()?;
        for _ in 0..8 {
            let mut b = [0u8; WATERMARK_LEN];
            if f.read_exact_at(&mut b, 0).is_err() {
                return None;
            }
            let seg = u32::from_le_bytes(b[8..12].try_into().ok()?);
            let off = u64::from_le_bytes(b[16..24].try_into().ok()?);
            if b == Self::encode(salt, seg, off) {
                return Some((seg, off));
            }
            if b[..8] != *WATERMARK_MAGIC {
                return None;
            }
            // A write in progress: read again.
            std::thread::yield_now();
        }
        None
    }
}

/// The ranges listed in `quarantine/damaged.jsonl`.
pub(crate) fn read_damaged(dir: &Path) -> Result<Vec<Damage>> {
    let path = dir.join(QUARANTINE_DIR).join(DAMAGED_FILE);
    let text = match fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LedgerError::io(&path, e)),
    };
    let mut out = Vec::new();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        out.push(
            serde_json::from_slice(line).map_err(|e| LedgerError::CorruptLog {
                path: path.clone(),
                offset: i as u64 + 1,
                detail: format!("line {} is not a damaged-range record: {e}", i + 1),
            })?,
        );
    }
    Ok(out)
}

/// Writes a derived file durably through `files` (temp file, fsync,
/// rename, directory fsync).
pub(crate) fn write_derived(files: &dyn FileLayer, path: &Path, bytes: &[u8]) -> Result<()> {
    files::write_durably(files, path, bytes).map_err(|e| LedgerError::io(path, e))
}

/// Lists new ranges: each one's bytes are first copied into quarantine
/// (durably), then `damaged.jsonl` is rewritten with the old lines first
/// (the list only grows). Returns the copies' paths, relative to the ledger.
pub(crate) fn list_damage(
    dir: &Path,
    seg_dir: &Path,
    files: &dyn FileLayer,
    new: &[Damage],
) -> Result<Vec<PathBuf>> {
    let qdir = dir.join(QUARANTINE_DIR);
    files::create_dir_durably(files, &qdir).map_err(|e| LedgerError::io(&qdir, e))?;
    let mut copies = Vec::with_capacity(new.len());
    for d in new {
        copies.push(copy_to_quarantine(dir, seg_dir, files, d)?);
    }
    let mut all = read_damaged(dir)?;
    for d in new {
        if !all
            .iter()
            .any(|o| o.segment == d.segment && o.offset == d.offset)
        {
            all.push(d.clone());
        }
    }
    let mut text = String::new();
    for d in &all {
        text.push_str(&serde_json::to_string(d).map_err(LedgerError::index)?);
        text.push('\n');
    }
    write_derived(files, &qdir.join(DAMAGED_FILE), text.as_bytes())?;
    Ok(copies)
}

/// Copies a listed range's bytes (at most [`QUARANTINE_COPY_MAX`]) into a
/// new file under `quarantine/` and returns its path relative to the ledger.
fn copy_to_quarantine(
    dir: &Path,
    seg_dir: &Path,
    files: &dyn FileLayer,
    d: &Damage,
) -> Result<PathBuf> {
    let path = segment::segment_path(seg_dir, d.segment);
    let f = File::open(&path).map_err(|e| LedgerError::io(&path, e))?;
    let len = f.metadata().map_err(|e| LedgerError::io(&path, e))?.len();
    let n = d
        .len
        .min(QUARANTINE_COPY_MAX)
        .min(len.saturating_sub(d.offset));
    let mut bytes = vec![0u8; n as usize];
    f.read_exact_at(&mut bytes, d.offset)
        .map_err(|e| LedgerError::io(&path, e))?;
    let what = match d.kind {
        crate::recovery::DamageKind::Tail => "tail",
        crate::recovery::DamageKind::Header => "header",
        crate::recovery::DamageKind::Damage => "damaged",
    };
    // The content hash keeps two ranges at the same place (two crashes at
    // one offset) from overwriting each other.
    let short = &blake3::hash(&bytes).to_hex()[..12];
    let rel = PathBuf::from(QUARANTINE_DIR)
        .join(format!("{:08}-{}-{what}-{short}.bin", d.segment, d.offset));
    let full = dir.join(&rel);
    if !full.exists() {
        write_derived(files, &full, &bytes)?;
    }
    Ok(rel)
}

/// Finishes or undoes an index swap a crash interrupted: a complete
/// `index.new/` replaces `index/`; a partial one is removed; an
/// `index.old/` left by a finished swap is removed, or put back if the swap
/// never got as far as moving the new index in. Derived data only.
pub(crate) fn finish_index_swap(dir: &Path, files: &dyn FileLayer) -> Result<()> {
    let index = dir.join(INDEX_DIR);
    let new = dir.join(INDEX_NEW_DIR);
    let old = dir.join(INDEX_OLD_DIR);
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e| LedgerError::io(p, e)
    };
    if new.join(COMPLETE_FILE).exists() {
        if index.exists() && !old.exists() {
            files.rename(&index, &old).map_err(io(&index))?;
            files.sync_dir(dir).map_err(io(dir))?;
        } else if index.exists() {
            files.remove_dir_all(&index).map_err(io(&index))?;
        }
        files.rename(&new, &index).map_err(io(&new))?;
        files.sync_dir(dir).map_err(io(dir))?;
    } else if new.exists() {
        files.remove_dir_all(&new).map_err(io(&new))?;
    }
    if old.exists() {
        if index.exists() {
            files.remove_dir_all(&old).map_err(io(&old))?;
        } else {
            files.rename(&old, &index).map_err(io(&old))?;
            files.sync_dir(dir).map_err(io(dir))?;
        }
    }
    Ok(())
}

/// Marks a rebuilt `index.new/` complete (durably) and swaps it in.
pub(crate) fn swap_in_new_index(dir: &Path, files: &dyn FileLayer) -> Result<()> {
    let new = dir.join(INDEX_NEW_DIR);
    let done = new.join(COMPLETE_FILE);
    files::write_durably(files, &done, b"complete\n").map_err(|e| LedgerError::io(&done, e))?;
    finish_index_swap(dir, files)?;
    let done = dir.join(INDEX_DIR).join(COMPLETE_FILE);
    let _ = files.remove_file(&done);
    Ok(())
}
