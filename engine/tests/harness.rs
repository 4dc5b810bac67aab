//! The harness, judge and optimizer against a scripted backend (a unit-test
//! stand-in for a model): malformed tool calls, unknown tools, missing fields,
//! halting at the turn limit, invalid verdicts and malformed proposals are all
//! handled as documented, and recorded.

use std::sync::{Arc, Mutex};

use engine::backend::{Backend, BackendError, ChatRequest, ChatResponse};
use engine::chat::{Message, Role, ToolCall, Usage};
use engine::config::Limits;
use engine::harness::{run_team, RunRules, RunSpec, Team};
use engine::task::Task;
use engine::workflow::Workflow;
use ledger::Ledger;
use replay::{Mode, Session};

/// Replies from a fixed script, then repeats the last reply.
/// Awaits engine work from synchronous test code.
fn wait<F: std::future::Future>(f: F) -> F::Output {
    engine::exec::block_on(f).expect("the engine's runtime starts")
}

struct Scripted {
    replies: Mutex<Vec<Message>>,
    seen: Mutex<Vec<ChatRequest>>,
}

impl Scripted {
    fn new(replies: Vec<Message>) -> Arc<Scripted> {
        Arc::new(Scripted {
            replies: Mutex::new(replies.into_iter().rev().collect()),
            seen: Mutex::new(Vec::new()),
        })
    }
}

impl Backend for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    fn base_model(&self) -> String {
        "scripted/base".into()
    }
    fn complete<'a>(&'a self, req: &'a ChatRequest) -> engine::backend::Reply<'a> {
        Box::pin(std::future::ready(self.reply(req)))
    }
}

impl Scripted {
    fn reply(&self, req: &ChatRequest) -> Result<ChatResponse, BackendError> {
        self.seen.lock().unwrap().push(req.clone());
        let mut r = self.replies.lock().unwrap();
        let m = if r.len() > 1 {
            r.pop().unwrap()
        } else {
            r.last().cloned().unwrap()
        };
        Ok(ChatResponse {
            finish_reason: if m.tool_calls.is_empty() {
                "stop".into()
            } else {
                "tool_calls".into()
            },
            message: m,
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
            },
            raw: None,
            raw_body: None,
            trainer_tokens: None,
        })
    }
}

fn call(name: &str, args: &str) -> Message {
    Message::tool_calls(vec![ToolCall::new(
        format!("c-{name}-{}", args.len()),
        name,
        args,
    )])
}

fn task() -> Task {
    Task::load(
        &std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/tasks/fin-momentum-backtest"),
    )
    .unwrap()
}

fn team(b: Arc<Scripted>) -> Team {
    Team {
        orchestrator: b.clone(),
        orchestrator_model: "scripted/base".into(),
        subagent: b,
        subagent_model: "scripted/base".into(),
        sampling: engine::config::SamplingConfig::with(0.0, 100),
    }
}

fn session() -> (tempfile::TempDir, Session) {
    let d = tempfile::tempdir().unwrap();
    let l = Arc::new(Ledger::init(d.path()).unwrap());
    (d, Session::new(l, "t", Mode::Live).unwrap())
}

