//! The response body the proxy hands hyper: chunks passed on as they
//! arrive from the upstream, or recorded chunks played back, either of
//! which may end in an abort. The abort comes only after the bytes before
//! it had their chance to be flushed, so a client sees exactly what was
//! sent (or recorded) and then the broken end.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame};
use tokio::sync::mpsc;

/// Why the proxy ended a reply without its clean end (the client sees an
/// incomplete body).
#[derive(Debug, thiserror::Error)]
#[error("mass proxy aborted the reply: {0}")]
pub struct Aborted(pub String);

/// A response body: chunks passed on as they arrive, or recorded chunks;
/// either may end in an abort, which comes after what went before has been
/// flushed to the client (it gets the bytes, then the broken end).
pub struct ProxyBody {
    source: Source,
    /// An abort waiting to be sent, and whether the bytes before it had
    /// their chance to be flushed.
    abort: Option<Aborted>,
    flushed: bool,
}

enum Source {
    Live(mpsc::Receiver<Result<Bytes, Aborted>>),
    /// Recorded chunks, then (a recorded cut) an abort.
    Recorded(VecDeque<Bytes>, Option<String>),
}

impl ProxyBody {
    pub(super) fn live(rx: mpsc::Receiver<Result<Bytes, Aborted>>) -> ProxyBody {
        ProxyBody {
            source: Source::Live(rx),
            abort: None,
            flushed: false,
        }
    }

    pub(super) fn recorded(chunks: VecDeque<Bytes>, abort: Option<String>) -> ProxyBody {
        ProxyBody {
            source: Source::Recorded(chunks, abort),
            abort: None,
            flushed: false,
        }
    }

    pub(super) fn whole(b: Bytes) -> ProxyBody {
        ProxyBody::recorded(VecDeque::from([b]), None)
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = Aborted;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Aborted>>> {
        let this = self.get_mut();
        if this.abort.is_none() {
            let next = match &mut this.source {
                Source::Live(rx) => match rx.poll_recv(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(n) => n,
                },
                Source::Recorded(q, abort) => match q.pop_front() {
                    Some(b) => Some(Ok(b)),
                    None => abort.take().map(|a| Err(Aborted(a))),
                },
            };
            match next {
                Some(Ok(b)) => return Poll::Ready(Some(Ok(Frame::data(b)))),
                None => return Poll::Ready(None),
                Some(Err(a)) => this.abort = Some(a),
            }
        }
        if !this.flushed {
            // Pending once: hyper flushes what it holds before the abort.
            this.flushed = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(this.abort.take().map(Err))
    }
}
