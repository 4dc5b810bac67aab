//! An exchange on its way to the route's writer. Finished, it is queued
//! for recording; dropped unfinished (hyper drops the handler when the
//! client goes away), it is still recorded, as cancelled by the client.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::service::Received;
use super::Flight;
use crate::log::{Exchange, Outcome, Stop, Timing};
use crate::route::Route;
use crate::scrub::Needles;

/// An exchange forwarded and not yet queued for the writer. Dropped
/// unfinished, it is recorded as cancelled by the client: hyper drops the
/// handler (and with it the upstream request) when the client's connection
/// closes before the upstream answered.
pub(super) struct Pending {
    pub(super) route: Arc<Route>,
    pub(super) method: String,
    pub(super) path: String,
    pub(super) body: Bytes,
    pub(super) user_agent: Option<String>,
    pub(super) served_by: String,
    pub(super) t0: Instant,
    pub(super) known: Needles,
    pub(super) flight: Option<Flight>,
}

impl Pending {
    pub(super) fn new(
        route: &Arc<Route>,
        r: &Received,
        served_by: String,
        flight: Flight,
    ) -> Pending {
        Pending {
            route: route.clone(),
            method: r.method.clone(),
            path: r.path.clone(),
            body: r.body.clone(),
            user_agent: r.user_agent.clone(),
            served_by,
            t0: r.t0,
            known: r.known.clone(),
            flight: Some(flight),
        }
    }

    fn exchange(&mut self, outcome: Outcome, timing: Timing) -> Exchange {
        Exchange {
            method: std::mem::take(&mut self.method),
            path: std::mem::take(&mut self.path),
            body: std::mem::take(&mut self.body).to_vec(),
            user_agent: self.user_agent.take(),
            outcome,
            timing,
            served_by: std::mem::take(&mut self.served_by),
        }
    }

    pub(super) fn at_once(&self) -> Timing {
        let us = self.t0.elapsed().as_micros() as u64;
        Timing {
            headers_us: us,
            chunks_us: Vec::new(),
            total_us: us,
        }
    }

    /// Queues the exchange for the writer (waiting while its queue is full).
    pub(super) async fn finish(mut self, outcome: Outcome, timing: Timing) {
        let ex = self.exchange(outcome, timing);
        let known = std::mem::take(&mut self.known);
        let flight = self.flight.take();
        self.route.queue(ex, known).await;
        drop(flight);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(flight) = self.flight.take() else {
            return;
        };
        // Counted before anything else, so a `Route::finish` that follows
        // the client's going away waits for this record.
        let hold = self.route.hold();
        let timing = self.at_once();
        let ex = self.exchange(
            Outcome::Stopped {
                stop: Stop::ClientGone,
                detail: "the client closed its connection before the upstream answered".into(),
                reply: None,
            },
            timing,
        );
        let (route, known) = (self.route.clone(), std::mem::take(&mut self.known));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                route.queue(ex, known).await;
                drop(flight);
                drop(hold);
            });
        }
    }
}
