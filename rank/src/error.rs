//! The crate's single error type, [`RankError`].
//!
//! Every fallible function in this crate returns `Result<_, RankError>`. Each
//! variant carries the structured context a caller needs to report the problem
//! (the offending item, comparison index, line number, option value, ...) so the
//! CLI can print a precise message or record it in the ledger without parsing
//! strings. Nothing in this crate panics on bad input; it returns one of these.

use std::fmt;

/// A reference to one item in an error: its index and, when the caller supplied
/// item names (see [`crate::bt::fit_named`] and [`crate::jsonl`]), its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemLabel {
    /// Position of the item in the input (0-based).
    pub index: usize,
    /// Human-readable name, if known.
    pub name: Option<String>,
}

impl ItemLabel {
    /// A label with only an index.
    pub fn index(index: usize) -> Self {
        ItemLabel { index, name: None }
    }
}

impl fmt::Display for ItemLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "item {name:?} (index {})", self.index),
            None => write!(f, "item {}", self.index),
        }
    }
}

/// Why the pure maximum-likelihood Bradley-Terry fit does not exist.
///
/// The MLE exists iff, for every split of the items into two non-empty groups,
/// some item of each group beat (or tied) some item of the other (Ford 1957;
/// Hunter 2004, Assumption 1), i.e. the "beat or tied" graph is strongly
/// connected. When it is not, the likelihood keeps increasing as one group's
/// strength runs away from the others'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MleObstacle {
    /// The group never lost to (nor tied with) any item outside it: its
    /// strength goes to infinity.
    NeverLost,
    /// The group never beat (nor tied with) any item outside it: its strength
    /// goes to zero.
    NeverWon,
    /// The group was never compared with any item outside it at all, so the
    /// relative strength of the two parts is not identified.
    Disconnected,
}

/// What is wrong with one line of a comparisons JSONL file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineProblem {
    /// The line is not valid JSON; carries serde_json's message.
    InvalidJson(String),
    /// The line is valid JSON but not an object.
    NotAnObject {
        /// JSON type found instead (`"array"`, `"string"`, ...).
        got: &'static str,
    },
    /// A required field is absent.
    MissingField {
        /// The field name.
        field: &'static str,
    },
    /// A field has the wrong JSON type.
    WrongType {
        /// The field name.
        field: &'static str,
        /// The JSON type found.
        got: &'static str,
    },
    /// An item name is the empty string.
    EmptyName {
        /// The field name (`"a"` or `"b"`).
        field: &'static str,
    },
    /// `"winner"` is a string other than `"a"`, `"b"` or `"tie"`.
    BadWinner {
        /// The value found.
        got: String,
    },
    /// `"a"` and `"b"` name the same item.
    SameItem {
        /// The repeated name.
        name: String,
    },
}

impl fmt::Display for LineProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineProblem::InvalidJson(msg) => write!(f, "invalid JSON: {msg}"),
            LineProblem::NotAnObject { got } => write!(f, "expected a JSON object, got {got}"),
            LineProblem::MissingField { field } => write!(f, "missing field {field:?}"),
            LineProblem::WrongType {
                field: "winner",
                got,
            } => {
                write!(
                    f,
                    "field \"winner\" must be \"a\", \"b\" or \"tie\", got {got}"
                )
            }
            LineProblem::WrongType { field, got } => {
                write!(f, "field {field:?} must be a string, got {got}")
            }
            LineProblem::EmptyName { field } => {
                write!(f, "field {field:?} must be a non-empty string")
            }
            LineProblem::BadWinner { got } => {
                write!(
                    f,
                    "field \"winner\" must be \"a\", \"b\" or \"tie\", got {got:?}"
                )
            }
            LineProblem::SameItem { name } => {
                write!(f, "fields \"a\" and \"b\" name the same item {name:?}")
            }
        }
    }
}

