//! `mass runs RUN`: a run's streams and its rollouts, each with the
//! ranking and selection this run gave it (a rollout shared with a fork or
//! a re-judge may be ranked there too), read through the referrers index
//! and each stream walked back at most once.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use ledger::{Event, Id, Ledger};
use schemas::{Decodable, Ranking, Selection};
use serde::Serialize;

use super::{decode, facts, hex, id_of, recorded, selection_facts};
use engine::error::{EngineError, Result};

/// Rankings and selections met while listing a run's rollouts, each read
/// and decoded once: a ranking names every rollout of its task and a
/// judgment two, and each was read again for each of them (a profile of
/// `mass report` at 100k events put half its time in that listing).
struct Decisions<'l> {
    l: &'l Ledger,
    /// Every ranking and every selection event of the ledger, from the
    /// index's list by kind (no event read): a referrer of a rollout that
    /// is in neither (its judgments, the next event of its stream) is
    /// skipped unread. Reading each to learn its kind read every judgment
    /// of a run again (most of a report that reads kept stream facts).
    kinds: Option<(HashSet<Id>, HashSet<Id>)>,
    /// A referrer's ranking, or `None` for an event of another kind.
    rankings: HashMap<Id, Option<Rc<(Event, Ranking)>>>,
    /// The selections naming an id (`selections_of`).
    selections: HashMap<Id, Rc<Vec<(Event, Selection)>>>,
}

impl<'l> Decisions<'l> {
    fn new(l: &'l Ledger) -> Self {
        Decisions {
            l,
            kinds: None,
            rankings: HashMap::new(),
            selections: HashMap::new(),
        }
    }

    /// The ids of every ranking and every selection, listed once.
    fn kinds(&mut self) -> Result<&(HashSet<Id>, HashSet<Id>)> {
        if self.kinds.is_none() {
            let of = |k: &str| -> Result<HashSet<Id>> {
                Ok(self
                    .l
                    .events_newest_first(Some(k), usize::MAX)?
                    .into_iter()
                    .collect())
            };
            self.kinds = Some((of(Ranking::KIND)?, of(Selection::KIND)?));
        }
        Ok(self.kinds.get_or_insert_with(Default::default))
    }

    /// As `referrers_of::<Ranking>`, in log order.
    fn rankings_of(&mut self, id: &Id) -> Result<Vec<Rc<(Event, Ranking)>>> {
        let mut out = Vec::new();
        for r in self.l.referrers(id)? {
            if !self.kinds()?.0.contains(&r) {
                continue;
            }
            let hit = match self.rankings.get(&r) {
                Some(h) => h.clone(),
                None => {
                    let ev = self.l.get_event(&r)?;
                    let h = if ev.kind == Ranking::KIND && ev.version == Ranking::VERSION {
                        let rk = decode::<Ranking>(&ev)?;
                        Some(Rc::new((ev, rk)))
                    } else {
                        None
                    };
                    self.rankings.insert(r, h.clone());
                    h
                }
            };
            out.extend(hit);
        }
        Ok(out)
    }

    /// As `selections_of`, reading only the referrers that are selections.
    fn selections_of(&mut self, id: &Id) -> Result<Rc<Vec<(Event, Selection)>>> {
        if let Some(s) = self.selections.get(id) {
            return Ok(s.clone());
        }
        let mut found = Vec::new();
        for r in self.l.referrers(id)? {
            if !self.kinds()?.1.contains(&r) {
                continue;
            }
            let ev = self.l.get_event(&r)?;
            if let Some(s) = Selection::read(&ev) {
                let s = s.map_err(|e| EngineError::recording("mass.selection", e))?;
                found.push((ev, s));
            }
        }
        let s = Rc::new(found);
        self.selections.insert(*id, s.clone());
        Ok(s)
    }
}

/// Selections (of any recorded version) that name `id`, in log order.
pub(crate) fn selections_of(l: &Ledger, id: &Id) -> Result<Vec<(Event, Selection)>> {
    let mut out = Vec::new();
    for r in l.referrers(id)? {
        let ev = l.get_event(&r)?;
        if let Some(s) = Selection::read(&ev) {
            let s = s.map_err(|e| EngineError::recording("mass.selection", e))?;
            out.push((ev, s));
        }
    }
    Ok(out)
}

