//! Readable differences between two JSON values, for divergence reports.
//!
//! Requests are compared in their canonical JSON form. Leaves that are object
//! ids (64 hex digits) are expanded through a lookup, so a diff of two model
//! requests says which message differs and how, not just that two hashes differ.

use serde_json::Value;

/// Lists differing paths (`$.a.b[2]: old -> new`), at most `limit` lines.
pub fn json_diff(
    a: &Value,
    b: &Value,
    expand: &dyn Fn(&str) -> Option<Value>,
    limit: usize,
) -> Vec<String> {
    let mut out = Vec::new();
    walk("$", a, b, expand, &mut out, limit, 0);
    if out.len() >= limit {
        out.truncate(limit);
        out.push("... (more differences)".into());
    }
    out
}

fn walk(
    path: &str,
    a: &Value,
    b: &Value,
    expand: &dyn Fn(&str) -> Option<Value>,
    out: &mut Vec<String>,
    limit: usize,
    depth: usize,
) {
    if out.len() >= limit || a == b {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => walk(&p, u, v, expand, out, limit, depth),
                    (Some(u), None) => out.push(format!("{p}: {} -> (absent)", short(u))),
                    (None, Some(v)) => out.push(format!("{p}: (absent) -> {}", short(v))),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            for i in 0..x.len().max(y.len()) {
                let p = format!("{path}[{i}]");
                match (x.get(i), y.get(i)) {
                    (Some(u), Some(v)) => walk(&p, u, v, expand, out, limit, depth),
                    (Some(u), None) => out.push(format!("{p}: {} -> (absent)", short(u))),
                    (None, Some(v)) => out.push(format!("{p}: (absent) -> {}", short(v))),
                    (None, None) => {}
                }
            }
        }
        (Value::String(x), Value::String(y)) if depth < 3 && is_id(x) && is_id(y) => {
            match (expand(x), expand(y)) {
                (Some(u), Some(v)) => {
                    walk(&format!("{path}@"), &u, &v, expand, out, limit, depth + 1)
                }
                _ => out.push(format!("{path}: {} -> {}", &x[..12], &y[..12])),
            }
        }
        (Value::String(x), Value::String(y))
            if x.chars().count() > 120 || y.chars().count() > 120 =>
        {
            out.push(format!("{path}: {}", long_strings(x, y)))
        }
        _ => out.push(format!("{path}: {} -> {}", short(a), short(b))),
    }
}

fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|c| c.is_ascii_hexdigit())
}

/// Two long strings that differ: where they start to differ, with some
/// context on each side (a prompt differs in a date deep inside, not in
/// its first hundred characters).
fn long_strings(x: &str, y: &str) -> String {
    let at = x.chars().zip(y.chars()).take_while(|(a, b)| a == b).count();
    let window = |s: &str| {
        let from = at.saturating_sub(40);
        let part: String = s.chars().skip(from).take(100).collect();
        let more = s.chars().count() > from + 100;
        format!(
            "{}{}{}",
            if from > 0 { "..." } else { "" },
            serde_json::Value::String(part),
            if more { "..." } else { "" }
        )
    };
    format!(
        "differ from char {at} ({} vs {} chars): {} -> {}",
        x.chars().count(),
        y.chars().count(),
        window(x),
        window(y)
    )
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 120 {
        let head: String = s.chars().take(117).collect();
        format!("{head}...")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_the_differing_message_and_parameter() {
        let a = json!({"model": "m", "params": {"temperature": 0.7}, "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "old"}]});
        let b = json!({"model": "m", "params": {"temperature": 0.9}, "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "new"}]});
        let d = json_diff(&a, &b, &|_| None, 10);
        assert_eq!(
            d,
            vec![
                r#"$.messages[1].content: "old" -> "new""#.to_string(),
                "$.params.temperature: 0.7 -> 0.9".to_string(),
            ]
        );
    }

    #[test]
    fn long_strings_show_where_they_differ() {
        let a = format!("{}on 2026-12-01 at noon", "x".repeat(300));
        let b = format!("{}on 2026-12-02 at noon", "x".repeat(300));
        let d = json_diff(&json!({"c": a}), &json!({"c": b}), &|_| None, 10);
        assert_eq!(d.len(), 1);
        assert!(
            d[0].starts_with("$.c: differ from char 312 (321 vs 321 chars): ..."),
            "{}",
            d[0]
        );
        assert!(
            d[0].contains("on 2026-12-01 at noon\" -> ")
                && d[0].ends_with("on 2026-12-02 at noon\""),
            "{}",
            d[0]
        );
    }

    #[test]
    fn expands_ids_through_the_lookup() {
        let x = "a".repeat(64);
        let y = "b".repeat(64);
        let lookup = |s: &str| Some(json!({"content": s[..1].to_string()}));
        let d = json_diff(
            &json!({"messages": [x]}),
            &json!({"messages": [y]}),
            &lookup,
            10,
        );
        assert_eq!(d, vec![r#"$.messages[0]@.content: "a" -> "b""#.to_string()]);
    }
}
