//! The comparisons JSONL format: accepted input and the exact error messages.

use rank::bt::{fit_named, Comparison, FitOptions, Outcome, Prior};
use rank::jsonl::{parse_comparisons, parse_comparisons_reader, Parsed};
use rank::{LineProblem, RankError};

fn msg(input: &str) -> String {
    parse_comparisons(input).unwrap_err().to_string()
}

#[test]
fn parses_items_in_first_seen_order() {
    let input = "\
{\"a\": \"run-3\", \"b\": \"run-1\", \"winner\": \"a\"}

{\"a\": \"run-1\", \"b\": \"run-2\", \"winner\": \"tie\", \"rationale\": \"both fine\"}
   \t
{\"b\": \"run-3\", \"a\": \"run-2\", \"winner\": \"b\"}
";
    let p = parse_comparisons(input).unwrap();
    assert_eq!(p.items, ["run-3", "run-1", "run-2"]);
    assert_eq!(
        p.comparisons,
        [
            Comparison {
                a: 0,
                b: 1,
                outcome: Outcome::AWins
            },
            Comparison {
                a: 1,
                b: 2,
                outcome: Outcome::Tie
            },
            Comparison {
                a: 2,
                b: 0,
                outcome: Outcome::BWins
            },
        ]
    );
}

#[test]
fn empty_input_is_empty() {
    assert_eq!(parse_comparisons("").unwrap(), Parsed::default());
    assert_eq!(parse_comparisons("\n\n  \n").unwrap(), Parsed::default());
}

#[test]
fn crlf_bom_and_unicode_names() {
    let input = "\u{feff}{\"a\":\"Ünïcode 🚀\",\"b\":\"x\",\"winner\":\"b\"}\r\n{\"a\":\"x\",\"b\":\"Ünïcode 🚀\",\"winner\":\"a\"}\r\n";
    let p = parse_comparisons(input).unwrap();
    assert_eq!(p.items, ["Ünïcode 🚀", "x"]);
    assert_eq!(p.comparisons.len(), 2);
}

#[test]
fn reader_matches_str() {
    let input = "{\"a\":\"p\",\"b\":\"q\",\"winner\":\"a\"}\n\n{\"a\":\"q\",\"b\":\"r\",\"winner\":\"tie\"}";
    assert_eq!(
        parse_comparisons_reader(input.as_bytes()).unwrap(),
        parse_comparisons(input).unwrap()
    );
    // Line numbers count blank lines in both.
    let bad = "\n\n{\"a\":1}";
    assert_eq!(
        parse_comparisons_reader(bad.as_bytes()).unwrap_err(),
        parse_comparisons(bad).unwrap_err()
    );
}

#[test]
fn invalid_utf8_through_the_reader_is_an_io_error() {
    let bytes: &[u8] = b"{\"a\":\"p\",\"b\":\"q\",\"winner\":\"a\"}\n\xff\xfe\n";
    match parse_comparisons_reader(bytes).unwrap_err() {
        RankError::Io { line, .. } => assert_eq!(line, 2),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn error_messages_name_the_line_and_the_expectation() {
    let ok = "{\"a\":\"p\",\"b\":\"q\",\"winner\":\"a\"}\n";
    let at7 = |bad: &str| format!("{}{}{bad}\n", ok.repeat(5), "\n");
    assert_eq!(
        msg(&at7(r#"{"a":"p","b":"q","winner":"x"}"#)),
        r#"line 7: field "winner" must be "a", "b" or "tie", got "x""#
    );
    assert_eq!(
        msg(&at7(r#"{"a":"p","b":"q","winner":"A"}"#)),
        r#"line 7: field "winner" must be "a", "b" or "tie", got "A""#
    );
    assert_eq!(
        msg(&at7(r#"{"a":"p","b":"q","winner":1}"#)),
        r#"line 7: field "winner" must be "a", "b" or "tie", got a number"#
    );
    assert_eq!(
        msg(&at7(r#"{"a":"p","b":"q"}"#)),
        r#"line 7: missing field "winner""#
    );
    assert_eq!(
        msg(&at7(r#"{"b":"q","winner":"a"}"#)),
        r#"line 7: missing field "a""#
    );
    assert_eq!(
        msg(&at7(r#"{"a":"p","b":null,"winner":"a"}"#)),
        r#"line 7: field "b" must be a string, got null"#
    );
    assert_eq!(
        msg(&at7(r#"{"a":["p"],"b":"q","winner":"a"}"#)),
        r#"line 7: field "a" must be a string, got an array"#
    );
    assert_eq!(
        msg(&at7(r#"{"a":"","b":"q","winner":"a"}"#)),
        r#"line 7: field "a" must be a non-empty string"#
    );
    assert_eq!(
        msg(&at7(r#"{"a":"p","b":"p","winner":"a"}"#)),
        r#"line 7: fields "a" and "b" name the same item "p""#
    );
    assert_eq!(
        msg(&at7(r#"["p","q","a"]"#)),
        "line 7: expected a JSON object, got an array"
    );
    assert!(msg(&at7(r#"{"a":"p","b":"q","winner":"a""#)).starts_with("line 7: invalid JSON: "));
    // Two objects on one line is not JSON Lines.
    assert!(msg(&at7(&ok.trim_end().repeat(2))).starts_with("line 7: invalid JSON: "));
}

#[test]
fn errors_are_structured() {
    match parse_comparisons("{\"a\":\"p\",\"b\":\"q\",\"winner\":\"draw\"}").unwrap_err() {
        RankError::Line { line, problem } => {
            assert_eq!(line, 1);
            assert_eq!(problem, LineProblem::BadWinner { got: "draw".into() });
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn garbage_never_panics() {
    let samples = [
        "\0", "{", "}", "null", "1e999", "\"str\"", "{\"a\":{}}", "{\"a\":\"x\",\"b\":\"y\",\"winner\":\"tie\",\"winner\":\"a\"}",
        "{\"a\":\"\\ud800\",\"b\":\"y\",\"winner\":\"a\"}", "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
    ];
    for s in samples {
        let _ = parse_comparisons(s);
        let _ = parse_comparisons_reader(s.as_bytes());
    }
    // Deep nesting beyond serde_json's recursion limit is an error, not a crash.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(parse_comparisons(&deep).is_err());
}

#[test]
fn parsed_file_feeds_the_fit_with_names_in_errors() {
    let input = "\
{\"a\":\"alpha\",\"b\":\"beta\",\"winner\":\"a\"}
{\"a\":\"beta\",\"b\":\"gamma\",\"winner\":\"a\"}
{\"a\":\"gamma\",\"b\":\"alpha\",\"winner\":\"b\"}
";
    let p = parse_comparisons(input).unwrap();
    let f = fit_named(&p.items, &p.comparisons, &FitOptions::default()).unwrap();
    assert_eq!(p.items[f.by_rank()[0].item], "alpha");
    let mle = FitOptions {
        prior: Prior::None,
        ..FitOptions::default()
    };
    let err = fit_named(&p.items, &p.comparisons, &mle).unwrap_err();
    assert_eq!(
        err.to_string(),
        "maximum-likelihood fit does not exist: item \"alpha\" (index 0) never lost to any other item, so the scores diverge (use a prior)"
    );
}
