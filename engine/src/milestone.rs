//! The stages of a cycle by name, and the main stream read as their
//! milestones: every step a cycle records on its run's main stream closes
//! work of one stage (`stages/` writes them). `mass fork --cycle C --stage
//! NAME` forks right before a stage, `mass rejudge --cycle C` right before
//! judging, and `mass report` times each stage by these milestones. A read
//! side: it names what the stages recorded and depends on none of them.

use ledger::{Event, Id};

/// A stage of a MASS cycle, in the order a cycle runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// The inner loop: a workflow per training task.
    Search,
    /// Runs of each champion workflow.
    Collect,
    /// Pairwise judging of the collected runs.
    Judge,
    /// A Bradley-Terry fit per task.
    Rank,
    /// Training and validation runs per task.
    Select,
    /// The training data, rendered and stripped.
    Dataset,
    /// Training, and promotion of the trained model.
    Train,
    /// Bare-task runs of the new model against its baselines, judged.
    Evaluate,
}

impl Stage {
    pub const ALL: [Stage; 8] = [
        Stage::Search,
        Stage::Collect,
        Stage::Judge,
        Stage::Rank,
        Stage::Select,
        Stage::Dataset,
        Stage::Train,
        Stage::Evaluate,
    ];

    /// The stage's name, as commands take and print it.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Search => "search",
            Stage::Collect => "collect",
            Stage::Judge => "judge",
            Stage::Rank => "rank",
            Stage::Select => "select",
            Stage::Dataset => "dataset",
            Stage::Train => "train",
            Stage::Evaluate => "evaluate",
        }
    }

    /// The stage named `name`, if there is one.
    pub fn named(name: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.name() == name.trim())
    }

    /// Every stage name, for messages.
    pub fn names() -> String {
        Stage::ALL.map(Stage::name).join(", ")
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The cycle and stage a main-stream step closes work of, if it is one a
/// cycle records. Reads the record's kind and cycle number (any recorded
/// version), and a note's `cycle N: ` text.
pub fn closes(ev: &Event) -> Option<(u32, Stage)> {
    let stage = match ev.kind.as_str() {
        "note" => return note_closes(ev),
        "mass.ranking" => Stage::Rank,
        "mass.selection" => Stage::Select,
        "mass.dataset" => Stage::Dataset,
        "mass.training" => Stage::Train,
        "mass.evaluation" | "mass.cycle" => Stage::Evaluate,
        _ => return None,
    };
    Some((cycle_of(ev)?, stage))
}

/// The `cycle` field of a ranking, selection, dataset, training,
/// evaluation or cycle record: decoded as its type when it is the current
/// version, else read from its JSON description (any older version). The
/// description builds the whole record as JSON, which made the report's
/// time per stage a sizable part of a large run's report.
fn cycle_of(ev: &Event) -> Option<u32> {
    macro_rules! typed {
        ($($t:ty),*) => {$(
            if ev.kind == <$t as schemas::Record>::KIND && ev.version == <$t as schemas::Record>::VERSION {
                return schemas::decode_event::<$t>(ev).ok().map(|r| r.cycle);
            }
        )*};
    }
    typed!(
        schemas::Ranking,
        schemas::Selection,
        schemas::Dataset,
        schemas::Training,
        schemas::Evaluation,
        schemas::Cycle
    );
    let v = schemas::describe(&ev.kind, ev.version, &ev.payload).ok()?;
    u32::try_from(v.get("cycle")?.as_u64()?).ok()
}

/// The notes a cycle's stages record (`stages/`): their texts are part of
/// the recorded runs, so these patterns read runs of every driver version.
fn note_closes(ev: &Event) -> Option<(u32, Stage)> {
    let text = schemas::decode_event::<schemas::Note>(ev).ok()?.text;
    let rest = text.strip_prefix("cycle ")?;
    let (n, what) = rest.split_once(": ")?;
    let cycle: u32 = n.parse().ok()?;
    let stage = if what == "reference runs done" || what.starts_with("inner iteration ") {
        Stage::Search
    } else if what.starts_with("collection done") {
        Stage::Collect
    } else if what.ends_with("comparison(s) judged") {
        Stage::Judge
    } else if what.starts_with("no training data")
        || what.starts_with("dataset recorded, not trained")
    {
        Stage::Train
    } else {
        return None;
    };
    Some((cycle, stage))
}

/// Where a fork must be taken for stage `stage` of cycle `cycle` to run
/// again with the fork's overrides: the last main-stream step before the
/// stage's first (a fork's overrides apply from right after the step it is
/// taken at). Ranking and selection run task by task, each ranking followed
/// by its selection, so both start where judging ended. The sandbox note
/// the driver writes once a run could start belongs to the start: before
/// cycle 1's search the fork is taken at the step before it, where the
/// driver applies overrides before it chooses tasks, builds backends and
/// checks the sandbox. The search of the cycle after the last recorded one
/// starts after that cycle's record. `main` is the run's main stream in
/// order. A run that stopped before the stage is forked at its last step.
/// `None`: the run recorded no step of cycle `cycle` (nor, for its search,
/// the end of the cycle before).
pub fn fork_point(main: &[Event], cycle: u32, stage: Stage) -> Option<Id> {
    let key = |c: u32, s: Stage| (c, if s == Stage::Select { Stage::Rank } else { s });
    let target = key(cycle, stage);
    if !main
        .iter()
        .any(|e| closes(e).is_some_and(|(c, _)| c == cycle))
    {
        return match (stage, cycle.checked_sub(1)) {
            (Stage::Search, Some(previous)) if previous > 0 => {
                last_step(main, previous, Stage::Evaluate)
            }
            _ => None,
        };
    }
    let mut point = None;
    for (i, e) in main.iter().enumerate() {
        match closes(e) {
            Some((c, s)) if key(c, s) >= target => break,
            _ if is_start_note(e) => point = i.checked_sub(1).map(|p| main[p].id),
            _ => point = Some(e.id),
        }
    }
    point
}

/// The note on the sandbox level in force that the driver writes once a
/// run could start (`driver.rs`): part of the run's start.
fn is_start_note(ev: &Event) -> bool {
    ev.kind == "note"
        && schemas::decode_event::<schemas::Note>(ev).is_ok_and(|n| n.text.starts_with("sandbox: "))
}

/// The step that closes stage `stage` of cycle `cycle` (its last), if the
/// run recorded one.
pub fn last_step(main: &[Event], cycle: u32, stage: Stage) -> Option<Id> {
    main.iter()
        .rev()
        .find(|e| closes(e) == Some((cycle, stage)))
        .map(|e| e.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_order() {
        for (i, s) in Stage::ALL.into_iter().enumerate() {
            assert_eq!(Stage::named(s.name()), Some(s));
            assert_eq!(Stage::ALL.iter().position(|x| *x == s), Some(i));
        }
        assert_eq!(Stage::named("judging"), None);
        assert_eq!(
            Stage::names(),
            "search, collect, judge, rank, select, dataset, train, evaluate"
        );
    }
}