#[test]
fn malformed_tool_calls_get_readable_errors_and_the_run_goes_on() {
    let b = Scripted::new(vec![
        call("write_file", "{\"path\": \"a.txt\", \"content\": "),
        call("rm", "{\"path\": \"/\"}"),
        call("write_file", "{\"path\": \"notes.md\"}"),
        call("read_file", "{\"path\": \"../../etc/passwd\"}"),
        call(
            "write_file",
            "{\"path\": \"notes.md\", \"content\": \"hello\"}",
        ),
        call("finish", "{\"report\": \"done\"}"),
    ]);
    let (_d, s) = session();
    let t = task();
    let out = wait(run_team(
        &s,
        &RunSpec {
            task: &t,
            workflow: &Workflow::bare(),
            stream: "r".into(),
            purpose: "test",
            cycle: 1,
            index: 0,
        },
        &team(b.clone()),
        &RunRules::default(),
    ))
    .unwrap();
    assert_eq!(out.record.status, "finished");
    assert_eq!(out.record.report, "done");
    let tool_texts = tool_texts(&b);
    assert!(
        tool_texts[0].contains("not valid JSON"),
        "{}",
        tool_texts[0]
    );
    assert!(
        tool_texts[1].contains("unknown tool \"rm\""),
        "{}",
        tool_texts[1]
    );
    assert!(
        tool_texts[2].contains("missing field \"content\""),
        "{}",
        tool_texts[2]
    );
    assert!(
        tool_texts[3].starts_with("error"),
        "path escape refused: {}",
        tool_texts[3]
    );
    // The write landed in the snapshot; the run was validated.
    let tree = s.ledger().get_tree(&ledger::Id(out.record.tree.0)).unwrap();
    assert_eq!(
        s.ledger()
            .get_blob(&tree.get("notes.md").unwrap().blob_id().unwrap())
            .unwrap(),
        b"hello"
    );
    assert!(
        out.record.score_total > 0,
        "checks ran on the final workspace"
    );
}

#[test]
fn a_run_that_never_finishes_is_halted_not_failed() {
    let b = Scripted::new(vec![call("list_files", "{}")]);
    let (_d, s) = session();
    let t = task();
    let limits = Limits {
        max_turns: 4,
        ..Limits::default()
    };
    let out = wait(run_team(
        &s,
        &RunSpec {
            task: &t,
            workflow: &Workflow::bare(),
            stream: "r".into(),
            purpose: "test",
            cycle: 1,
            index: 0,
        },
        &team(b),
        &RunRules {
            limits: limits.clone(),
            ..Default::default()
        },
    ))
    .unwrap();
    assert_eq!(out.record.status, "halted");
    assert!(
        out.record.detail.contains("turn limit (4)"),
        "{}",
        out.record.detail
    );
    assert_eq!(out.record.turns, 4);
}

#[test]
fn delegation_runs_a_subagent_in_its_own_stream() {
    let b = Scripted::new(vec![
        call(
            "delegate",
            "{\"role\": \"analyst\", \"instructions\": \"write x\", \"contract\": \"return ok\"}",
        ),
        call("write_file", "{\"path\": \"x.txt\", \"content\": \"x\"}"),
        Message::assistant("ok, wrote x.txt"),
        call("finish", "{\"report\": \"team done\"}"),
    ]);
    let (_d, s) = session();
    let t = task();
    let out = wait(run_team(
        &s,
        &RunSpec {
            task: &t,
            workflow: &Workflow::bare(),
            stream: "r".into(),
            purpose: "test",
            cycle: 1,
            index: 0,
        },
        &team(b.clone()),
        &RunRules::default(),
    ))
    .unwrap();
    assert_eq!(out.record.delegations, 1);
    assert!(s.ledger().head("t/r/sub0").unwrap().is_some());
    let seen = b.seen.lock().unwrap();
    let sub_req = seen
        .iter()
        .find(|r| {
            r.messages[0]
                .content_str()
                .starts_with("You are a subagent")
        })
        .unwrap();
    assert!(sub_req.messages[0].content_str().contains("return ok"));
    assert!(
        !sub_req.tools.iter().any(|t| t.function.name == "delegate"),
        "subagents cannot delegate"
    );
    let last = seen.last().unwrap();
    assert!(last
        .messages
        .iter()
        .any(|m| m.role == Role::Tool && m.content_str() == "ok, wrote x.txt"));
}

