//! The reference implementation's run folder, parsed. Formats derived from
//! SakanaAI/mass at commit 4106e7a6ce008b5ffadc7263971e8a3a20976f87
//! (`runtime/api_proxy.py`, `runtime/run_episode.sh`, `mass/pipeline.py`,
//! `mass/judging.py`) and bc75a25f0279b418f6dab817f4b8a8636edf23e9
//! (`mass/io.py`, `mass/ranking.py`, `training/prepare_sft_data.py`,
//! `docs/running.md`); none of its code is copied here.
//!
//! A run folder (`run_dir` of its config) holds `config.json` (frozen at the
//! first stage), episode folders (`logs/reference/query{Q}`,
//! `logs/search/v{K}/query{Q}_ourTeam`, `pool/runlogs/{EPISODE}` listed by
//! `pool.json`, `evaluation/logs/query{Q}_r{I}`), each with `prompt.txt`,
//! `run_status.json`, `qwen_stream.jsonl` and `api_requests.jsonl.gz` (one
//! JSON object per proxied HTTP exchange); and the stage files
//! `selection/task{Q}_matches.jsonl`, `selection/task{Q}_ranked.json`,
//! `selection/train.json`, `selection/val.json`, `training/train_log.jsonl`
//! and `selected_checkpoint.json`. This module reads them through
//! [`Root`] (no links, caps) and teaches the [`Scrubber`] every secret it
//! sees; it checks shapes, not meaning (`plan.rs` does that).

use serde_json::Value;

use crate::error::{ImportError, Result};
use crate::fsread::{lines, Kind, Root};
use crate::secrets::Scrubber;

/// A JSON value and where it came from.
#[derive(Debug, Clone)]
pub struct Row {
    pub file: String,
    pub line: usize,
    pub value: Value,
}

/// A file read whole as JSON.
#[derive(Debug, Clone)]
pub struct JsonFile {
    pub file: String,
    pub value: Value,
    pub mtime_ms: u64,
}

/// One episode folder.
#[derive(Debug, Clone)]
pub struct EpisodeFiles {
    /// The folder, relative to the run folder.
    pub dir: String,
    pub status: Option<JsonFile>,
    pub prompt: Option<String>,
    /// `qwen_stream.jsonl` without its partial-message lines (scrubbed
    /// when recorded).
    pub stream: Option<Vec<u8>>,
    /// The proxy's log, one row per exchange (`.jsonl.gz`, or `.jsonl`
    /// when the episode stopped before it was compressed).
    pub exchanges: Vec<Row>,
    /// The newest time a file of the folder was written (for records
    /// whose own lines carry no time).
    pub mtime_ms: u64,
}

/// Reads files of a run folder, learning secrets as it goes.
pub struct Reader<'a> {
    pub root: &'a Root,
    pub scrub: &'a mut Scrubber,
    /// Episode folders read so far (checked against `caps.episodes`).
    pub episodes: u64,
}

fn parse(file: &str, line: usize, bytes: &[u8]) -> Result<Value> {
    serde_json::from_slice(bytes).map_err(|e| ImportError::json(file, line, &e))
}