/// The streams of run `run` other than its main one, as (name relative to
/// the run, head), sorted by name: the refs `RUN/<rel>` whose head event is
/// on stream `<rel>`. Every stream a run writes names its events so; a ref
/// under `RUN/` that is not such a stream (the main ref or a stream of
/// another run named `RUN/...`, the ledger's `mass/runs` stream for a run
/// named `mass`) belongs to someone else.
pub fn run_streams(l: &Ledger, run: &str) -> Result<Vec<(String, Id)>> {
    let prefix = format!("{run}/");
    let mut out = Vec::new();
    for (name, head) in l.refs_under(&prefix)? {
        let Some(rel) = name.strip_prefix(&prefix) else {
            continue;
        };
        if l.get_event(&head)?.stream == rel {
            out.push((rel.to_string(), head));
        }
    }
    Ok(out)
}

/// One rollout of a run, as `mass runs RUN` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct RolloutRow {
    pub event: String,
    pub task: String,
    pub cycle: u32,
    pub index: u32,
    /// `reference`, `search candidate`, `collection` or `evaluation`.
    pub kind: String,
    /// `completed`, `halted`, `infrastructure failure` or `excluded by a
    /// guard` (flagged, and the experiment excluded such runs).
    pub status: String,
    /// `None`: not recorded (`ledger::NOT_RECORDED`, an imported run).
    pub checks_passed: Option<u32>,
    pub checks_total: Option<u32>,
    /// The orchestrator's model (evaluation runs compare models).
    pub model: String,
    pub score: Option<f64>,
    pub rank: Option<u32>,
    /// `train`, `validation`, `excluded`, `not selected`, or none (not a
    /// collected run).
    pub selection: Option<String>,
}

/// Every rollout of run `run`, found from its refs (each rollout ends its
/// orchestrator stream) and described through index lookups; sorted by
/// cycle, task, kind and index.
pub fn rollouts(l: &Ledger, run: &str) -> Result<Vec<RolloutRow>> {
    rollouts_in(l, run, &run_streams(l, run)?)
}

/// [`rollouts`] given the run's streams (as [`run_streams`] lists them), for
/// a caller that has them already: listing them reads every stream's head.
pub fn rollouts_in(l: &Ledger, run: &str, streams: &[(String, Id)]) -> Result<Vec<RolloutRow>> {
    let mut heads = Vec::new();
    for &(_, head) in streams {
        if let Some(r) = facts::rollout_head(l, &l.get_event(&head)?)? {
            heads.push((head, r));
        }
    }
    rollouts_of(l, run, heads.iter().map(|(id, r)| (*id, r)))
}

/// [`rollouts_in`] given what each rollout head says of itself
/// ([`facts::rollout_head`]): looks up the run's rankings and selections.
pub(crate) fn rollouts_of<'a>(
    l: &Ledger,
    run: &str,
    heads: impl Iterator<Item = (Id, &'a facts::RolloutHead)>,
) -> Result<Vec<RolloutRow>> {
    let mut out = Vec::new();
    let mut members = RunMembers::new(l, run);
    let mut decisions = Decisions::new(l);
    for (head, r) in heads {
        let guard_excluded = r.guard_excluded;
        // Only a 0 of 0 can be a placeholder (an import lists it as not
        // recorded): other counts were measured, and their metadata is
        // not read (a read per rollout of a large run's report).
        let meta = match r.score_total {
            0 => l.get_meta(&head)?,
            _ => ledger::Meta::default(),
        };
        // A rollout shared with another run (a fork, a re-judge) may be
        // ranked and selected there too: only this run's decisions count.
        let mut ranked = None;
        for rk in decisions.rankings_of(&head)? {
            if members.holds(&rk.0)? {
                ranked = Some(rk);
            }
        }
        let me = ranked
            .as_ref()
            .and_then(|rk| rk.1.runs.iter().find(|x| id_of(x.rollout) == head).cloned());
        let mut selection = None;
        // The selection that read the run's ranking, or (a run kept out of
        // ranking, `mass.selection` v2) the one that names the run itself.
        let sel_of = match &ranked {
            Some(rk) => rk.0.id,
            None => head,
        };
        let mut selected = None;
        let sels = decisions.selections_of(&sel_of)?;
        for s in sels.iter() {
            if members.holds(&s.0)? {
                selected = Some(s);
            }
        }
        if let Some((sev, sel)) = selected {
            let rank = me.as_ref().map(|m| m.rank);
            selection = Some(selection_facts(sev, sel, &head, rank, None).decision);
        }
        if selection.is_none() && guard_excluded && r.purpose == "collect" {
            selection = Some("excluded".into());
        }
        out.push(RolloutRow {
            event: hex(&head),
            task: r.task.clone(),
            cycle: r.cycle,
            index: r.index,
            kind: match r.purpose.as_str() {
                "reference" => "reference",
                "inner" => "search candidate",
                "collect" => "collection",
                "eval" => "evaluation",
                other => other,
            }
            .to_string(),
            status: if guard_excluded {
                "excluded by a guard".to_string()
            } else {
                match r.status.as_str() {
                    "finished" => "completed",
                    "failed" => "infrastructure failure",
                    other => other,
                }
                .to_string()
            },
            checks_passed: recorded(&meta, "score_passed", r.score_passed),
            checks_total: recorded(&meta, "score_total", r.score_total),
            model: r.model.clone(),
            score: me.as_ref().map(|m| m.score),
            rank: me.as_ref().map(|m| m.rank),
            selection,
        });
    }
    out.sort_by(|a, b| {
        (a.cycle, &a.task, &a.kind, &a.model, a.index, &a.event)
            .cmp(&(b.cycle, &b.task, &b.kind, &b.model, b.index, &b.event))
    });
    Ok(out)
}