#[test]
fn invalid_verdicts_are_re_asked_and_counted() {
    use engine::judge::{judge_pair, Judge, RunRef};
    let (_d, s) = session();
    let t = task();
    let worker = Scripted::new(vec![call("finish", "{\"report\": \"r\"}")]);
    let mk = |i: u32| {
        let o = wait(run_team(
            &s,
            &RunSpec {
                task: &t,
                workflow: &Workflow::bare(),
                stream: format!("w{i}"),
                purpose: "test",
                cycle: 1,
                index: i,
            },
            &team(worker.clone()),
            &RunRules::default(),
        ))
        .unwrap();
        RunRef {
            event: o.event,
            record: o.record,
            violations: o.guard.violations,
        }
    };
    let (a, bb) = (mk(0), mk(1));
    let judge_b = Scripted::new(vec![
        Message::assistant("A is better"),
        Message::assistant("{\"winner\": \"C\"}"),
        Message::assistant("{\"winner\": \"B\", \"rationale\": \"B shows its work\"}"),
    ]);
    let judge = Judge {
        backend: judge_b.clone(),
        model: "scripted/base".into(),
        max_retries: 3,
        sampling: engine::config::SamplingConfig::with(0.0, 1024),
        shown: engine::judge::Shown::Workspaces,
    };
    let (_, j) = wait(judge_pair(&s, "j1", &t, &a, &bb, true, &judge)).unwrap();
    assert_eq!(j.invalid_attempts, 2);
    assert_eq!(j.winner, "a", "screen B is run a when swapped");
    let never = Scripted::new(vec![Message::assistant("no idea")]);
    let (_, j2) = wait(judge_pair(
        &s,
        "j2",
        &t,
        &a,
        &bb,
        false,
        &Judge {
            backend: never,
            model: "scripted/base".into(),
            max_retries: 2,
            sampling: engine::config::SamplingConfig::with(0.0, 1024),
            shown: engine::judge::Shown::Workspaces,
        },
    ))
    .unwrap();
    assert_eq!((j2.winner.as_str(), j2.invalid_attempts), ("invalid", 3));
}

#[test]
fn malformed_proposals_are_recorded_and_retried() {
    use engine::optimizer::{propose, Optimizer};
    let (_d, s) = session();
    let t = task();
    let good = serde_json::json!({"improved_design": {"agents": [{"agent_id": "solver", "role": "analyst", "instruction": "do it"}], "contracts": [], "hops": []}, "changes_from_previous": ["added solver"]});
    let b = Scripted::new(vec![
        Message::assistant("here: {\"improved_design\": "),
        Message::assistant(format!("```json\n{good}\n```")),
    ]);
    let opt = Optimizer {
        backend: b,
        model: "scripted/base".into(),
        max_retries: 3,
        sampling: engine::config::SamplingConfig::with(0.0, 1024),
        reject_unchanged: true,
    };
    let (w, head) = wait(propose(&s, "opt", &t, 1, &Workflow::bare(), &[], &opt)).unwrap();
    assert_eq!(w.unwrap().agents[0].agent_id, "solver");
    let recs: Vec<schemas::ProposalRecord> = s
        .ledger()
        .chain(head)
        .map(|e| e.unwrap())
        .filter(|e| e.kind == "mass.proposal")
        .map(|e| schemas::decode_event(&e).unwrap())
        .collect();
    assert_eq!(recs.len(), 2);
    assert!(recs.iter().any(|r| !r.valid && !r.error.is_empty()));
    assert!(recs.iter().any(|r| r.valid));
}