impl Reader<'_> {
    /// A JSON file; `None` when absent.
    pub fn json(&mut self, rel: &str) -> Result<Option<JsonFile>> {
        let Some(l) = self.root.read(rel)? else {
            return Ok(None);
        };
        self.scrub.learn_text(&l.bytes);
        let value = parse(rel, 1, &l.bytes)?;
        self.root.count(rel, cost(&value))?;
        self.scrub.learn_json(&value);
        self.scrub.check(rel)?;
        Ok(Some(JsonFile {
            file: rel.to_string(),
            value,
            mtime_ms: l.mtime_ms,
        }))
    }

    /// A JSON-lines file (blank lines skipped, numbers kept); `None` when
    /// absent.
    pub fn jsonl(&mut self, rel: &str) -> Result<Option<(Vec<Row>, u64)>> {
        let Some(l) = self.root.read(rel)? else {
            return Ok(None);
        };
        self.scrub.learn_text(&l.bytes);
        let mut rows = Vec::new();
        for item in lines(rel, &l.bytes, self.root.caps.line) {
            let (line, b) = item?;
            self.root.row(rel, line)?;
            let value = parse(rel, line, b)?;
            self.root.count(rel, cost(&value))?;
            self.scrub.learn_json(&value);
            rows.push(Row {
                file: rel.to_string(),
                line,
                value,
            });
        }
        self.scrub.check(rel)?;
        Ok(Some((rows, l.mtime_ms)))
    }

    /// The proxy log of episode folder `dir`: `api_requests.jsonl.gz`, or
    /// the plain file a stopped episode leaves.
    fn exchanges(&mut self, dir: &str) -> Result<(Vec<Row>, u64)> {
        let gz = format!("{dir}/api_requests.jsonl.gz");
        let mut rows = Vec::new();
        let scrub = &mut *self.scrub;
        let root = self.root;
        let found = root.gz_lines(&gz, |line, b| {
            scrub.learn_text(b);
            let value = parse(&gz, line, b)?;
            root.count(&gz, cost(&value))?;
            scrub.learn_json(&value);
            scrub.check(&gz)?;
            rows.push(Row {
                file: gz.clone(),
                line,
                value,
            });
            Ok(())
        })?;
        if let Some(mtime) = found {
            return Ok((rows, mtime));
        }
        let plain = format!("{dir}/api_requests.jsonl");
        Ok(self.jsonl(&plain)?.unwrap_or_default())
    }

    /// Episode folder `dir`; `None` when it does not exist.
    pub fn episode(&mut self, dir: &str) -> Result<Option<EpisodeFiles>> {
        let Some(entries) = self.root.list(dir)? else {
            return Ok(None);
        };
        // An empty folder costs nothing against the byte caps but still
        // an episode's records and objects: their number is capped.
        self.episodes += 1;
        if self.episodes > self.root.caps.episodes {
            return Err(ImportError::TooMany {
                file: dir.to_string(),
                what: "episode folders in the run folder".into(),
                cap: self.root.caps.episodes,
            });
        }
        // A link among the files the import reads is refused by name
        // when opened; one elsewhere in the folder is refused here too,
        // so nothing beneath a run is ever reached through a link.
        if let Some((name, _)) = entries.iter().find(|(_, k)| *k == Kind::Symlink) {
            return Err(ImportError::Symlink {
                file: format!("{dir}/{name}"),
            });
        }
        // Both logs present: which one the proxy finished is unknown, and
        // reading both would record every exchange twice.
        let has = |n: &str| entries.iter().any(|(e, _)| e == n);
        if has("api_requests.jsonl.gz") && has("api_requests.jsonl") {
            return Err(ImportError::io(
                &format!("{dir}/api_requests.jsonl"),
                "is next to api_requests.jsonl.gz (refused: which is the log is unclear)",
            ));
        }
        let status = self.json(&format!("{dir}/run_status.json"))?;
        if let Some(f) = &status {
            // A time the reference writes with `date -u`; anything else
            // (a year past 9999, a word) is named, not silently replaced
            // by the file's time.
            for k in ["started_at", "finished_at"] {
                if let Some(v) = f.value.get(k).filter(|v| !v.is_null()) {
                    if v.as_str().and_then(crate::objects::iso_ms).is_none() {
                        let why =
                            format!("{k:?} is not a time YYYY-MM-DDTHH:MM:SSZ (years 1970-9999)");
                        return Err(ImportError::invalid(&f.file, 1, why));
                    }
                }
            }
        }
        let prompt = match self.root.read(&format!("{dir}/prompt.txt"))? {
            Some(l) => {
                self.scrub.learn_text(&l.bytes);
                self.scrub.check(&format!("{dir}/prompt.txt"))?;
                Some(String::from_utf8_lossy(&l.bytes).into_owned())
            }
            None => None,
        };
        let stream_rel = format!("{dir}/qwen_stream.jsonl");
        let stream = match self.root.read(&stream_rel)? {
            Some(l) => {
                self.scrub.learn_text(&l.bytes);
                self.scrub.check(&stream_rel)?;
                Some(trace(&stream_rel, &l.bytes, self.root.caps.line)?)
            }
            None => None,
        };
        let (exchanges, log_mtime) = self.exchanges(dir)?;
        let mtime_ms = status.as_ref().map_or(0, |s| s.mtime_ms).max(log_mtime);
        Ok(Some(EpisodeFiles {
            dir: dir.to_string(),
            status,
            prompt,
            stream,
            exchanges,
            mtime_ms,
        }))
    }

    /// The names of the subfolders of `rel` (none when it is absent); a
    /// link there is refused.
    pub fn subdirs(&mut self, rel: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for (name, kind) in self.root.list(rel)?.unwrap_or_default() {
            match kind {
                Kind::Dir => out.push(name),
                Kind::Symlink => {
                    return Err(ImportError::Symlink {
                        file: format!("{rel}/{name}"),
                    })
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

/// The trace as recorded: each line checked (a damaged trace is named, not
/// kept), the partial-message lines (`"type": "stream_event"`, one token
/// each) left out. A key the model echoed token by token lies in those in
/// pieces no learnt secret matches; the whole message that follows them
/// holds it whole, so scrubbed.
fn trace(rel: &str, bytes: &[u8], cap: u64) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(bytes.len());
    for item in lines(rel, bytes, cap) {
        let (line, b) = item?;
        let v = parse(rel, line, b)?;
        if v.get("type").and_then(Value::as_str) == Some("stream_event") {
            continue;
        }
        out.extend_from_slice(b);
        out.push(b'\n');
    }
    Ok(out)
}

/// `value[key]` as a string, or an error naming the file and line.
pub fn str_field<'v>(row: &'v Row, key: &str) -> Result<&'v str> {
    row.value.get(key).and_then(Value::as_str).ok_or_else(|| {
        ImportError::invalid(&row.file, row.line, format!("no string field {key:?}"))
    })
}

/// The rows of a JSON file that must be a list of objects, moved out of
/// it (never copied), each counted against the folder's row cap.
pub fn list_rows(root: &Root, f: &mut JsonFile) -> Result<Vec<Row>> {
    let Value::Array(items) = std::mem::take(&mut f.value) else {
        return Err(ImportError::invalid(&f.file, 1, "expected a JSON list"));
    };
    // A JSON file's rows are numbered by position in the list (1-based),
    // which is what its error messages call the "line".
    let mut out = Vec::with_capacity(items.len());
    for (i, value) in items.into_iter().enumerate() {
        root.row(&f.file, i + 1)?;
        out.push(Row {
            file: f.file.clone(),
            line: i + 1,
            value,
        });
    }
    Ok(out)
}

/// About what a parsed value holds in memory (a `Value` is 32 bytes, a
/// map entry more), counted against the folder's total cap: parsed JSON
/// costs many times its text, which the byte caps alone do not see.
fn cost(v: &Value) -> u64 {
    32 + match v {
        Value::String(s) => s.len() as u64,
        Value::Array(a) => a.iter().map(cost).sum(),
        Value::Object(m) => m.iter().map(|(k, x)| 48 + k.len() as u64 + cost(x)).sum(),
        _ => 0,
    }
}
