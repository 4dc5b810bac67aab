//! Rendering ledger objects for people (text) and programs (JSON), and the
//! writer every command's output goes through ([`stdout`], [`Out`]), which
//! notices a reader that went away (`mass log | head`).

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use ledger::{Event, Ledger, Meta};
use serde_json::{json, Value};

/// Set once a write to a command's own output (standard output, or the
/// file `--out` names, e.g. /dev/stdout or a FIFO) failed because its reader
/// closed it. `main` exits quietly on a broken pipe only when this is set,
/// so a broken pipe anywhere else (a socket to a model server, a child's
/// stdin) is still reported as an error.
static CLOSED_BY_READER: AtomicBool = AtomicBool::new(false);

/// Whether a command's output was closed by its reader (see [`Out`]).
pub fn closed_by_reader() -> bool {
    CLOSED_BY_READER.load(Ordering::SeqCst)
}

/// The exit code a command decided on before printing its result.
static DECIDED: AtomicU8 = AtomicU8::new(0);

/// Records the exit code a command has decided on before it prints, and
/// returns it: a reader that stops early must not turn a decided failure
/// into success (`mass verify | head` still exits 3 on a damaged ledger,
/// `mass sandbox -- false | true` still exits 1).
pub fn decide(code: u8) -> ExitCode {
    DECIDED.store(code, Ordering::SeqCst);
    ExitCode::from(code)
}

/// The code [`decide`] recorded (0 when none): `main`'s exit code when the
/// reader closed the output.
pub fn decided() -> u8 {
    DECIDED.load(Ordering::SeqCst)
}

/// A command's output: writes pass through unchanged, and a broken pipe is
/// noted (see [`closed_by_reader`]) before the error goes back to the
/// command, which stops as on any write error. Rust ignores SIGPIPE, so a
/// closed reader shows up here as EPIPE rather than killing the process
/// mid-write of a ledger; `main` then exits 0 without a message, as `cat`
/// or `git log` piped into `head` do.
pub struct Out<W: Write>(pub W);

impl<W: Write> Out<W> {
    fn note<T>(r: std::io::Result<T>) -> std::io::Result<T> {
        if let Err(e) = &r {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                CLOSED_BY_READER.store(true, Ordering::SeqCst);
            }
        }
        r
    }
}

impl<W: Write> Write for Out<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Self::note(self.0.write(buf))
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        Self::note(self.0.write_all(buf))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Self::note(self.0.flush())
    }
}

/// Standard output, locked, for a command's results. Commands write to it
/// (or use [`outln!`]) instead of `println!`, which panics on a closed pipe.
pub fn stdout() -> Out<std::io::StdoutLock<'static>> {
    Out(std::io::stdout().lock())
}

/// `println!` for command output: writes through [`stdout`] and returns the
/// write's `io::Result` for `?`, instead of panicking when the reader is gone.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!($crate::output::stdout(), $($arg)*)
    }};
}
pub(crate) use outln;

/// The JSON view of an event: ids as 64 hex digits, payload decoded by schema.
pub fn event_json(ev: &Event, meta: Option<&Meta>) -> Value {
    let (payload, payload_error) = match schemas::describe(&ev.kind, ev.version, &ev.payload) {
        Ok(v) => (v, None),
        Err(e) => (Value::Null, Some(e.to_string())),
    };
    let mut v = json!({
        "id": ev.id.to_hex(),
        "kind": ev.kind,
        "version": ev.version,
        "stream": ev.stream,
        "seq": ev.seq,
        "prev": ev.prev.map(|p| p.to_hex()),
        "parents": ev.parents.iter().map(|p| p.to_hex()).collect::<Vec<_>>(),
        "refs": ev.refs.iter().map(|p| p.to_hex()).collect::<Vec<_>>(),
        "payload": payload,
    });
    if let Some(err) = payload_error {
        v["payload_error"] = json!(err);
        v["payload_hex"] = json!(hex::encode(&ev.payload));
    }
    if let Some(m) = meta {
        v["meta"] = serde_json::to_value(m).unwrap_or(Value::Null);
    }
    v
}

/// Event JSON with its metadata read from the ledger (metadata errors are shown, not fatal).
pub fn event_json_with_meta(l: &Ledger, ev: &Event) -> Value {
    match l.get_meta(&ev.id) {
        Ok(m) => event_json(ev, Some(&m)),
        Err(e) => {
            let mut v = event_json(ev, None);
            v["meta_error"] = json!(e.to_string());
            v
        }
    }
}

/// One line per event for `mass log`.
pub fn event_line(ev: &Event) -> String {
    format!(
        "{}  {:<22} {}#{}",
        ev.id.short(12),
        ev.kind,
        ev.stream,
        ev.seq
    )
}

/// Formats milliseconds since the epoch as UTC ISO-8601.
pub fn iso_time(ms: u64) -> String {
    let secs = (ms / 1000) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// Human-readable byte counts.
pub fn bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_time_known_values() {
        assert_eq!(iso_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_time(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(iso_time(1_795_000_000_000), "2026-11-18T11:06:40.000Z"); // python3: datetime.utcfromtimestamp(1795000000)
    }
}