/// Regression (#27): a proposal equal to the champion (the bare task again,
/// or the champion's own design, in another JSON layout) was run and judged,
/// and a bare re-run that won by noise opened the task's data gate. Such a
/// proposal is a failed attempt, recorded with the reply, and re-asked.
#[test]
fn proposals_that_change_nothing_are_failed_attempts() {
    use engine::optimizer::{propose, Optimizer};
    let agent =
        serde_json::json!({"agent_id": "solver", "role": "analyst", "instruction": "do it"});
    let champion: Workflow =
        serde_json::from_value(serde_json::json!({"agents": [agent], "contracts": [], "hops": []}))
            .unwrap();
    let reply = |design: serde_json::Value| {
        Message::assistant(
            serde_json::json!({"improved_design": design, "changes_from_previous": ["none"]})
                .to_string(),
        )
    };
    let empty = serde_json::json!({"agents": [], "contracts": [], "hops": []});
    // The champion's design with keys in another order: the same team section.
    let same = serde_json::json!({"hops": [], "agents": [{"instruction": "do it", "role": "analyst", "agent_id": "solver"}], "contracts": []});
    let revised = serde_json::json!({"agents": [agent, {"agent_id": "checker", "role": "reviewer", "instruction": "check it"}], "contracts": [], "hops": []});
    for (champ, unchanged) in [(Workflow::bare(), empty), (champion.clone(), same)] {
        let (_d, s) = session();
        let b = Scripted::new(vec![reply(unchanged.clone()), reply(revised.clone())]);
        let opt = Optimizer {
            backend: b,
            model: "scripted/base".into(),
            max_retries: 3,
            sampling: engine::config::SamplingConfig::with(0.0, 1024),
            reject_unchanged: true,
        };
        let (w, head) = wait(propose(&s, "opt", &task(), 1, &champ, &[], &opt)).unwrap();
        assert_eq!(
            w.unwrap().agents.len(),
            2,
            "the unchanged proposal was used"
        );
        let recs: Vec<schemas::ProposalRecord> = s
            .ledger()
            .chain(head)
            .map(|e| e.unwrap())
            .filter(|e| e.kind == "mass.proposal")
            .map(|e| schemas::decode_event(&e).unwrap())
            .collect();
        assert_eq!(recs.len(), 2);
        let failed = recs.iter().find(|r| r.attempt == 0).unwrap();
        assert!(
            !failed.valid && failed.error.contains("champion"),
            "{failed:?}"
        );
        // The optimizer's reply is kept as the failed attempt's body.
        let body = s.ledger().get_blob(&ledger::Id(failed.body.0)).unwrap();
        let sent: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(sent["improved_design"], unchanged);
    }
}

fn run_scripted(
    b: &Arc<Scripted>,
    t: &Task,
) -> (tempfile::TempDir, Session, engine::harness::RunOutcome) {
    run_scripted_with(b, t, &RunRules::default())
}

fn run_scripted_with(
    b: &Arc<Scripted>,
    t: &Task,
    rules: &RunRules,
) -> (tempfile::TempDir, Session, engine::harness::RunOutcome) {
    let (d, s) = session();
    let out = wait(run_team(
        &s,
        &RunSpec {
            task: t,
            workflow: &Workflow::bare(),
            stream: "r".into(),
            purpose: "test",
            cycle: 1,
            index: 0,
        },
        &team(b.clone()),
        rules,
    ))
    .unwrap();
    (d, s, out)
}