/// The ref under run `run` that holds stream `stream`: `RUN` for the main
/// stream, `RUN/<stream>` otherwise.
pub(crate) fn stream_ref(run: &str, stream: &str) -> String {
    if stream == "main" {
        run.to_string()
    } else {
        format!("{run}/{stream}")
    }
}

/// [`in_run`] for many events of one run: each stream asked about is walked
/// back from its head once, as far as the oldest event asked about, and the
/// events seen are kept. `rollouts` asks about every rollout's ranking and
/// selection, all on the main stream; walking it back afresh for each made
/// `mass runs` and `mass report` quadratic in the run's size (a 30k-event
/// run's report took 14 s). No event is read that `in_run` would not read,
/// so damage past the oldest event asked about stays unread, as before.
pub(crate) struct RunMembers<'a> {
    l: &'a Ledger,
    run: &'a str,
    walks: HashMap<String, Walk>,
}

/// How far one stream has been walked back.
struct Walk {
    /// The next event to read (`None`: no such stream, or its start
    /// reached). Advanced only past an event that was read, so a read that
    /// failed fails again for the next question, as `in_run`'s would.
    next: Option<Id>,
    /// Each event seen, with `in_run`'s answer for it: whether every event
    /// above it has a higher sequence number (`in_run` stops at the first
    /// that does not, which a chain pulled or imported with a sequence
    /// number rising somewhere can hold).
    seen: HashMap<Id, bool>,
    /// The lowest sequence number seen (`u64::MAX` before any).
    min_seq: u64,
}

impl<'a> RunMembers<'a> {
    pub(crate) fn new(l: &'a Ledger, run: &'a str) -> Self {
        RunMembers {
            l,
            run,
            walks: HashMap::new(),
        }
    }

    /// Whether `ev` is on one of the run's streams (as [`in_run`] says).
    pub(crate) fn holds(&mut self, ev: &Event) -> Result<bool> {
        let name = stream_ref(self.run, &ev.stream);
        let w = match self.walks.entry(name) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let next = self.l.head(v.key())?;
                v.insert(Walk {
                    next,
                    seen: HashMap::new(),
                    min_seq: u64::MAX,
                })
            }
        };
        if let Some(&held) = w.seen.get(&ev.id) {
            return Ok(held);
        }
        if w.min_seq <= ev.seq {
            // `in_run` would have stopped at an event already seen.
            return Ok(false);
        }
        while let Some(id) = w.next {
            let e = self.l.get_event(&id)?;
            w.next = e.prev;
            w.seen.insert(e.id, w.min_seq > e.seq);
            w.min_seq = w.min_seq.min(e.seq);
            if e.id == ev.id {
                return Ok(true);
            }
            if e.seq <= ev.seq {
                return Ok(false);
            }
        }
        Ok(false)
    }
}
