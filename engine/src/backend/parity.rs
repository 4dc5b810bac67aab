//! Template parity: does the served model see its prompts as its training
//! data was rendered? A server renders each request with its own chat
//! template and reports the prompt's length (`usage.prompt_tokens`); the
//! trainer renders training conversations with its template and tokenizer.
//! When the two disagree on the same conversation, the model in cycle 2 is
//! served prompts unlike anything it was trained on, and nothing else
//! would say so. `[backends.NAME.serve] prompt_tokens_command` names a
//! program (trainers/count_tokens.py) that counts a request's prompt the
//! trainer's way; `mass` starts it once, hands it every live call's request
//! body as one JSON line, reads one `{"prompt_tokens": N}` line back, and
//! records the count beside the server's in the call's effect
//! ([`TrainerTokens`]). `mass report` sums them per model.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{ChildStdin, ChildStdout, Stdio};
use std::sync::Mutex;

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
/// milliseconds). It lives in its own process group under the `supervise`
/// warden, so it ends with `mass` however `mass` ends.
pub struct Counter {
    line: String,
    running: Mutex<Option<Running>>,
    /// Its standard error, for the message when it fails; removed on drop.
    log: PathBuf,
}

struct Running {
    _child: supervise::Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Counter {
    pub fn new(line: &str, backend: &str) -> Counter {
        let log = std::env::temp_dir().join(format!(
            "mass-{}-prompt-tokens-{backend}.log",
            std::process::id()
        ));
        Counter {
            line: line.to_string(),
            running: Mutex::new(None),
            log,
        }
    }

    /// Counts `model`'s request `body` (the exact bytes sent). Blocking:
    /// call it off the async threads. A failure is recorded, not raised:
    /// the call itself succeeded.
    pub fn count(&self, model: &str, body: &[u8]) -> TrainerTokens {
        let (prompt_tokens, error) = match self.ask(body) {
            Ok(n) => (Some(n), None),
            Err(e) => (None, Some(e)),
        };
        TrainerTokens {
            model: model.to_string(),
            prompt_tokens,
            error,
        }
    }

    fn ask(&self, body: &[u8]) -> Result<u64, String> {
        let mut guard = self
            .running
            .lock()
            .map_err(|_| "the prompt token counter's lock was poisoned".to_string())?;
        if guard.is_none() {
            *guard = Some(self.start()?);
        }
        let Some(r) = guard.as_mut() else {
            return Err("the prompt token counter did not start".into());
        };
        let answer = exchange(r, body);
        if answer.is_err() {
            // Started afresh on the next call: a crashed counter must not
            // leave every later call uncounted.
            *guard = None;
        }
        answer.map_err(|e| format!("{e} (its standard error: {})", self.log.display()))
    }

    fn start(&self) -> Result<Running, String> {
        let log = std::fs::File::create(&self.log)
            .map_err(|e| format!("cannot create {}: {e}", self.log.display()))?;
        let mut cmd = supervise::Command::new("bash");
        cmd.arg("-c")
            .arg(&self.line)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start prompt_tokens_command: {e}"))?;
        match (child.take_stdin(), child.take_stdout()) {
            (Some(stdin), Some(stdout)) => Ok(Running {
                _child: child,
                stdin,
                stdout: BufReader::new(stdout),
            }),
            _ => Err("prompt_tokens_command has no standard input or output".into()),
        }
    }
}

/// One request line out, one answer line back.
fn exchange(r: &mut Running, body: &[u8]) -> Result<u64, String> {
    // A request body is one line of compact JSON; the check keeps a
    // pretty-printed body from desynchronising the protocol.
    if body.contains(&b'\n') {
        return Err("the request body holds a newline".into());
    }
    r.stdin
        .write_all(body)
        .and_then(|_| r.stdin.write_all(b"\n"))
        .and_then(|_| r.stdin.flush())
        .map_err(|e| format!("prompt_tokens_command stopped reading: {e}"))?;
    let mut line = String::new();
    let n = r
        .stdout
        .read_line(&mut line)
        .map_err(|e| format!("cannot read prompt_tokens_command's answer: {e}"))?;
    if n == 0 {
        return Err("prompt_tokens_command exited".into());
    }
    let v: serde_json::Value = serde_json::from_str(line.trim())
        .map_err(|e| format!("prompt_tokens_command answered something not JSON ({e})"))?;
    if let Some(n) = v["prompt_tokens"].as_u64() {
        return Ok(n);
    }
    match v["error"].as_str() {
        Some(e) => Err(format!("prompt_tokens_command: {e}")),
        None => Err("prompt_tokens_command's answer has no \"prompt_tokens\" count".into()),
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        if let Ok(mut g) = self.running.lock() {
            // Dropping the child stops its tree (supervise).
            g.take();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}
