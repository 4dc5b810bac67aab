//! `mass status`: every run (or one) with how far it got, its exclusions
//! and its unfinished effects.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{bail, Result};
use engine::status::RunStatus;
use ledger::{Id, Ledger};

use super::CliError;

/// One run's line of `mass status`: name, head, status folded from its
/// main stream, unfinished effects, and whether it never started.
struct Row {
    name: String,
    head: Id,
    st: RunStatus,
    pending: Vec<String>,
    never: bool,
    /// The command that continues the run (shown while it is not finished).
    continues: String,
}

pub fn status(l: &Ledger, run: Option<&str>, json: bool) -> Result<ExitCode> {
    let list = match run {
        Some(r) => match l.head(r)? {
            Some(h) => vec![(r.to_string(), h)],
            None => bail!(CliError::NotFound(format!(
                "no run named {r:?} (`mass status` lists runs)"
            ))),
        },
        None => super::runs::runs(l)?,
    };
    let unreadable = if run.is_none() {
        unreadable_runs(l)?
    } else {
        Vec::new()
    };
    let mut rows = Vec::new();
    for (name, head) in list {
        rows.push(row(l, name, head)?);
    }
    let mut out = crate::output::stdout();
    for u in &unreadable {
        eprintln!("error: {u}");
    }
    let code = crate::output::decide(if unreadable.is_empty() { 0 } else { 3 });
    if json {
        let v: Vec<_> = rows.iter().map(row_json).collect();
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
        return Ok(code);
    }
    if rows.is_empty() && unreadable.is_empty() {
        writeln!(
            out,
            "no runs yet; start one with `mass run examples/smoke.toml`"
        )?;
    }
    for r in rows {
        print_row(&mut out, r)?;
    }
    Ok(code)
}

/// A top-level ref whose head cannot be read is a run (or something) that
/// cannot be listed: one message each, so `status` says so and exits 3,
/// never "no runs yet".
fn unreadable_runs(l: &Ledger) -> Result<Vec<String>> {
    let mut unreadable = Vec::new();
    for (name, head) in l.refs()? {
        if name.contains('/') {
            continue;
        }
        if let Err(e) = l.get_event(&head) {
            unreadable.push(format!(
                "{name}: its head {} cannot be read ({e}); `mass verify` names what is damaged, `mass repair` sets it aside",
                head.short(12)
            ));
        }
    }
    Ok(unreadable)
}

/// Folds run `name`'s main stream, ending at `head`, into its row.
fn row(l: &Ledger, name: String, head: Id) -> Result<Row> {
    let mut steps = Vec::new();
    for ev in l.chain(head) {
        steps.push(ev?);
    }
    steps.reverse();
    let mut st = engine::status::fold_read(l, &steps)?;
    if let Some(first) = steps.first().filter(|e| e.kind == "run.started") {
        // A definition that cannot be read leaves the name and plan blank:
        // status still shows how far the run got.
        if let Ok((name, cycles)) = engine::status::describe_start(l, first) {
            st.experiment = name;
            st.cycles_planned = cycles;
        }
    }
    // A fork that set `cycles` changed the plan.
    if let Some(c) = st.cycles_override {
        st.cycles_planned = c;
    }
    let pending = engine::status::unfinished_effects(l, &name)?;
    let never = engine::driver::start_failed(l, &name)?.is_some();
    let continues = engine::rejudge_imported::continue_command(&steps, &name)
        .unwrap_or_else(|| format!("`mass resume {name}`"));
    Ok(Row {
        name,
        head,
        st,
        pending,
        never,
        continues,
    })
}

/// A row as `status --json` prints it.
fn row_json(r: &Row) -> serde_json::Value {
    let Row {
        name: n,
        head: h,
        st,
        pending: p,
        never,
        continues,
    } = r;
    serde_json::json!({"run": n, "head": h.to_hex(), "experiment": st.experiment, "cycles_planned": st.cycles_planned, "cycles_done": st.cycles_done, "last_step": st.last_step, "finished": st.finished, "never_started": never, "forked_from": st.forked_from, "exclusions": st.exclusions, "unfinished_effects": p, "continue_with": (!st.finished).then_some(continues), "cycles": st.cycles})
}

/// A row as `status` prints it for people: the run's line, then its
/// exclusions and unfinished effects.
fn print_row(out: &mut impl Write, r: Row) -> Result<()> {
    let Row {
        name: n,
        head: h,
        st,
        pending: p,
        never,
        continues,
    } = r;
    let state = if st.finished {
        "finished".to_string()
    } else if never {
        format!("never started (nothing after run.started; `mass run FILE --ref {n}` with a corrected file replaces it, `mass runs rm {n}` removes it)")
    } else {
        "in progress".to_string()
    };
    writeln!(
        out,
        "{n}: {} — {}/{} cycles, {state}{}; last step: {} (head {})",
        st.experiment,
        st.cycles_done,
        st.cycles_planned,
        st.forked_from
            .as_ref()
            .map(|f| format!(", forked from {f}"))
            .unwrap_or_default(),
        st.last_step,
        h.short(12)
    )?;
    if !st.exclusions.is_empty() {
        let by: Vec<String> = st
            .exclusions
            .iter()
            .map(|(r, k)| format!("{r} {k}"))
            .collect();
        writeln!(
            out,
            "  excluded from ranking or training data: {}",
            by.join(", ")
        )?;
    }
    for e in p {
        writeln!(out, "  unfinished: {e} ({continues})")?;
    }
    Ok(())
}
