//! `mass demo`: a short scripted demonstration that fills a ledger with the
//! shapes a MASS run produces (a workspace snapshot, an orchestrator
//! conversation that delegates to a subagent, a final snapshot). Nothing here is
//! a model: the messages are fixed text, and the output says so.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use ledger::{Id, Ledger};
use schemas::{Hash32, ModelCall, Note, WorkspaceSnapshot};
use serde_json::{json, Value};

/// `mass demo`: writes a scripted run (`demo/N`) into the ledger at `dir`,
/// created if need be, from `workspace` or a sample workspace made for it
/// (and removed after).
pub fn run(dir: &Path, workspace: Option<&Path>) -> Result<ExitCode> {
    let l = if dir.join("FORMAT").exists() {
        super::open(dir)?
    } else {
        Ledger::init(dir)?
    };
    let ws = match workspace {
        Some(w) => w.to_path_buf(),
        None => {
            let tmp = tempdir()?;
            write_sample_workspace(&tmp)?;
            tmp
        }
    };
    let run = format!("demo/{}", next_demo_number(&l)?);
    let note = l.append(
        &run,
        None,
        schemas::to_event(&Note {
            text: "scripted demo: fixed messages, no model".into(),
        })?,
    )?;
    let initial = l.snapshot_dir(&ws)?;
    let snap = l.append(
        &run,
        Some(note),
        schemas::to_event(&WorkspaceSnapshot {
            label: "initial".into(),
            tree: initial.into(),
        })?,
    )?;
    let talk = conversation(&l, &run)?;
    std::fs::write(
        ws.join("report.md"),
        "# Result\n\nSharpe ratio 0.84, positions lagged one day.\n",
    )?;
    let fin = l.snapshot_dir(&ws)?;
    let end = l.append(
        &run,
        Some(snap),
        schemas::to_event(&WorkspaceSnapshot {
            label: "final".into(),
            tree: fin.into(),
        })?
        .with_parents(vec![talk.orchestrator_head]),
    )?;
    print_heads(&run, end, &talk, initial, fin)?;
    if workspace.is_none() {
        let _ = std::fs::remove_dir_all(&ws);
    }
    Ok(ExitCode::SUCCESS)
}

/// The demo's conversation: its two streams and their heads.
struct Conversation {
    orchestrator: String,
    subagent: String,
    orchestrator_head: Id,
    subagent_head: Id,
}

/// The scripted conversation of run `run`: the orchestrator delegates to
/// a subagent, whose answer comes back as a tool result, and finishes.
fn conversation(l: &Ledger, run: &str) -> Result<Conversation> {
    let orch = format!("{run}/orchestrator");
    let sub = format!("{run}/subagent-1");
    let system = msg(
        "system",
        "You are the orchestrator of a research team. Delegate, verify, then finish.",
    );
    let task = msg("user", "Compute the Sharpe ratio of the strategy in data/prices.csv without look-ahead and write report.md.");
    let call1 = model_call(
        l,
        &orch,
        None,
        None,
        vec![system, task],
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "delegate", "arguments": "{\"role\":\"analyst\",\"instructions\":\"Backtest with positions decided on the previous close.\",\"contract\":\"Return the Sharpe ratio and the command you ran.\"}"}}]}),
        "tool_calls",
    )?;
    let sub_call = model_call(
        l,
        &sub,
        None,
        None,
        vec![
            msg(
                "system",
                "You are the analyst. Contract: return the Sharpe ratio and the command you ran.",
            ),
            msg(
                "user",
                "Backtest with positions decided on the previous close.",
            ),
        ],
        json!({"role": "assistant", "content": "Sharpe 0.84 (python3 backtest.py --lag 1)."}),
        "stop",
    )?;
    let tool_result = msg_tool("call_1", "Sharpe 0.84 (python3 backtest.py --lag 1).");
    let call2 = model_call(
        l,
        &orch,
        Some(call1),
        Some(sub_call),
        vec![tool_result],
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_2", "type": "function", "function": {"name": "finish", "arguments": "{\"report\":\"report.md\"}"}}]}),
        "tool_calls",
    )?;
    Ok(Conversation {
        orchestrator: orch,
        subagent: sub,
        orchestrator_head: call2,
        subagent_head: sub_call,
    })
}

