//! A conversation's tools blob is stored with its first call performed in
//! this ledger and named by link after it (no second copy, no read-back).
//! Found by an attacker review: naming it after any first call broke a
//! conversation resumed in a partial (lazily pulled) ledger, whose first
//! call was served from history and whose tools blob was never stored
//! there: the next live call failed on a dangling link. And the ids are the
//! same either way: three chained calls give the head they gave when the
//! blob was stored with every call.
use std::sync::Arc;

use engine::backend::{Backend, BackendError, ChatRequest, ChatResponse, Reply};
use engine::chat::{Message, Usage};
use engine::effects::{call_model, Conversation, Sampling};
use ledger::{Id, Ledger, ObjectKind, Promisor};
use replay::{Mode, Session};

struct Stub;
impl Backend for Stub {
    fn name(&self) -> &str {
        "stub"
    }
    fn base_model(&self) -> String {
        "m".into()
    }
    fn complete<'a>(&'a self, req: &'a ChatRequest) -> Reply<'a> {
        let n = req.messages.len();
        Box::pin(async move {
            Ok::<_, BackendError>(ChatResponse {
                message: Message::assistant(format!("reply {n}")),
                usage: Usage::default(),
                finish_reason: "stop".into(),
                raw: None,
                raw_body: None,
                trainer_tokens: None,
            })
        })
    }
}

/// The remote a lazy clone reads absent blobs from.
struct Origin(Arc<Ledger>);
impl Promisor for Origin {
    fn fetch(&self, id: &Id) -> Result<Option<(ObjectKind, Vec<u8>)>, String> {
        Ok(self.0.raw_object(id).ok())
    }
    fn resolve(&self, _: &str, _: usize) -> Vec<Id> {
        Vec::new()
    }
}

fn conv() -> Conversation {
    Conversation::new(
        vec![Message::system("s"), Message::user("u")],
        engine::tools::tool_defs(true),
    )
}

#[test]
fn regression_a_live_call_after_a_served_one_records_in_a_partial_ledger() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let origin = Arc::new(Ledger::init(da.path()).unwrap());
    let be: Arc<dyn Backend> = Arc::new(Stub);
    let cfg = engine::config::SamplingConfig::with(0.0, 16);
    {
        let s = Session::new(origin.clone(), "r", Mode::Live).unwrap();
        let mut st = s.stream("chat").unwrap();
        let mut c = conv();
        engine::exec::block_on(call_model(
            &mut st,
            "model",
            &be,
            "m",
            &mut c,
            &Sampling::of(&cfg, 7),
        ))
        .unwrap()
        .unwrap();
    }
    // A lazy pull: every event, no blob.
    let lazy = Arc::new(Ledger::init(db.path()).unwrap());
    let mut b = lazy.batch();
    b.allow_absent_links();
    for (name, head) in origin.refs().unwrap() {
        let mut ids: Vec<Id> = origin.chain(head).map(|e| e.unwrap().id).collect();
        ids.reverse();
        for id in ids {
            let (k, raw) = origin.raw_object(&id).unwrap();
            b.put_raw(k, raw, Vec::new()).unwrap();
        }
        b.set_ref(&name, None, head).unwrap();
    }
    b.commit().unwrap();
    lazy.set_promisor(Arc::new(Origin(origin.clone())));
    // Resume: the first call is served from history, the second is live.
    let s = Session::new(lazy.clone(), "r", Mode::Live).unwrap();
    let mut st = s.stream("chat").unwrap();
    let mut c = conv();
    engine::exec::block_on(call_model(
        &mut st,
        "model",
        &be,
        "m",
        &mut c,
        &Sampling::of(&cfg, 7),
    ))
    .unwrap()
    .expect("served from history");
    c.messages.push(Message::user("again"));
    engine::exec::block_on(call_model(
        &mut st,
        "model",
        &be,
        "m",
        &mut c,
        &Sampling::of(&cfg, 7),
    ))
    .unwrap()
    .expect("the live call after a served one is recorded");
}

#[test]
fn three_chained_calls_keep_their_ids() {
    let d = tempfile::tempdir().unwrap();
    let l = Arc::new(Ledger::init(d.path()).unwrap());
    let be: Arc<dyn Backend> = Arc::new(Stub);
    let cfg = engine::config::SamplingConfig::with(0.0, 16);
    let s = Session::new(l, "r", Mode::Live).unwrap();
    let mut st = s.stream("chat").unwrap();
    let mut c = conv();
    for _ in 0..3 {
        engine::exec::block_on(call_model(
            &mut st,
            "model",
            &be,
            "m",
            &mut c,
            &Sampling::of(&cfg, 7),
        ))
        .unwrap()
        .unwrap();
        c.messages.push(Message::user("again"));
    }
    assert_eq!(
        st.head().unwrap().to_hex(),
        "fde4fc63476d4d0b0eeada37855881ee033dfaba60365068f45be86c9e97b6f4"
    );
}
