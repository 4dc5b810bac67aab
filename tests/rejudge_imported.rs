//! `mass rejudge IMPORTED --cycle 1 --judge FILE` through the binary,
//! against a scripted OpenAI-compatible judge: the reference's own pairs
//! judged again (each once, `a` shown first, the task's bare prompt and
//! both workspaces in the request, no planted key), the ranking and
//! selection made again from the new verdicts, what moved printed; an
//! interrupted re-judge continued by the same command to the head an
//! uninterrupted one reaches, asking only for what it had not recorded;
//! refusals (no judge file, a simulated judge, `--set`, a cycle the run
//! does not hold, a name taken) write nothing.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use import::fixture::{self, Spec};

#[path = "common/cli.rs"]
mod cli;
use cli::{mass, ok, text};

const KEY: &str = "sk-planted-REJUDGE-SECRET-0123456789abcdef";

/// A scripted judge: prefers the workspace whose `results.json` names the
/// higher episode (the reverse of the reference's ranking in the fixture);
/// answers HTTP 500 once `fail_after` verdicts were given, if set.
struct Judge {
    url: String,
    bodies: Arc<Mutex<Vec<String>>>,
    fail_after: Arc<AtomicUsize>,
    /// Milliseconds before each answer.
    delay_ms: Arc<AtomicUsize>,
    /// When set, the answer to every request ("A", "B" or "tie").
    fixed: Arc<Mutex<Option<&'static str>>>,
}

impl Judge {
    fn start() -> Judge {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/v1", l.local_addr().expect("addr"));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let fail_after = Arc::new(AtomicUsize::new(usize::MAX));
        let delay_ms = Arc::new(AtomicUsize::new(0));
        let fixed = Arc::new(Mutex::new(None));
        let (b, f, d, x) = (
            bodies.clone(),
            fail_after.clone(),
            delay_ms.clone(),
            fixed.clone(),
        );
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let (b, f, d, x) = (b.clone(), f.clone(), d.clone(), x.clone());
                std::thread::spawn(move || serve(s, &b, &f, &d, &x));
            }
        });
        Judge {
            url,
            bodies,
            fail_after,
            delay_ms,
            fixed,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.bodies.lock().expect("bodies").clone()
    }

    fn file(&self, dir: &Path) -> PathBuf {
        let p = dir.join("judge.toml");
        std::fs::write(
            &p,
            format!(
                "[backends.judge2]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"judge-2\"\nmax_retries = 0\nmax_concurrency = 2\n",
                self.url
            ),
        )
        .expect("judge file");
        p
    }
}

fn serve(
    s: TcpStream,
    bodies: &Mutex<Vec<String>>,
    fail_after: &AtomicUsize,
    delay: &AtomicUsize,
    fixed: &Mutex<Option<&'static str>>,
) {
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let mut w = s;
    loop {
        let mut len = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let body = String::from_utf8_lossy(&body).into_owned();
        let given = {
            let mut b = bodies.lock().expect("bodies");
            b.push(body.clone());
            b.len() - 1
        };
        std::thread::sleep(std::time::Duration::from_millis(
            delay.load(Ordering::SeqCst) as u64,
        ));
        let (status, reply) = if given >= fail_after.load(Ordering::SeqCst) {
            (
                "500 Internal Server Error",
                r#"{"error":"down"}"#.to_string(),
            )
        } else {
            let fixed = *fixed.lock().expect("fixed");
            (
                "200 OK",
                completion(fixed.unwrap_or_else(|| verdict(&body))),
            )
        };
        let resp = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}",
            reply.len()
        );
        if w.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

/// "A" when Workspace A's episode is the higher one, else "B".
fn verdict(body: &str) -> &'static str {
    let v: serde_json::Value = serde_json::from_str(body).expect("request JSON");
    let prompt = v["messages"][1]["content"].as_str().expect("user prompt");
    let eps: Vec<u64> = prompt
        .split("\"episode\":")
        .skip(1)
        .map(|t| {
            t.trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .expect("episode number")
        })
        .collect();
    assert_eq!(
        eps.len(),
        2,
        "both workspaces' results.json shown: {prompt}"
    );
    if eps[0] > eps[1] {
        "A"
    } else {
        "B"
    }
}

