//! Template parity: does the served model see its prompts as its training
//! data was rendered? A server renders each request with its own chat
//! template and reports the prompt's length (`usage.prompt_tokens`); the
//! trainer renders training conversations with its template and tokenizer.
//! When the two disagree on the same conversation, the model in cycle 2 is
//! served prompts unlike anything it was trained on, and nothing else
//! would say so. `[backends.NAME.serve] prompt_tokens_command` names a
//! program (trainers/count_tokens.py) that counts a request's prompt the
//! trainer's way; `mass` starts it on the first live call (again if it
//! broke), hands it every live call's request body as one JSON line, reads
//! one `{"prompt_tokens": N}` line back, and
//! records the count beside the server's in the call's effect
//! ([`TrainerTokens`]). `mass report` sums them per model.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{ChildStdin, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What the trainer's side counted for one live call, recorded in the
/// call's effect output as `trainer_tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainerTokens {
    /// The model the call was made to (the base model or an adapter).
    pub model: String,
    /// The prompt's tokens as the trainer renders and tokenizes it; absent
    /// when counting failed (`error` says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The counting program, started on first use and kept for the backend's
/// lifetime (loading a tokenizer takes seconds; counting one prompt, a few
/// milliseconds), and started afresh after it broke (exited, stopped
/// answering within the backend's timeout, or answered garbage). It lives
/// in its own process group under the `supervise` warden, so it ends with
/// `mass` however `mass` ends.
pub struct Counter {
    line: String,
    limit: Duration,
    running: Mutex<Option<Running>>,
    /// Its standard error (appended across restarts); removed on drop
    /// unless it broke, then kept and named on stderr.
    log: PathBuf,
    broke: AtomicBool,
}

struct Running {
    _child: supervise::Child,
    stdin: ChildStdin,
    /// Its answer lines, read on a thread of their own so that a counter
    /// that stops answering costs a timeout, not the run.
    answers: Receiver<std::io::Result<String>>,
}

/// Why a count failed: the counter refused this request (it stays), or
/// the counter broke (it is started afresh on the next call).
enum Failure {
    Refused(String),
    Broken(String),
}

/// Distinguishes the logs of counters of the same backend name in one
/// process (a worker's two contexts, a fork's rebuilt backend).
static NEXT: AtomicU64 = AtomicU64::new(0);

impl Counter {
    /// `limit`: how long one answer may take (the first includes the
    /// counter's start: loading its tokenizer).
    pub fn new(line: &str, backend: &str, limit: Duration) -> Counter {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let log = std::env::temp_dir().join(format!(
            "mass-prompt-tokens-{}-{n}-{backend}.log",
            std::process::id()
        ));
        Counter {
            line: line.to_string(),
            limit,
            running: Mutex::new(None),
            log,
            broke: AtomicBool::new(false),
        }
    }

    /// Counts `model`'s request `body` (the exact bytes sent). Blocking:
    /// call it off the async threads. A failure is recorded, not raised:
    /// the call itself succeeded. The recorded error never names this
    /// process's files (a count that failed must not make two runs differ
    /// by a path); the log is named on stderr instead.
    pub fn count(&self, model: &str, body: &[u8]) -> TrainerTokens {
        let (prompt_tokens, error) = match self.ask(body) {
            Ok(n) => (Some(n), None),
            Err(Failure::Refused(e)) => (None, Some(e)),
            Err(Failure::Broken(e)) => {
                self.broke.store(true, Ordering::Relaxed);
                eprintln!(
                    "mass: prompt_tokens_command: {e} (its standard error: {})",
                    self.log.display()
                );
                (None, Some(e))
            }
        };
        TrainerTokens {
            model: model.to_string(),
            prompt_tokens,
            error,
        }
    }

    fn ask(&self, body: &[u8]) -> Result<u64, Failure> {
        // A request body is one line of compact JSON; a pretty-printed one
        // would desynchronise the protocol.
        if body.contains(&b'\n') {
            return Err(Failure::Refused("the request body holds a newline".into()));
        }
        let mut guard = self
            .running
            .lock()
            .map_err(|_| Failure::Broken("the prompt token counter's lock was poisoned".into()))?;
        if guard.is_none() {
            *guard = Some(self.start().map_err(Failure::Broken)?);
        }
        let Some(r) = guard.as_mut() else {
            return Err(Failure::Broken(
                "the prompt token counter did not start".into(),
            ));
        };
        let answer = exchange(r, body, self.limit);
        if let Err(Failure::Broken(_)) = answer {
            // Dropping it stops its tree; the next call starts it afresh.
            *guard = None;
        }
        answer
    }

    fn start(&self) -> Result<Running, String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("cannot open its log: {e}"))?;
        let mut cmd = supervise::Command::new("bash");
        cmd.arg("-c")
            .arg(&self.line)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = cmd.spawn().map_err(|e| format!("cannot start: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.take_stdin(), child.take_stdout()) else {
            return Err("it has no standard input or output".into());
        };
        let (tx, answers) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout);
            loop {
                let mut line = String::new();
                let got = lines.read_line(&mut line).map(|n| (n, line));
                let end = !matches!(got, Ok((n, _)) if n > 0);
                if tx.send(got.map(|(_, l)| l)).is_err() || end {
                    return;
                }
            }
        });
        Ok(Running {
            _child: child,
            stdin,
            answers,
        })
    }
}

/// One request line out, one answer line back within `limit`.
fn exchange(r: &mut Running, body: &[u8], limit: Duration) -> Result<u64, Failure> {
    r.stdin
        .write_all(body)
        .and_then(|_| r.stdin.write_all(b"\n"))
        .and_then(|_| r.stdin.flush())
        .map_err(|e| Failure::Broken(format!("it stopped reading requests: {e}")))?;
    let line = match r.answers.recv_timeout(limit) {
        Ok(Ok(line)) if !line.is_empty() => line,
        Ok(Ok(_)) | Err(RecvTimeoutError::Disconnected) => {
            return Err(Failure::Broken("it exited".into()))
        }
        Ok(Err(e)) => return Err(Failure::Broken(format!("cannot read its answer: {e}"))),
        Err(RecvTimeoutError::Timeout) => {
            return Err(Failure::Broken(format!(
                "it did not answer within {} s",
                limit.as_secs()
            )))
        }
    };
    let v: serde_json::Value = serde_json::from_str(line.trim())
        .map_err(|e| Failure::Broken(format!("it answered something not JSON ({e})")))?;
    if let Some(n) = v["prompt_tokens"].as_u64() {
        return Ok(n);
    }
    match v["error"].as_str() {
        Some(e) => Err(Failure::Refused(format!("prompt_tokens_command: {e}"))),
        None => Err(Failure::Broken(
            "its answer has no \"prompt_tokens\" count".into(),
        )),
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        if let Ok(mut g) = self.running.lock() {
            // Dropping the child stops its tree (supervise).
            g.take();
        }
        if !*self.broke.get_mut() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
