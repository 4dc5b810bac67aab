//! Replay answering: a request matched against the route's recording and
//! answered with the recorded reply, chunk for chunk (a body that broke off
//! breaks off again), or, in mixed mode, a miss handed back to be forwarded
//! upstream.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hyper::Response;

use super::body::ProxyBody;
use super::pending::Pending;
use super::service::{proxy_error, unreachable_response, Received};
use super::{lock, Flight};
use crate::book::Answer;
use crate::log::{RecordedOutcome, Timing};
use crate::route::{Route, Upstream};

pub(super) type Fallback = (Upstream, Received, Flight);

/// Answers from the recording; a miss in mixed mode comes back as the
/// upstream to forward to.
pub(super) async fn from_book(
    route: &Arc<Route>,
    book: &Mutex<crate::book::Book>,
    fallback: Option<&Upstream>,
    r: Received,
    flight: Flight,
) -> Result<Response<ProxyBody>, Fallback> {
    let answer = {
        let mut b = lock(book);
        b.answer_with(&r.method, &r.path, &r.body, &r.known)
            .map(|a| match a {
                Answer::Hit(i) => Ok((b.exchange(i).clone(), b.ledger().clone())),
                Answer::Miss(m) => Err(m),
            })
    };
    match answer {
        Err(e) => Ok(proxy_error(
            500,
            "mass_proxy_recording_unreadable",
            &r.known.text(&e.to_string()),
        )),
        Ok(Ok((rec, ledger))) => Ok(serve_recorded(route, &rec, &ledger, r, flight).await),
        Ok(Err(miss)) => match fallback {
            Some(u) => Err((u.clone(), r, flight)),
            None => {
                let report = r.known.text(&miss.report);
                lock(&route.misses).push(report.clone());
                Ok(proxy_error(400, "mass_replay_miss", &report))
            }
        },
    }
}

/// The recorded chunks of a body, as they came.
fn rechunk(bytes: &[u8], chunks: &[usize]) -> VecDeque<Bytes> {
    let mut q = VecDeque::new();
    let mut at = 0;
    for &n in chunks {
        let end = (at + n).min(bytes.len());
        q.push_back(Bytes::copy_from_slice(&bytes[at..end]));
        at = end;
    }
    if at < bytes.len() {
        q.push_back(Bytes::copy_from_slice(&bytes[at..]));
    }
    q
}

async fn serve_recorded(
    route: &Arc<Route>,
    rec: &crate::log::Recorded,
    ledger: &ledger::Ledger,
    r: Received,
    flight: Flight,
) -> Response<ProxyBody> {
    let served_by = format!("recording {} event {}", route.label, rec.event.to_hex());
    let bytes = match &rec.reply {
        RecordedOutcome::Http { body: Some(id), .. } => match ledger.get_blob(id) {
            Ok(b) => b,
            Err(e) => {
                return proxy_error(
                    500,
                    "mass_proxy_recording_unreadable",
                    &format!("the recorded response {} is unreadable: {e}", id.short(12)),
                )
            }
        },
        _ => Vec::new(),
    };
    let resp = match &rec.reply {
        RecordedOutcome::Unreachable(detail) => match rec.failure.as_deref() {
            Some(crate::log::failure::CLIENT_CANCELLED) => proxy_error(
                499,
                "mass_client_cancelled",
                &format!("mass proxy replay: when recorded, {detail}"),
            ),
            _ => unreachable_response(detail),
        },
        RecordedOutcome::Http {
            status,
            headers,
            chunks,
            cut,
            ..
        } => {
            // A body that broke off (or was stopped) breaks off again.
            let mut resp = Response::new(ProxyBody::recorded(rechunk(&bytes, chunks), cut.clone()));
            *resp.status_mut() =
                hyper::StatusCode::from_u16(*status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
            for (k, v) in headers {
                if let (Ok(k), Ok(v)) = (
                    hyper::header::HeaderName::from_bytes(k.as_bytes()),
                    hyper::header::HeaderValue::from_str(v),
                ) {
                    resp.headers_mut().append(k, v);
                }
            }
            resp
        }
    };
    if route.records() {
        let us = r.t0.elapsed().as_micros() as u64;
        let outcome = rec.outcome(bytes);
        let timing = Timing {
            headers_us: us,
            chunks_us: Vec::new(),
            total_us: us,
        };
        let mut p = Pending::new(route, &r, served_by, flight);
        p.body = r.body;
        p.finish(outcome, timing).await;
    }
    resp
}
