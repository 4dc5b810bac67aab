//! `mass diff RUN_A RUN_B`: where two runs diverge and what differs in
//! their decisions. Typical use: a re-judged run against its source, or a
//! fork against the run it was taken from.
//!
//! Streams are compared by their name relative to the run (`c1/t/pair/003`
//! in both `A/...` and `B/...`): the events both share from the start, and
//! the first that differ. Decisions are compared by what they are about:
//! promotions by stream and iteration (accepted or not), verdicts by
//! judgment stream, and by the pair of rollouts judged where only one run
//! holds the stream (which one won), rankings and selections by cycle and
//! task (rollout ids, which a re-judge shares with its source), datasets and
//! training steps by cycle. This reads every event of both runs once: a
//! diff is a scan of two runs, not an index lookup.

use std::collections::{BTreeMap, BTreeSet};

use ledger::{Event, Id, Ledger};
use schemas::{Dataset, Decodable, Judgment, Promotion, Ranking, Selection, Training};
use serde::Serialize;

use super::{decode, hex};
use engine::error::{EngineError, Result};

/// At most this many streams are named in the divergence list.
const NAMED: usize = 20;

#[derive(Debug, Clone, Serialize)]
pub struct RunDiff {
    pub a: String,
    pub b: String,
    pub main: Divergence,
    pub identical_streams: u32,
    pub diverged_streams: u32,
    pub only_in_a: u32,
    pub only_in_b: u32,
    /// The first diverged streams, in name order (at most 20).
    pub diverged: Vec<Divergence>,
    pub cycles: Vec<CycleDiff>,
}