fn completion(winner: &str) -> String {
    let content =
        format!(r#"{{"winner": "{winner}", "rationale": "Workspace {winner} went further."}}"#);
    serde_json::json!({
        "id": "cmpl-judge", "object": "chat.completion", "model": "judge-2",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 900, "completion_tokens": 20}
    })
    .to_string()
}

struct Setup {
    tmp: tempfile::TempDir,
    ledger: PathBuf,
    folder: PathBuf,
}

/// A fixture run folder (key planted) imported as `ref`.
fn setup() -> Setup {
    setup_with(|_| {})
}

/// A fixture run folder (key planted), changed by `edit`, imported as `ref`.
fn setup_with(edit: impl FnOnce(&Path)) -> Setup {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ledger = tmp.path().join("ledger");
    let folder = tmp.path().join("run");
    let spec = Spec {
        key: Some(KEY.to_string()),
        ..Spec::default()
    };
    fixture::write_run(&folder, &spec).expect("fixture");
    edit(&folder);
    ok(mass(
        &ledger,
        &[
            "import",
            "sakana",
            folder.to_str().unwrap(),
            "--name",
            "ref",
        ],
    ));
    Setup {
        tmp,
        ledger,
        folder,
    }
}

fn refs(l: &Path) -> String {
    ok(mass(l, &["refs"]))
}

