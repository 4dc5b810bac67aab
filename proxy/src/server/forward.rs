//! Forwarding upstream: the request sent as received (hop-by-hop headers,
//! `accept-encoding` and, when the route replaces them, the client's
//! credentials left out), the response passed on chunk by chunk with any
//! secret masked, and the exchange recorded once the body has ended, with
//! how it ended.

use std::sync::Arc;

use bytes::Bytes;
use hyper::Response;
use tokio::sync::mpsc;

use super::body::{Aborted, ProxyBody};
use super::pending::Pending;
use super::service::{proxy_error, unreachable_response, Received};
use super::{Flight, State};
use crate::log::{HttpReply, Outcome, Stop, Timing};
use crate::route::{Route, Upstream};
use crate::scrub::{self, Needles};

/// Credential headers the client's request loses when the route replaces
/// them (its token must not reach the upstream).
fn is_credential_header(name: &str) -> bool {
    matches!(
        name.to_ascii_lowercase().as_str(),
        "authorization" | "proxy-authorization" | "api-key" | "x-api-key"
    )
}

pub(super) async fn forward(
    st: &State,
    route: &Arc<Route>,
    upstream: &Upstream,
    r: Received,
    flight: Flight,
) -> Response<ProxyBody> {
    let url = upstream.url(&r.path);
    let m = reqwest::Method::from_bytes(r.method.as_bytes()).unwrap_or(reqwest::Method::POST);
    let mut rb = st.client.request(m, &url);
    let replace = route.replaces_credentials(upstream);
    for (k, v) in &r.headers {
        let name = k.as_str();
        if crate::wire::is_hop_header(name)
            || name.eq_ignore_ascii_case("accept-encoding")
            || (replace && is_credential_header(name))
        {
            continue;
        }
        rb = rb.header(name, v.as_bytes());
    }
    let pending = Pending::new(route, &r, upstream.base().to_string(), flight);
    // Dropped here (the client went away): `pending` records it.
    let resp = match send(st, rb.body(r.body.clone()), upstream).await {
        Ok(resp) => resp,
        Err(e) => {
            let detail = r.known.text(&format!("{}: {e}", scrub::url(&url)));
            let timing = pending.at_once();
            pending
                .finish(Outcome::Unreachable(detail.clone()), timing)
                .await;
            return unreachable_response(&detail);
        }
    };
    let headers_us = r.t0.elapsed().as_micros() as u64;
    let status = resp.status().as_u16();
    let mut out = Response::builder().status(status);
    let mut kept = Vec::new();
    // What the client never had (the upstream's key, its URL's password)
    // does not reach it through an upstream that echoes it either.
    let mask = upstream.needles().clone();
    for (k, v) in resp.headers() {
        if crate::wire::is_hop_header(k.as_str()) {
            continue;
        }
        out = out.header(k.as_str(), mask.masked(v.as_bytes()).as_ref());
        if crate::wire::is_secret_header(k.as_str())
            || k.as_str() == "set-cookie"
            || crate::wire::is_clock_header(k.as_str())
        {
            continue;
        }
        kept.push((
            k.as_str().to_string(),
            String::from_utf8_lossy(v.as_bytes()).into_owned(),
        ));
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, Aborted>>(64);
    let head = Head {
        status,
        headers: kept,
        headers_us,
        cap: route.limits().max_response_bytes,
        mask,
    };
    tokio::spawn(relay(resp, tx, pending, head));
    out.body(ProxyBody::live(rx))
        .unwrap_or_else(|e| proxy_error(502, "mass_proxy_bad_response", &e.to_string()))
}

/// Sends a request upstream; the upstream's key, if it has one, is its one
/// `Authorization` (replacing one an HTTP client derives from the URL's
/// userinfo). The error is described without the URL.
async fn send(
    st: &State,
    rb: reqwest::RequestBuilder,
    upstream: &Upstream,
) -> Result<reqwest::Response, String> {
    let mut req = rb.build().map_err(|e| describe(&e.without_url()))?;
    if let Some(key) = upstream.key() {
        use reqwest::header::{HeaderValue, AUTHORIZATION};
        let mut v = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
            .map_err(|_| "the upstream's key is not a valid header value".to_string())?;
        v.set_sensitive(true);
        req.headers_mut().insert(AUTHORIZATION, v);
    }
    st.client
        .execute(req)
        .await
        .map_err(|e| describe(&e.without_url()))
}

/// What the upstream's response head said, and the body's cap.
struct Head {
    status: u16,
    headers: Vec<(String, String)>,
    headers_us: u64,
    cap: usize,
    /// Secrets masked before a chunk is passed on, one split across chunks
    /// too (`StreamMask`).
    mask: Needles,
}

/// How a relayed body ended.
enum End {
    Done,
    Cut(String),
    TooLarge,
    ClientGone,
}

/// Passes the upstream's body on chunk by chunk, then queues the exchange
/// for the writer before the client sees the end (so the conversation's
/// next request finds this one as its prefix). A broken or oversized body
/// aborts the client's reply; a client that goes away stops the upstream's.
async fn relay(
    mut resp: reqwest::Response,
    tx: mpsc::Sender<Result<Bytes, Aborted>>,
    pending: Pending,
    head: Head,
) {
    let t0 = pending.t0;
    let (mut all, mut chunks, mut chunks_us) = (Vec::new(), Vec::new(), Vec::new());
    let mut mask = crate::scrub::StreamMask::new(head.mask.clone());
    // Held while the body's end is awaited after the client left, so a
    // `Route::finish` meanwhile waits for this record.
    let mut hold = None;
    let mut end = loop {
        let next = tokio::select! {
            c = resp.chunk() => c,
            _ = tx.closed() => {
                hold = Some(pending.route.hold());
                break after_client_left(&mut resp).await;
            }
        };
        match next {
            Ok(Some(c)) => {
                if all.len() + mask.held() + c.len() > head.cap {
                    break End::TooLarge;
                }
                let c = if head.mask.is_empty() {
                    c
                } else {
                    Bytes::from(mask.push(&c))
                };
                if c.is_empty() {
                    continue;
                }
                chunks_us.push(t0.elapsed().as_micros() as u64);
                chunks.push(c.len());
                all.extend_from_slice(&c);
                if tx.send(Ok(c)).await.is_err() {
                    break End::ClientGone;
                }
            }
            Ok(None) => break End::Done,
            Err(e) => break End::Cut(describe(&e.without_url())),
        }
    };
    // What the mask held back (the start of a secret that never completed)
    // goes on and into the record like any other bytes.
    let tail = mask.finish();
    if !tail.is_empty() {
        chunks_us.push(t0.elapsed().as_micros() as u64);
        chunks.push(tail.len());
        all.extend_from_slice(&tail);
        if !matches!(end, End::ClientGone) && tx.send(Ok(Bytes::from(tail))).await.is_err() {
            end = End::ClientGone;
        }
    }
    // Cancels the upstream's request if it is still sending.
    drop(resp);
    let timing = Timing {
        headers_us: head.headers_us,
        chunks_us,
        total_us: t0.elapsed().as_micros() as u64,
    };
    let reply = HttpReply {
        status: head.status,
        headers: head.headers,
        body: all,
        chunks,
        cut: None,
    };
    let (outcome, abort) = ended(end, reply, head.cap, &pending.known);
    pending.finish(outcome, timing).await;
    drop(hold);
    if let Some(a) = abort {
        let _ = tx.send(Err(Aborted(a))).await;
    }
}

/// How long a body whose client closed its connection may take to end.
const CLIENT_GONE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// How a body ended whose client closed its connection: a client may have
/// read everything and hung up while the body's end was still on its way
/// (an SSE client stops at `data: [DONE]`, before the chunked body's last,
/// empty chunk). If the upstream's body ends within [`CLIENT_GONE_GRACE`]
/// with nothing more, the exchange is complete (a real llama.cpp session
/// was recorded as cancelled); anything else, it was cancelled.
async fn after_client_left(resp: &mut reqwest::Response) -> End {
    match tokio::time::timeout(CLIENT_GONE_GRACE, resp.chunk()).await {
        Ok(Ok(None)) => End::Done,
        _ => End::ClientGone,
    }
}

/// The outcome to record for how a body ended, and why the client's reply
/// is aborted, if it is.
fn ended(end: End, reply: HttpReply, cap: usize, known: &Needles) -> (Outcome, Option<String>) {
    match end {
        End::Done => (Outcome::Http(reply), None),
        End::Cut(c) => {
            let c = known.text(&c);
            let why = format!("the upstream's body broke off: {c}");
            (
                Outcome::Http(HttpReply {
                    cut: Some(c),
                    ..reply
                }),
                Some(why),
            )
        }
        End::TooLarge => {
            let detail = format!("the response exceeded the proxy's cap of {cap} bytes");
            let stopped = Outcome::Stopped {
                stop: Stop::TooLarge,
                detail: detail.clone(),
                reply: Some(reply),
            };
            (stopped, Some(detail))
        }
        End::ClientGone => (
            Outcome::Stopped {
                stop: Stop::ClientGone,
                detail: "the client closed its connection".into(),
                reply: Some(reply),
            },
            None,
        ),
    }
}

fn describe(e: &reqwest::Error) -> String {
    use std::error::Error;
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}