/// How one stream compares: events shared from the start, then the first
/// event of each run past them (none: the stream ends there).
#[derive(Debug, Clone, Serialize)]
pub struct Divergence {
    pub stream: String,
    pub shared: u64,
    pub a: Option<String>,
    pub b: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct CycleDiff {
    pub cycle: u32,
    /// Promotions decided differently: `stream iteration k: A accepted, B rejected`.
    pub champions: Vec<String>,
    /// Verdicts compared (on a judgment stream both runs hold, else on a
    /// pair of rollouts both judged), and those that name another winner.
    pub verdicts_compared: u32,
    pub verdicts_changed: u32,
    pub changed_verdicts: Vec<String>,
    /// Per task: how many rollouts ranked in both runs changed rank.
    pub rankings: Vec<String>,
    /// Per task: rollouts in training only in A, only in B.
    pub selections: Vec<String>,
    pub dataset: Option<String>,
    pub training: Option<String>,
}

/// What a run recorded, by stream name relative to the run.
#[derive(Default)]
struct Recorded {
    streams: BTreeMap<String, Vec<Event>>,
}

fn recorded(l: &Ledger, run: &str) -> Result<Recorded> {
    let head = l
        .head(run)?
        .ok_or_else(|| EngineError::Invalid(format!("no run named {run:?}")))?;
    let mut out = Recorded::default();
    let mut heads = vec![(String::new(), head)];
    heads.extend(super::run_streams(l, run)?);
    for (rel, h) in heads {
        let mut evs = l.chain(h).collect::<std::result::Result<Vec<_>, _>>()?;
        evs.reverse();
        out.streams.insert(rel, evs);
    }
    Ok(out)
}

fn divergence(stream: &str, a: &[Event], b: &[Event]) -> Divergence {
    let shared = a.iter().zip(b).take_while(|(x, y)| x.id == y.id).count();
    let describe = |e: Option<&Event>| e.map(|e| format!("{} {}", e.id.short(12), e.kind));
    Divergence {
        stream: if stream.is_empty() {
            "(main)".into()
        } else {
            stream.into()
        },
        shared: shared as u64,
        a: describe(a.get(shared)),
        b: describe(b.get(shared)),
    }
}

/// The cycle a stream belongs to, from its name (`c3/...`).
fn cycle_of(stream: &str) -> Option<u32> {
    stream.strip_prefix('c')?.split('/').next()?.parse().ok()
}

/// Every training step in `events`, of any recorded version.
fn trainings(events: &[Event]) -> Result<Vec<Training>> {
    events
        .iter()
        .filter_map(Training::read)
        .map(|t| t.map_err(|e| EngineError::recording("mass.training", e)))
        .collect()
}

fn all_of<T: Decodable>(events: &[Event]) -> Result<Vec<T>> {
    events
        .iter()
        .filter(|e| e.kind == T::KIND && e.version == T::VERSION)
        .map(decode)
        .collect()
}

/// The selections among `events`, of any recorded version.
fn selections(events: &[Event]) -> Result<Vec<Selection>> {
    events
        .iter()
        .filter_map(Selection::read)
        .map(|s| s.map_err(|e| EngineError::recording("mass.selection", e)))
        .collect()
}

pub fn diff(l: &Ledger, a: &str, b: &str) -> Result<RunDiff> {
    let (ra, rb) = (recorded(l, a)?, recorded(l, b)?);
    let empty = Vec::new();
    let main = divergence(
        "",
        ra.streams.get("").unwrap_or(&empty),
        rb.streams.get("").unwrap_or(&empty),
    );
    let names: BTreeSet<&String> = ra.streams.keys().chain(rb.streams.keys()).collect();
    let mut d = RunDiff {
        a: a.into(),
        b: b.into(),
        main,
        identical_streams: 0,
        diverged_streams: 0,
        only_in_a: 0,
        only_in_b: 0,
        diverged: Vec::new(),
        cycles: Vec::new(),
    };
    let mut cycles: BTreeMap<u32, CycleDiff> = BTreeMap::new();
    for name in names.into_iter().filter(|n| !n.is_empty()) {
        let (Some(ea), Some(eb)) = (ra.streams.get(name), rb.streams.get(name)) else {
            if ra.streams.contains_key(name) {
                d.only_in_a += 1;
            } else {
                d.only_in_b += 1;
            }
            continue;
        };
        let ids = |e: &[Event]| e.iter().map(|x| x.id).collect::<Vec<Id>>();
        if ids(ea) == ids(eb) {
            d.identical_streams += 1;
            continue;
        }
        d.diverged_streams += 1;
        if d.diverged.len() < NAMED {
            d.diverged.push(divergence(name, ea, eb));
        }
        let Some(cycle) = cycle_of(name) else {
            continue;
        };
        let c = cycle_entry(&mut cycles, cycle);
        let (pa, pb) = (all_of::<Promotion>(ea)?, all_of::<Promotion>(eb)?);
        c.champions.extend(changed_promotions(name, a, b, &pa, &pb));
    }
    verdicts(&ra, &rb, a, b, &mut cycles)?;
    decisions(&ra, &rb, a, b, &mut cycles)?;
    d.cycles = cycles.into_values().collect();
    Ok(d)
}

/// A judged pair of rollouts in a cycle, either way round: what a verdict
/// is about.
type Pair = (u32, [u8; 32], [u8; 32]);

/// A verdict as `verdicts` compares it: the stream it is on, the pair it
/// judged, and the rollout that won (its id's first 12 hex digits,
/// whatever the presentation order) or the verdict when none did (`tie`,
/// `invalid`).
struct Verdict<'r> {
    stream: &'r str,
    pair: Pair,
    winner: String,
}

/// Every verdict of a run, by stream name, each stream's in log order.
fn judged(r: &Recorded) -> Result<BTreeMap<&str, Vec<Verdict<'_>>>> {
    let mut out: BTreeMap<&str, Vec<Verdict<'_>>> = BTreeMap::new();
    for (name, events) in &r.streams {
        let Some(cycle) = cycle_of(name) else {
            continue;
        };
        for j in all_of::<Judgment>(events)? {
            let winner = match j.winner.as_str() {
                "a" => hex(&Id(j.a.0))[..12].to_string(),
                "b" => hex(&Id(j.b.0))[..12].to_string(),
                other => other.to_string(),
            };
            out.entry(name.as_str()).or_default().push(Verdict {
                stream: name.as_str(),
                pair: (cycle, j.a.0.min(j.b.0), j.a.0.max(j.b.0)),
                winner,
            });
        }
    }
    Ok(out)
}