fn head(l: &Path, run: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_str(&ok(mass(l, &["refs", "--json"]))).expect("refs JSON");
    v.as_array()
        .expect("refs")
        .iter()
        .find(|r| r["name"] == run)
        .and_then(|r| r["head"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// The rollout id of each collected episode, by its pool index (0..4).
fn collected(l: &Path) -> Vec<String> {
    (0..4)
        .map(|i| head(l, &format!("ref/c1/query51/collect/{i:02}/orch")))
        .collect()
}

/// The selection `run` recorded: (train, validation) rollout ids.
fn selection(l: &Path, run: &str) -> (Vec<String>, Vec<String>) {
    let v: serde_json::Value =
        serde_json::from_str(&ok(mass(l, &["log", run, "--json"]))).expect("log JSON");
    let sel = v
        .as_array()
        .expect("events")
        .iter()
        .find(|e| e["kind"] == "mass.selection")
        .expect("a selection")
        .clone();
    let ids = |k: &str| -> Vec<String> {
        sel["payload"][k]
            .as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_str().expect("id").to_string())
            .collect()
    };
    (ids("train"), ids("validation"))
}

/// `mass rejudge ref --cycle 1 --judge FILE --name rj --quiet` started in
/// the background, its standard error to `stderr`.
fn spawn_rejudge(s: &Setup, judge: &Path, stderr: Stdio) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_mass"))
        .arg("--ledger")
        .arg(&s.ledger)
        .args(["rejudge", "ref", "--cycle", "1", "--judge"])
        .arg(judge)
        .args(["--name", "rj", "--quiet"])
        .env_remove("MASS_LEDGER")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn")
}

fn rejudge(s: &Setup, judge: &Path, name: &str) -> Output {
    mass(
        &s.ledger,
        &[
            "rejudge",
            "ref",
            "--cycle",
            "1",
            "--judge",
            judge.to_str().unwrap(),
            "--name",
            name,
        ],
    )
}

#[test]
fn an_imported_cycle_is_rejudged_on_the_references_pairs() {
    let s = setup();
    let j = Judge::start();
    let file = j.file(s.tmp.path());
    let source_head = head(&s.ledger, "ref");
    let out = ok(rejudge(&s, &file, "rj"));
    assert!(
        out.contains("4 comparison(s) of 1 task(s) judged by judge2 (0 served"),
        "{out}"
    );
    // The reference ranked episodes 0 > 1 > 2 > 3 and trained on 0 and 1;
    // the new judge prefers the higher episode: 3 > 2 > 1 > 0.
    assert!(
        out.contains("cycle 1 query51: training set 2 [") && out.contains("entering, 2 ["),
        "{out}"
    );
    let ids = collected(&s.ledger);
    let (train, validation) = selection(&s.ledger, "rj");
    assert_eq!(train, vec![ids[3].clone(), ids[2].clone()]);
    assert_eq!(validation, vec![ids[1].clone()]);
    let (old_train, _) = selection(&s.ledger, "ref");
    assert_eq!(old_train, vec![ids[0].clone(), ids[1].clone()]);
    // The reference's four pairs, each asked once, with the bare task
    // prompt (the reference episode's prompt.txt, key scrubbed) and no key.
    let reqs = j.requests();
    assert_eq!(reqs.len(), 4, "one request per pair");
    let bare = std::fs::read_to_string(s.folder.join("logs/reference/query51/prompt.txt"))
        .expect("prompt.txt");
    let first_line = bare.lines().next().expect("a line");
    for r in &reqs {
        assert!(r.contains(first_line), "the task's statement: {r}");
        assert!(!r.contains(KEY), "a planted key reached the judge");
        assert!(!r.contains("Deliverables"), "none recorded: {r}");
    }
    assert_eq!(head(&s.ledger, "ref"), source_head, "the source moved");
    // Again: everything served, nothing asked, the same head.
    let rj = head(&s.ledger, "rj");
    let again = ok(rejudge(&s, &file, "rj"));
    assert!(again.contains("(4 served"), "{again}");
    assert_eq!(j.requests().len(), 4);
    assert_eq!(head(&s.ledger, "rj"), rj);
    // Read like any run: its report and why.
    let report = ok(mass(&s.ledger, &["report", "rj", "--json"]));
    assert!(report.contains("query51"), "{report}");
    let why = ok(mass(&s.ledger, &["why", &ids[3], "--run", "rj"]));
    assert!(why.contains("c1/query51/pair/00"), "{why}");
    // Not an engine's run: resume says how to continue instead.
    let o = mass(&s.ledger, &["resume", "rj"]);
    assert!(
        !o.status.success()
            && String::from_utf8_lossy(&o.stderr).contains("the same command again continues"),
        "{}",
        text(&o)
    );
    // Another judge under the same name is refused, nothing written.
    let other = s.tmp.path().join("other.toml");
    let def = std::fs::read_to_string(&file).expect("judge file");
    std::fs::write(&other, def.replace("judge-2", "judge-3")).expect("other judge");
    let o = rejudge(&s, &other, "rj");
    assert_eq!(o.status.code(), Some(5), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("another judge"),
        "{}",
        text(&o)
    );
    assert_eq!(head(&s.ledger, "rj"), rj);
    assert_eq!(j.requests().len(), 4);
    assert!(why.contains("rank 1"), "{why}");
}

/// A re-judge whose process is killed mid-way, continued by the same
/// command, ends at the head an uninterrupted one reaches (verdicts not yet
/// recorded are asked again; recorded ones are served); one stopped by a
/// failing judge (exit 7) keeps the failed attempts it recorded, and ends
/// with the same rankings and selection.
#[test]
fn an_interrupted_rejudge_continues_where_it_stopped() {
    let whole = setup();
    let j = Judge::start();
    ok(rejudge(&whole, &j.file(whole.tmp.path()), "rj"));
    let expected = head(&whole.ledger, "rj");
    let expected_selection = selection(&whole.ledger, "rj");

    // Killed: after the judge has been asked three times (two at a time).
    let s = setup();
    let j = Judge::start();
    let file = j.file(s.tmp.path());
    j.delay_ms.store(300, Ordering::SeqCst);
    let mut child = spawn_rejudge(&s, &file, Stdio::null());
    let t0 = std::time::Instant::now();
    while j.requests().len() < 3 && t0.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().expect("kill");
    child.wait().expect("wait");
    let asked = j.requests().len();
    // Two at a time: the third and fourth were asked together.
    assert!((3..=4).contains(&asked), "killed mid-way: {asked}");
    j.delay_ms.store(0, Ordering::SeqCst);
    let out = ok(rejudge(&s, &file, "rj"));
    let served: usize = out
        .split("judged by judge2 (")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("served count");
    // A slot frees only once its verdict is recorded: the first two are.
    assert_eq!(served, 2, "the recorded verdicts served: {out}");
    assert_eq!(
        j.requests().len(),
        asked + 4 - served,
        "only the rest asked"
    );
    assert_eq!(head(&s.ledger, "rj"), expected);

    // Failed: the judge answers 500 after two verdicts.
    let s = setup();
    let j = Judge::start();
    let file = j.file(s.tmp.path());
    j.fail_after.store(2, Ordering::SeqCst);
    let o = rejudge(&s, &file, "rj");
    assert_eq!(
        o.status.code(),
        Some(7),
        "an unreachable judge: {}",
        text(&o)
    );
    let asked = j.requests().len();
    j.fail_after.store(usize::MAX, Ordering::SeqCst);
    let out = ok(rejudge(&s, &file, "rj"));
    assert!(out.contains("(2 served"), "{out}");
    assert_eq!(j.requests().len(), asked + 2, "only the two not recorded");
    assert_eq!(selection(&s.ledger, "rj"), expected_selection);
}

#[test]
fn refusals_write_nothing() {
    let s = setup();
    let j = Judge::start();
    let file = j.file(s.tmp.path());
    let before = refs(&s.ledger);
    let sim = s.tmp.path().join("sim.toml");
    std::fs::write(&sim, "[backends.simj]\nkind = \"sim\"\n").expect("sim file");
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["--cycle", "1", "--name", "x"], 2, "--judge FILE"),
        (
            vec!["--cycle", "1", "--judge", "judge2", "--name", "x"],
            2,
            "cannot read it as a file",
        ),
        (
            vec![
                "--cycle",
                "1",
                "--judge",
                sim.to_str().unwrap(),
                "--name",
                "x",
            ],
            2,
            "simulated",
        ),
        (
            vec!["--judge", file.to_str().unwrap(), "--name", "x"],
            2,
            "--cycle C",
        ),
        (
            vec![
                "--cycle",
                "2",
                "--judge",
                file.to_str().unwrap(),
                "--name",
                "x",
            ],
            2,
            "no collection in cycle 2",
        ),
        (
            vec![
                "--cycle",
                "1",
                "--judge",
                file.to_str().unwrap(),
                "--set",
                "outer.prior=1",
                "--name",
                "x",
            ],
            2,
            "--set",
        ),
        (
            vec![
                "--cycle",
                "1",
                "--judge",
                file.to_str().unwrap(),
                "--name",
                "ref",
            ],
            5,
            "is not this re-judge",
        ),
    ];
    for (args, code, says) in cases {
        let mut all = vec!["rejudge", "ref"];
        all.extend(args.iter().copied());
        let o = mass(&s.ledger, &all);
        assert_eq!(o.status.code(), Some(code), "{all:?}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(says),
            "{all:?}: {}",
            text(&o)
        );
        assert_eq!(refs(&s.ledger), before, "{all:?} wrote");
    }
    assert!(j.requests().is_empty());
}

