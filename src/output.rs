//! Rendering ledger objects for people (text) and programs (JSON).

use ledger::{Event, Ledger, Meta};
use serde_json::{json, Value};

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