/// A run's verdicts on the streams the other run lacks, by the pair of
/// rollouts they judged, each pair's in stream-name then log order.
fn unmatched<'v, 'r>(
    own: &'v BTreeMap<&'r str, Vec<Verdict<'r>>>,
    other: &BTreeMap<&'r str, Vec<Verdict<'r>>>,
) -> BTreeMap<Pair, Vec<&'v Verdict<'r>>> {
    let mut m: BTreeMap<Pair, Vec<&Verdict<'r>>> = BTreeMap::new();
    for (_, vs) in own.iter().filter(|(n, _)| !other.contains_key(*n)) {
        for v in vs {
            m.entry(v.pair).or_default().push(v);
        }
    }
    m
}

/// Verdicts compared: on a judgment stream both runs hold, the k-th
/// verdict of one against the k-th of the other (one judge's against the
/// same judge's); the verdicts on streams only one run holds, by the pair
/// of rollouts they judged (an imported run keeps a task's verdicts on one
/// stream, where a re-judge writes one per pair), the k-th on a pair
/// against the k-th. A pair only one run judged is not compared.
fn verdicts(
    ra: &Recorded,
    rb: &Recorded,
    a: &str,
    b: &str,
    cycles: &mut BTreeMap<u32, CycleDiff>,
) -> Result<()> {
    let (va, vb) = (judged(ra)?, judged(rb)?);
    let mut compare = |x: &Verdict<'_>, y: &Verdict<'_>| {
        let c = cycle_entry(cycles, x.pair.0);
        c.verdicts_compared += 1;
        if x.winner != y.winner {
            c.verdicts_changed += 1;
            if c.changed_verdicts.len() < NAMED {
                c.changed_verdicts.push(format!(
                    "{}: {a}: {}, {b}: {}",
                    x.stream, x.winner, y.winner
                ));
            }
        }
    };
    for (name, xs) in &va {
        if let Some(ys) = vb.get(name) {
            xs.iter().zip(ys).for_each(|(x, y)| compare(x, y));
        }
    }
    let (pa, pb) = (unmatched(&va, &vb), unmatched(&vb, &va));
    for (pair, xs) in &pa {
        if let Some(ys) = pb.get(pair) {
            xs.iter().zip(ys).for_each(|(x, y)| compare(x, y));
        }
    }
    Ok(())
}