/// `--name` is a run's name, not a stream of another run: `ref/x` would put
/// the re-judge's refs under the source's (so `mass runs rm ref` would
/// remove it, and the source would list its streams). Refused, exit 2,
/// nothing written and nothing asked.
#[test]
fn review_a_name_under_another_run_is_refused() {
    let s = setup();
    let j = Judge::start();
    let file = j.file(s.tmp.path());
    let before = refs(&s.ledger);
    for name in ["ref/x", "other/x"] {
        let o = rejudge(&s, &file, name);
        assert_eq!(o.status.code(), Some(2), "{name}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("may not hold '/'"),
            "{}",
            text(&o)
        );
        assert_eq!(refs(&s.ledger), before, "{name}: written");
    }
    assert!(j.requests().is_empty());
}

/// Runs the new judge cannot tell apart (every verdict a tie) are ordered
/// as the engine's rank stage orders them, by collection index, never by
/// the reference's ranking: the reference's verdicts must not decide what
/// trains under the new judge. The reference here ranked episode 3 first.
#[test]
fn review_ties_are_not_broken_by_the_references_ranking() {
    let s = setup_with(|folder| {
        let p = folder.join("selection/task51_ranked.json");
        let mut rows: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(&p).expect("ranked")).expect("JSON");
        rows.reverse();
        for (i, r) in rows.iter_mut().enumerate() {
            r["rank"] = serde_json::json!(i + 1);
            r["score"] = serde_json::json!(1.0 - 0.5 * i as f64);
        }
        std::fs::write(&p, serde_json::to_string_pretty(&rows).expect("JSON")).expect("write");
    });
    let j = Judge::start();
    *j.fixed.lock().expect("fixed") = Some("tie");
    let out = ok(rejudge(&s, &j.file(s.tmp.path()), "rj"));
    let ids = collected(&s.ledger);
    let (train, validation) = selection(&s.ledger, "rj");
    assert_eq!(train, vec![ids[0].clone(), ids[1].clone()], "{out}");
    assert_eq!(validation, vec![ids[2].clone()], "{out}");
}

