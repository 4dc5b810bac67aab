//! The template parity counter (`serve.prompt_tokens_command`) against
//! counting programs that behave and that do not: one that answers, one
//! that dies on a request (the next call starts it afresh), one that
//! answers garbage, one that reports its own error. A failure is recorded
//! with the call, never taken for a count.

use std::time::Duration;

use engine::backend::parity::Counter;

const LIMIT: Duration = Duration::from_secs(30);

/// A counter that answers the number of messages times ten, dies on a
/// request whose first message says "die", and prints garbage for "junk".
const SCRIPT: &str = r#"python3 -c '
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    first = req["messages"][0]["content"]
    if first == "die":
        sys.exit(3)
    if first == "junk":
        print("not json", flush=True)
        continue
    if first == "refuse":
        print(json.dumps({"error": "cannot render"}), flush=True)
        continue
    print(json.dumps({"prompt_tokens": 10 * len(req["messages"])}), flush=True)
'"#;

fn body(first: &str, n: usize) -> Vec<u8> {
    let mut msgs = vec![serde_json::json!({"role": "user", "content": first})];
    for _ in 1..n {
        msgs.push(serde_json::json!({"role": "user", "content": "more"}));
    }
    serde_json::to_vec(&serde_json::json!({"model": "m", "messages": msgs})).unwrap()
}

#[test]
fn counts_survive_a_crashing_and_a_lying_counter() {
    let c = Counter::new(SCRIPT, "parity-test", LIMIT);
    let ok = c.count("m", &body("hello", 3));
    assert_eq!(
        (ok.model.as_str(), ok.prompt_tokens, ok.error),
        ("m", Some(30), None)
    );
    let died = c.count("m", &body("die", 1));
    assert_eq!(died.prompt_tokens, None);
    assert!(
        died.error.as_deref().unwrap_or("").contains("exited"),
        "{died:?}"
    );
    // Started afresh: the crash does not leave later calls uncounted.
    assert_eq!(c.count("m+c1", &body("again", 2)).prompt_tokens, Some(20));
    let junk = c.count("m", &body("junk", 1));
    assert!(
        junk.error.as_deref().unwrap_or("").contains("not JSON"),
        "{junk:?}"
    );
    let refused = c.count("m", &body("refuse", 1));
    assert!(
        refused
            .error
            .as_deref()
            .unwrap_or("")
            .contains("cannot render"),
        "{refused:?}"
    );
    assert_eq!(c.count("m", &body("fine", 1)).prompt_tokens, Some(10));
    // A body with a newline would desynchronise the line protocol.
    let two_lines = c.count("m", b"{\"messages\":\n[]}");
    assert!(two_lines.error.is_some() && two_lines.prompt_tokens.is_none());
}

#[test]
fn a_counter_that_cannot_start_is_an_error_on_each_call() {
    let c = Counter::new("exec /nonexistent/count-tokens", "parity-missing", LIMIT);
    for _ in 0..2 {
        let t = c.count("m", &body("hello", 1));
        assert_eq!(t.prompt_tokens, None);
        assert!(t.error.is_some(), "{t:?}");
    }
}

/// A counter that reads the request and never answers costs the call a
/// timeout, not the run; the next call starts it afresh.
#[test]
fn a_counter_that_stops_answering_times_out() {
    let c = Counter::new(
        "read -r line; sleep 600",
        "parity-silent",
        Duration::from_secs(1),
    );
    let started = std::time::Instant::now();
    let t = c.count("m", &body("hello", 1));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(t.prompt_tokens, None);
    assert!(
        t.error
            .as_deref()
            .unwrap_or("")
            .contains("did not answer within 1 s"),
        "{t:?}"
    );
    assert!(
        !t.error.as_deref().unwrap_or("").contains("/tmp"),
        "a path in the record: {t:?}"
    );
}
