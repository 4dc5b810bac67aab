//! The hyper service: each request routed by path to its route, refused
//! with an OpenAI-shaped error when it may not pass (no route, no token, a
//! path that could leave the upstream's base, not a model call, shutting
//! down, a failed recording, too large), read whole, then answered from the
//! recording (`replay.rs`) or forwarded upstream (`forward.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::json;

use super::body::ProxyBody;
use super::forward::forward;
use super::replay::from_book;
use super::State;
use crate::route::{Route, RouteMode};
use crate::scrub::{self, Needles};

fn route_of(st: &State, path: &str) -> Option<(Arc<Route>, String)> {
    if let Some(rest) = path.strip_prefix("/s/") {
        let (name, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let r = st
            .routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()?;
        return Some((
            r,
            if tail.is_empty() {
                "/".into()
            } else {
                tail.into()
            },
        ));
    }
    let r = st
        .default
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()?;
    Some((r, path.to_string()))
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
fn error_response(status: u16, kind: &str, code: &str, message: &str) -> Response<ProxyBody> {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    let mut r = Response::new(ProxyBody::whole(Bytes::from(body.to_string())));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// An error of the proxy's own (type and code the same).
pub(super) fn proxy_error(status: u16, kind: &str, message: &str) -> Response<ProxyBody> {
    error_response(status, kind, kind, message)
}

/// The body of the 502 the proxy answers when the upstream is unreachable
/// (recorded as such, answered again the same way on replay).
pub(super) fn unreachable_response(detail: &str) -> Response<ProxyBody> {
    proxy_error(
        502,
        "upstream_unreachable",
        &format!("mass proxy: the upstream is unreachable: {detail}"),
    )
}

/// A request as received, read whole.
pub(super) struct Received {
    pub(super) method: String,
    /// The route's path with the client's query, as forwarded.
    pub(super) path: String,
    pub(super) body: Bytes,
    pub(super) user_agent: Option<String>,
    pub(super) headers: hyper::HeaderMap,
    /// The secrets it may carry: the route's and its credential headers'.
    pub(super) known: Needles,
    pub(super) t0: Instant,
}

pub(super) async fn handle(st: Arc<State>, req: Request<Incoming>) -> Response<ProxyBody> {
    let t0 = Instant::now();
    let path_q = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let shown = scrub::query(&path_q, &mut Needles::new()).into_owned();
    let Some((route, path)) = route_of(&st, &path_q) else {
        return proxy_error(
            404,
            "mass_proxy_no_route",
            &format!("mass proxy: no stream is served at {shown}"),
        );
    };
    if !route.admits(req.headers()) {
        return error_response(
            401,
            "invalid_request_error",
            "invalid_api_key",
            "mass proxy: this route needs its token (Authorization: Bearer <token>, api-key or x-api-key)",
        );
    }
    if escapes(&path) {
        return proxy_error(
            400,
            "mass_proxy_bad_path",
            &format!("mass proxy: {shown}: dot segments and encoded '.' or '/' are refused (they could leave the upstream's base path)"),
        );
    }
    if !route.allows(req.method().as_str(), &path) {
        return proxy_error(
            403,
            "mass_proxy_not_a_model_call",
            &format!(
                "mass proxy: {} {shown}: this route passes model calls only",
                req.method()
            ),
        );
    }
    // In flight before the closing check: a shutdown that begins now either
    // waits for this exchange or is seen here.
    let flight = st.take_off(format!("{} {shown} on {}", req.method(), route.label));
    if st.closing.load(Ordering::SeqCst) {
        return proxy_error(
            503,
            "mass_proxy_shutting_down",
            "mass proxy: shutting down, not taking requests",
        );
    }
    if let Some(f) = route.recording_failure() {
        return proxy_error(
            500,
            "mass_proxy_recording_failed",
            &format!(
                "mass proxy: recording into {} failed, so nothing more is passed through: {f}",
                route.label
            ),
        );
    }
    let received = match receive(&route, req, path, t0).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let upstream = match &route.mode {
        RouteMode::Record { upstream } => upstream.clone(),
        RouteMode::Replay { book, fallback } => {
            match from_book(&route, book, fallback.as_ref(), received, flight).await {
                Ok(resp) => return resp,
                Err((u, received, flight)) => {
                    return forward(&st, &route, &u, received, flight).await
                }
            }
        }
    };
    forward(&st, &route, &upstream, received, flight).await
}

/// Reads the request, its body up to the route's cap (HTTP 413 past it).
async fn receive(
    route: &Route,
    req: Request<Incoming>,
    path: String,
    t0: Instant,
) -> Result<Received, Response<ProxyBody>> {
    let cap = route.limits().max_request_bytes;
    let too_large = || {
        proxy_error(
            413,
            "mass_proxy_request_too_large",
            &format!("mass proxy: the request body exceeds this route's cap of {cap} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap as u64) {
        return Err(too_large());
    }
    let (parts, body) = req.into_parts();
    let body = match http_body_util::Limited::new(body, cap).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Err(e) => {
            return Err(proxy_error(
                400,
                "mass_proxy_bad_request",
                &format!("cannot read the request body: {e}"),
            ))
        }
    };
    let mut known = route.needles().clone();
    known.extend(&scrub::header_secrets(
        parts
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes())),
    ));
    Ok(Received {
        method: parts.method.as_str().to_string(),
        path,
        body,
        user_agent: parts
            .headers
            .get(hyper::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        headers: parts.headers,
        known,
        t0,
    })
}

/// Whether a path (before its query) has a dot segment or an encoded `.`
/// or `/`, with which a request could resolve outside the upstream's base
/// path (`/v1/../../admin`).
fn escapes(path_q: &str) -> bool {
    let path = path_q.split('?').next().unwrap_or("");
    let lower = path.to_ascii_lowercase();
    lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains("%5c")
        || path.contains('\\')
        || path.split('/').any(|seg| seg == "." || seg == "..")
}