/// A judge that cannot be reached stops the re-judge (exit 7) with what
/// continues it: the same command, not `mass resume` (which refuses a run
/// that starts as an imported one).
#[test]
fn review_a_failed_judge_says_to_run_the_same_command_again() {
    let s = setup();
    let j = Judge::start();
    let file = j.file(s.tmp.path());
    j.fail_after.store(0, Ordering::SeqCst);
    let o = rejudge(&s, &file, "rj");
    assert_eq!(o.status.code(), Some(7), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("mass resume") && err.contains("the same `mass rejudge"),
        "{}",
        text(&o)
    );
    // What it says works: the same command continues it.
    j.fail_after.store(usize::MAX, Ordering::SeqCst);
    ok(rejudge(&s, &file, "rj"));
    let st = ok(mass(&s.ledger, &["status"]));
    assert!(!st.contains("unfinished"), "{st}");
}

/// `mass status` of a re-judge of an imported run that a failing judge
/// stopped said `unfinished: ... (`mass resume rj`)`, a command that
/// refuses the run. It names the same `mass rejudge` instead (the judge
/// file's path is not recorded, the backend it defines is), in the text
/// and as `continue_with` in `--json`, which is null once the run ends.
#[test]
fn regression_status_of_a_stopped_imported_rejudge_names_the_rejudge_not_resume() {
    let s = setup();
    let j = Judge::start();
    let file = j.file(s.tmp.path());
    j.fail_after.store(2, Ordering::SeqCst);
    assert_eq!(rejudge(&s, &file, "rj").status.code(), Some(7));
    let st = ok(mass(&s.ledger, &["status", "rj"]));
    let again = "the same `mass rejudge ref --cycle 1 --judge FILE --name rj` again, FILE being the file that defines backend judge2";
    assert!(
        st.contains("unfinished:") && st.contains(again) && !st.contains("mass resume"),
        "{st}"
    );
    let status_json = |s: &Setup| -> serde_json::Value {
        serde_json::from_str(&ok(mass(&s.ledger, &["status", "rj", "--json"]))).expect("json")
    };
    assert_eq!(status_json(&s)[0]["continue_with"], again);
    j.fail_after.store(usize::MAX, Ordering::SeqCst);
    ok(rejudge(&s, &file, "rj"));
    assert_eq!(status_json(&s)[0]["continue_with"], serde_json::Value::Null);
}

/// `mass report` of a re-judge of an imported run showed its evaluate
/// stage at 0.0 s, closed by the cycle's record though nothing was
/// evaluated. The stages after the step it forked at are the engine's:
/// the ones it did not close (dataset, train, evaluate) did not run; the
/// ones it ran keep their times, and the import's own stages their own.
#[test]
fn regression_an_imported_rejudges_unrun_stages_are_not_run_not_zero_seconds() {
    let s = setup();
    let j = Judge::start();
    ok(rejudge(&s, &j.file(s.tmp.path()), "rj"));
    let report: serde_json::Value =
        serde_json::from_str(&ok(mass(&s.ledger, &["report", "rj", "--json"]))).expect("json");
    let stages = report["cycles"][0]["stages"].as_array().expect("stages");
    for st in stages {
        let name = st["stage"].as_str().expect("name");
        let unrun = matches!(name, "dataset" | "train" | "evaluate");
        assert_eq!(st["not_run"], unrun, "{st}");
        if unrun {
            assert!(st["wall_seconds"].is_null(), "{st}");
        }
    }
    let judged = stages
        .iter()
        .find(|s| s["stage"] == "judge")
        .expect("judge");
    assert!(judged["wall_seconds"].as_f64().is_some(), "{judged}");
}