/// Rankings, selections, datasets and training steps on the main streams.
fn decisions(
    ra: &Recorded,
    rb: &Recorded,
    a: &str,
    b: &str,
    cycles: &mut BTreeMap<u32, CycleDiff>,
) -> Result<()> {
    let empty = Vec::new();
    let (ma, mb) = (
        ra.streams.get("").unwrap_or(&empty),
        rb.streams.get("").unwrap_or(&empty),
    );
    let key = |r: &Ranking| (r.cycle, r.task.clone());
    let rank_a: BTreeMap<_, Ranking> = all_of::<Ranking>(ma)?
        .into_iter()
        .map(|r| (key(&r), r))
        .collect();
    let rank_b: BTreeMap<_, Ranking> = all_of::<Ranking>(mb)?
        .into_iter()
        .map(|r| (key(&r), r))
        .collect();
    for ((cycle, task), x) in &rank_a {
        let Some(y) = rank_b.get(&(*cycle, task.clone())) else {
            continue;
        };
        let ranks = |r: &Ranking| -> BTreeMap<[u8; 32], u32> {
            r.runs.iter().map(|x| (x.rollout.0, x.rank)).collect()
        };
        let (kx, ky) = (ranks(x), ranks(y));
        let moved = kx
            .iter()
            .filter(|(id, r)| ky.get(*id).is_some_and(|s| s != *r))
            .count();
        if moved > 0 || kx.len() != ky.len() {
            cycle_entry(cycles, *cycle).rankings.push(format!(
                "{task}: {moved} of {} rollouts ranked in both changed rank ({a} ranked {}, {b} {})",
                kx.keys().filter(|k| ky.contains_key(*k)).count(),
                kx.len(),
                ky.len()
            ));
        }
    }
    let sel_key = |s: &Selection| (s.cycle, s.task.clone());
    let sel_b: BTreeMap<_, Selection> = selections(mb)?
        .into_iter()
        .map(|s| (sel_key(&s), s))
        .collect();
    for x in selections(ma)? {
        let Some(y) = sel_b.get(&sel_key(&x)) else {
            continue;
        };
        let set = |s: &Selection| s.train.iter().map(|h| h.0).collect::<BTreeSet<_>>();
        let (sx, sy) = (set(&x), set(y));
        let (only_a, only_b) = (sx.difference(&sy).count(), sy.difference(&sx).count());
        if only_a + only_b > 0 {
            cycle_entry(cycles, x.cycle).selections.push(format!(
                "{}: {only_a} rollout(s) in training only in {a}, {only_b} only in {b}",
                x.task
            ));
        }
    }
    let ds_b: BTreeMap<u32, Dataset> = all_of::<Dataset>(mb)?
        .into_iter()
        .map(|d| (d.cycle, d))
        .collect();
    for x in all_of::<Dataset>(ma)? {
        if let Some(y) = ds_b.get(&x.cycle) {
            let same = x.train == y.train && x.validation == y.validation;
            cycle_entry(cycles, x.cycle).dataset = Some(if same {
                "identical".into()
            } else {
                format!(
                    "differs: {a} {} train / {} validation examples, {b} {} / {}",
                    x.train_examples,
                    x.validation_examples,
                    y.train_examples,
                    y.validation_examples
                )
            });
        }
    }
    let tr_b: BTreeMap<u32, Training> = trainings(mb)?.into_iter().map(|t| (t.cycle, t)).collect();
    for x in trainings(ma)? {
        if let Some(y) = tr_b.get(&x.cycle) {
            cycle_entry(cycles, x.cycle).training = Some(if x.new_model == y.new_model {
                format!("same model {}", x.new_model)
            } else {
                format!(
                    "{a} -> {} (validation loss {:.4}), {b} -> {} ({:.4})",
                    x.new_model, x.validation_loss, y.new_model, y.validation_loss
                )
            });
        }
    }
    Ok(())
}

/// Promotions of one stream decided differently, matched by iteration (an
/// iteration whose proposal never became valid has no promotion, so the
/// two lists need not line up by position).
fn changed_promotions(
    stream: &str,
    a: &str,
    b: &str,
    pa: &[Promotion],
    pb: &[Promotion],
) -> Vec<String> {
    let word = |p: &Promotion| if p.accepted { "accepted" } else { "rejected" };
    let by_iteration: BTreeMap<u32, &Promotion> = pb.iter().map(|p| (p.iteration, p)).collect();
    pa.iter()
        .filter_map(|x| {
            let y = by_iteration.get(&x.iteration)?;
            (x.accepted != y.accepted).then(|| {
                format!(
                    "{stream} iteration {}: {a} {}, {b} {}",
                    x.iteration,
                    word(x),
                    word(y)
                )
            })
        })
        .collect()
}

fn cycle_entry(cycles: &mut BTreeMap<u32, CycleDiff>, cycle: u32) -> &mut CycleDiff {
    cycles.entry(cycle).or_insert_with(|| CycleDiff {
        cycle,
        ..CycleDiff::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn promotion(iteration: u32, accepted: bool) -> Promotion {
        Promotion {
            iteration,
            accepted,
            ..<Promotion as schemas::Record>::sample()
        }
    }

    /// Regression: promotions were paired by position, so a run whose
    /// iteration 3 had no valid proposal compared its iteration 4 with the
    /// other run's iteration 3.
    #[test]
    fn promotions_are_matched_by_iteration_not_position() {
        let a = [promotion(1, false), promotion(2, false), promotion(4, true)];
        let b = [
            promotion(1, false),
            promotion(2, false),
            promotion(3, false),
            promotion(4, true),
        ];
        assert!(changed_promotions("s", "A", "B", &a, &b).is_empty());
        let b = [promotion(2, true), promotion(4, true)];
        assert_eq!(
            changed_promotions("s", "A", "B", &a, &b),
            ["s iteration 2: A rejected, B accepted"]
        );
    }
}