/// Prints the run's heads, the workspace trees before and after, and what
/// to try next.
fn print_heads(run: &str, end: Id, talk: &Conversation, initial: Id, fin: Id) -> Result<()> {
    let (orch, call2) = (&talk.orchestrator, talk.orchestrator_head);
    let (sub, sub_call) = (&talk.subagent, talk.subagent_head);
    crate::output::outln!("demo run {run}: head {}", end.short(12))?;
    crate::output::outln!("  orchestrator stream {orch}: head {}", call2.short(12))?;
    crate::output::outln!("  subagent stream {sub}: head {}", sub_call.short(12))?;
    crate::output::outln!("  workspace {} -> {}", initial.short(12), fin.short(12))?;
    crate::output::outln!(
        "try: mass log {run}; mass show {}; mass diff {} {}; mass verify",
        call2.short(12),
        initial.short(12),
        fin.short(12)
    )?;
    Ok(())
}

fn msg(role: &str, content: &str) -> Value {
    json!({"role": role, "content": content})
}

fn msg_tool(call_id: &str, content: &str) -> Value {
    json!({"role": "tool", "tool_call_id": call_id, "content": content})
}

/// Appends a `model.call`; `child` (a subagent's final event) becomes a parent.
fn model_call(
    l: &Ledger,
    stream: &str,
    prefix: Option<Id>,
    child: Option<Id>,
    messages: Vec<Value>,
    response: Value,
    finish: &str,
) -> Result<Id> {
    let mut b = l.batch();
    let mut ids = Vec::new();
    for m in &messages {
        ids.push(Hash32::from(b.put_blob(&serde_json::to_vec(m)?)?));
    }
    let resp = b.put_blob(&serde_json::to_vec(&response)?)?;
    let call = ModelCall {
        role: if stream.ends_with("orchestrator") {
            "orchestrator"
        } else {
            "subagent"
        }
        .into(),
        model: "demo-scripted".into(),
        params: r#"{"seed":0,"temperature":0}"#.into(),
        prefix: prefix.map(Hash32::from),
        messages: ids,
        tools: None,
        response: resp.into(),
        prompt_tokens: 0,
        completion_tokens: 0,
        finish_reason: finish.into(),
    };
    let mut ev = schemas::to_event(&call)?;
    ev.parents.extend(child);
    let head = l.head(stream)?;
    let id = b.append(stream, head, ev)?;
    b.commit()?;
    Ok(id)
}

fn next_demo_number(l: &Ledger) -> Result<usize> {
    Ok(l.refs()?
        .iter()
        .filter(|(n, _)| n.starts_with("demo/") && n.matches('/').count() == 1)
        .count()
        + 1)
}

fn tempdir() -> Result<std::path::PathBuf> {
    let p = std::env::temp_dir().join(format!("mass-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p)?;
    Ok(p)
}

fn write_sample_workspace(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir.join("data"))?;
    let mut csv = String::from("date,close\n");
    let mut price = 100.0f64;
    for day in 0..250u32 {
        // A fixed deterministic walk; the demo needs plausible bytes, not realism.
        price *= 1.0 + (((day * 7919) % 200) as f64 - 99.0) / 5000.0;
        csv.push_str(&format!(
            "2025-{:02}-{:02},{price:.2}\n",
            day / 28 % 12 + 1,
            day % 28 + 1
        ));
    }
    std::fs::write(dir.join("data/prices.csv"), csv)?;
    std::fs::write(
        dir.join("backtest.py"),
        "import csv\n# positions use the previous close (no look-ahead)\n",
    )?;
    Ok(())
}