/// `mass diff ref rj` of an imported run and its re-judge said "0 of 0
/// judgment streams name another winner": it matched verdicts by stream
/// name, and the import keeps a task's verdicts on one stream where the
/// engine writes one per pair. Verdicts are matched by the pair of
/// rollouts they judged now: all four compared, and the winners that
/// differ are the ones the re-judge's own summary counts (it compares the
/// two runs' verdicts itself), named by rollout (or as a tie).
#[test]
fn regression_diff_of_an_imported_run_and_its_rejudge_compares_every_verdict() {
    let s = setup();
    let j = Judge::start();
    let out = ok(rejudge(&s, &j.file(s.tmp.path()), "rj"));
    let agree: u64 = out
        .split("verdict agreement with ref's judge: ")
        .nth(1)
        .and_then(|t| t.split('/').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("an agreement line: {out}"));
    let diff: serde_json::Value =
        serde_json::from_str(&ok(mass(&s.ledger, &["diff", "ref", "rj", "--json"]))).expect("json");
    let c = &diff["cycles"][0];
    assert_eq!(c["verdicts_compared"], 4, "{diff}");
    assert_eq!(c["verdicts_changed"], 4 - agree, "{diff}");
    let ids = collected(&s.ledger);
    for v in c["changed_verdicts"].as_array().expect("changed") {
        let v = v.as_str().expect("text");
        // Each side names the rollout it found better, or its tie.
        let named = ids.iter().filter(|id| v.contains(&id[..12])).count();
        assert!(named == 2 || (named == 1 && v.contains(": tie")), "{v}");
    }
    let text = ok(mass(&s.ledger, &["diff", "ref", "rj"]));
    let line = format!("verdicts: {} of 4 compared", 4 - agree);
    assert!(text.contains(&line), "{text}");
}

/// A reference config with `validation_rank: null` asks for no validation
/// run. The import counted one as wanted all the same (any value present),
/// the re-judge none, so the same cycle's selection told two stories. Both
/// read a rank now: none wanted, and neither reports a shortfall.
#[test]
fn regression_a_null_validation_rank_is_no_validation_run_for_import_and_rejudge() {
    let s = setup_with(|folder| {
        let path = folder.join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("json");
        config["collection"]["validation_rank"] = serde_json::Value::Null;
        std::fs::write(&path, config.to_string()).expect("write config");
    });
    let j = Judge::start();
    ok(rejudge(&s, &j.file(s.tmp.path()), "rj"));
    for run in ["ref", "rj"] {
        let v: serde_json::Value =
            serde_json::from_str(&ok(mass(&s.ledger, &["log", run, "--json"]))).expect("log");
        let sel = v
            .as_array()
            .expect("events")
            .iter()
            .find(|e| e["kind"] == "mass.selection")
            .expect("a selection")["payload"]
            .clone();
        assert_eq!(sel["wanted_validation"], 0, "{run}: {sel}");
        assert_eq!(sel["shortfall"], "", "{run}: {sel}");
    }
}

/// Ctrl-C during a re-judge of an imported run says that what it recorded
/// is kept and what continues it (the same command; `mass resume` refuses
/// the run), as Ctrl-C during any run does.
#[test]
fn review_ctrl_c_says_the_same_command_continues() {
    use std::os::unix::process::ExitStatusExt;
    let s = setup();
    let j = Judge::start();
    let file = j.file(s.tmp.path());
    j.delay_ms.store(2000, Ordering::SeqCst);
    let mut child = spawn_rejudge(&s, &file, Stdio::piped());
    let t0 = std::time::Instant::now();
    while j.requests().is_empty() && t0.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("stderr");
    let status = child.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGINT), "{err}");
    assert!(
        err.contains("interrupted: re-judge rj stops here")
            && err.contains("the same `mass rejudge ref"),
        "{err}"
    );
    j.delay_ms.store(0, Ordering::SeqCst);
    ok(rejudge(&s, &file, "rj"));
}