/// Before: `checks/` (with the reference validator) was copied into every
/// workspace and the "pristine" reinstall only overwrote existing files, so a
/// planted `checks/hashlib.py` made the validator print SCORE 24/24 with no
/// work done. The checks now run from the task folder with `python3 -I`; a
/// team that plants a fake validator, a shadowing module and a fake
/// `MASS_CHECKS` folder gets the real verdict on its (empty) work.
#[test]
fn regression_planted_checks_module_cannot_fake_the_score() {
    let fake_module = "def sha256(*a, **k):\n    raise SystemExit('SCORE 24/24')\n";
    let fake_validator = "print('PASS everything: ok')\\nprint('SCORE 24/24')";
    let b = Scripted::new(vec![
        call(
            "write_file",
            &serde_json::json!({"path": "checks/hashlib.py", "content": fake_module}).to_string(),
        ),
        call(
            "write_file",
            &serde_json::json!({"path": "hashlib.py", "content": fake_module}).to_string(),
        ),
        call(
            "write_file",
            &serde_json::json!({"path": "checks/validate.py", "content": fake_validator})
                .to_string(),
        ),
        call(
            "bash",
            r#"{"command": "mkdir -p MASS_CHECKS && cp checks/validate.py MASS_CHECKS/ && export MASS_CHECKS=$PWD/MASS_CHECKS"}"#,
        ),
        call("finish", r#"{"report": "all checks pass"}"#),
    ]);
    let t = task();
    let (_d, _s, out) = run_scripted(&b, &t);
    let (passed, total) = (out.record.score_passed, out.record.score_total);
    assert!(total > 0, "the real validator did not run");
    assert!(passed < total, "a planted validator faked {passed}/{total}");
    assert_ne!((passed, total), (24, 24));
}

/// A team's `run_checks` shows PASS/FAIL per check and the score, never the
/// validator's expected values; the recorded validation keeps them.
#[test]
fn run_checks_shows_the_team_no_expected_values() {
    let b = Scripted::new(vec![
        call(
            "write_file",
            r#"{"path": "results.json", "content": "{\"strategy\": {\"total_return\": 0.5}}"}"#,
        ),
        call("run_checks", "{}"),
        call("finish", r#"{"report": "done"}"#),
    ]);
    let t = task();
    let (_d, s, out) = run_scripted(&b, &t);
    let last = b.seen.lock().unwrap().last().cloned().unwrap();
    let feedback = last
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content_str().to_string())
        .find(|c| c.contains("SCORE"))
        .expect("run_checks answered with a score");
    assert!(feedback.contains("FAIL "), "{feedback}");
    assert!(!feedback.contains("expected"), "{feedback}");
    assert!(feedback.lines().all(|l| !l.contains(": ")), "{feedback}");
    assert!(out.record.score_total > 0);
    // The recorded validation has the details; no checks folder ever
    // entered the workspace.
    let l = s.ledger();
    let full = l.get_blob(&ledger::Id(out.record.validation.0)).unwrap();
    assert!(String::from_utf8_lossy(&full).contains("expected"));
    let tree = l.get_tree(&ledger::Id(out.record.tree.0)).unwrap();
    assert!(
        tree.entries.iter().all(|e| !e.path.starts_with("checks")),
        "{:?}",
        tree.entries
    );
}

/// Before: with a run's live workspace opened once and kept, a command of
/// an unconfined run that removed the workspace root let the next
/// `write_file` recreate an empty root, write into it and record that tree
/// as the run's. The kept workspace is checked at every call: the call
/// fails with the root's error, as it did when the root was opened per
/// call, and the run's tree is the last one recorded before the removal.
#[test]
fn regression_a_removed_workspace_root_is_not_recreated_by_the_next_call() {
    let b = Scripted::new(vec![
        call("read_file", r#"{"path": "README.md"}"#),
        call("bash", r#"{"command": "rm -rf \"$PWD\""}"#),
        call("write_file", r#"{"path": "a.txt", "content": "x"}"#),
        call("finish", r#"{"report": "done"}"#),
    ]);
    let mut rules = RunRules::default();
    rules.sandbox.level = sandbox::Level::None;
    let (_d, s, out) = run_scripted_with(&b, &task(), &rules);
    assert_eq!(out.record.status, "finished", "{}", out.record.detail);
    let texts = tool_texts(&b);
    assert!(
        texts[2].starts_with("error: workspace root"),
        "the write after the root was removed: {}",
        texts[2]
    );
    let tree = s.ledger().get_tree(&ledger::Id(out.record.tree.0)).unwrap();
    assert!(tree.get("a.txt").is_none(), "a recreated root was recorded");
    assert!(
        tree.get("README.md").is_some(),
        "the run's tree is the workspace as it was before the removal"
    );
}

/// The tool results the last request carried, in order.
fn tool_texts(b: &Scripted) -> Vec<String> {
    let last = b.seen.lock().unwrap().last().cloned().unwrap();
    last.messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content_str().to_string())
        .collect()
}