/// Every error this crate returns.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RankError {
    // ---- Bradley-Terry -------------------------------------------------
    /// A comparison refers to an item index `>= n_items`.
    #[error("comparison {comparison}: item index {item} is out of range (n_items = {n_items})")]
    ItemOutOfRange {
        /// Index of the comparison in the input slice.
        comparison: usize,
        /// The offending item index.
        item: usize,
        /// Number of items the fit was asked for.
        n_items: usize,
    },
    /// More items than the chosen fit supports (a guard against allocating
    /// unbounded memory for absurd input).
    #[error("too many items: {n_items} (at most {max} for this prior)")]
    TooManyItems {
        /// Items requested.
        n_items: usize,
        /// The limit ([`crate::bt::MAX_ITEMS`] or [`crate::bt::MAX_L2_ITEMS`]).
        max: usize,
    },
    /// A comparison has the same item on both sides.
    #[error("comparison {comparison}: {item} is compared with itself")]
    SelfComparison {
        /// Index of the comparison in the input slice.
        comparison: usize,
        /// The item.
        item: ItemLabel,
    },
    /// `fit_named` was given a number of names different from what it needs,
    /// or an option has an invalid value.
    #[error("invalid option {option}: {reason}")]
    InvalidOption {
        /// Which option.
        option: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Pure MLE (`Prior::None`) was requested but an item has no comparisons,
    /// so its strength is not identified.
    #[error("{item} has no comparisons; its maximum-likelihood score is undefined (use a prior)")]
    NoComparisons {
        /// The item.
        item: ItemLabel,
    },
    /// Pure MLE (`Prior::None`) was requested but the comparison graph is not
    /// strongly connected in the win direction, so the maximum does not exist
    /// (some scores would have to be infinite).
    #[error("maximum-likelihood fit does not exist: {}", mle_message(item, *group_size, *obstacle))]
    MleDoesNotExist {
        /// One item of the offending group (its lowest index).
        item: ItemLabel,
        /// Number of items in the group (1 for a single undefeated item).
        group_size: usize,
        /// How the group is separated from the other items.
        obstacle: MleObstacle,
    },
    /// The iteration produced a non-finite strength (should not happen for
    /// valid input; reported instead of returning NaN/inf).
    #[error("numerical failure at iteration {iteration}: {what}")]
    Numerical {
        /// Iteration at which it was detected.
        iteration: usize,
        /// What went wrong.
        what: String,
    },

    // ---- schedule ------------------------------------------------------
    /// The requested pairing schedule cannot exist.
    #[error("no connected {opponents}-regular pairing schedule on {n_runs} runs: {reason}")]
    Schedule {
        /// Number of runs requested.
        n_runs: usize,
        /// Opponents per run requested.
        opponents: usize,
        /// Why it is impossible.
        reason: &'static str,
    },

    // ---- win rate ------------------------------------------------------
    /// A binomial interval was asked for impossible counts.
    #[error("invalid counts: {successes} successes out of {trials} trials")]
    InvalidCounts {
        /// Successes given.
        successes: u64,
        /// Trials given.
        trials: u64,
    },
    /// A binomial interval was asked for with zero trials.
    #[error("no trials: a win rate needs at least one decisive (non-tie) outcome")]
    NoTrials,
    /// The z multiplier of an interval is negative or not finite.
    #[error("invalid z value {z}: must be finite and >= 0")]
    InvalidZ {
        /// The value given.
        z: f64,
    },

    // ---- JSONL ---------------------------------------------------------
    /// A line of a comparisons file is malformed (1-based line number).
    #[error("line {line}: {problem}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        problem: LineProblem,
    },
    /// Reading the comparisons input failed.
    #[error("line {line}: read error: {message}")]
    Io {
        /// 1-based number of the line being read.
        line: usize,
        /// The I/O error's message (kept as text so the error stays `Clone`).
        message: String,
    },
}

fn mle_message(item: &ItemLabel, group_size: usize, obstacle: MleObstacle) -> String {
    let (subject, outside) = match group_size {
        0 | 1 => (item.to_string(), "any other item"),
        2 => (
            format!("{item} and 1 other item"),
            "any item outside that group",
        ),
        n => (
            format!("{item} and {} other items", n - 1),
            "any item outside that group",
        ),
    };
    let verb = match obstacle {
        MleObstacle::NeverLost => "never lost to",
        MleObstacle::NeverWon => "never beat",
        MleObstacle::Disconnected => "were never compared with",
    };
    let verb = if group_size <= 1 && obstacle == MleObstacle::Disconnected {
        "was never compared with"
    } else {
        verb
    };
    format!("{subject} {verb} {outside}, so the scores diverge (use a prior)")
}
