//! Projections: state as a pure fold over a stream's events (no I/O inside a
//! fold), rebuildable from any head.

use ledger::{Event, Id, Ledger};

use crate::error::Result;

/// A pure fold over events, oldest first.
pub trait Projection {
    type State;
    fn init(&self) -> Self::State;
    /// Applies one event. Must not perform I/O: everything it needs is in the event.
    fn apply(&self, state: &mut Self::State, event: &Event) -> Result<()>;
}

/// Folds the stream ending at `head` from its first event.
pub fn fold<P: Projection>(ledger: &Ledger, head: Option<Id>, p: &P) -> Result<P::State> {
    let mut events = Vec::new();
    if let Some(h) = head {
        for ev in ledger.chain(h) {
            events.push(ev?);
        }
    }
    events.reverse();
    fold_events(&events, p)
}

/// Folds already-loaded events (oldest first).
pub fn fold_events<P: Projection>(events: &[Event], p: &P) -> Result<P::State> {
    let mut s = p.init();
    for e in events {
        p.apply(&mut s, e)?;
    }
    Ok(s)
}
