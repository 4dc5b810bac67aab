//! The escape cases' shared machinery (#24, item 7): every case is one
//! attack and one control, run as Python functions in a forked child each
//! inside one sandboxed command, and reported as `done`, `errno NAME`,
//! `signal NAME` or `refused WHY`. A case names its *guards*, the layers
//! that refuse it, in the order the kernel consults them, each with the
//! errno (or signal) it produces; the first guard still in force decides
//! the outcome, and with every guard switched off (`Policy::unprotected`)
//! the attack gets through (`open`). So a run with any set of layers off
//! predicts the outcome of every case, and one mismatch names the case,
//! the layers off and both outcomes.
//!
//! A run's host-side checks (`effect`) make the outcome honest from the
//! outside too: an attack that is refused must leave no trace on the host,
//! one that gets through must leave one.

#![allow(dead_code)]

use sandbox::{Layer, Level};
use std::collections::BTreeSet;
use std::fmt;

/// What one attack came to, as the command saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It worked (and its host-side effect, if the case has one, is there).
    Done,
    /// It worked inside the sandbox but reached nothing of the host (a
    /// private copy: the case's host-side effect must be absent).
    Contained,
    /// The syscall failed with this errno.
    Errno(i32),
    /// The process was killed by this signal.
    Signal(i32),
    /// The operation ran but gained nothing (e.g. a setuid binary that
    /// kept the caller's uid); the text is what the attack reported.
    Refused(&'static str),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Done => write!(f, "done"),
            Outcome::Contained => write!(f, "done (contained)"),
            Outcome::Errno(e) => write!(f, "errno {}", errno_name(*e)),
            Outcome::Signal(s) => write!(f, "signal {}", signal_name(*s)),
            Outcome::Refused(w) => write!(f, "refused {w}"),
        }
    }
}

impl Outcome {
    /// The line the Python runner prints for this outcome.
    fn reported(&self) -> String {
        match self {
            Outcome::Done | Outcome::Contained => "done".into(),
            o => o.to_string(),
        }
    }
}

pub fn errno_name(e: i32) -> &'static str {
    match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EXDEV => "EXDEV",
        libc::EFBIG => "EFBIG",
        libc::ENOSYS => "ENOSYS",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ENETUNREACH => "ENETUNREACH",
        _ => "E?",
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGSYS => "SIGSYS",
        libc::SIGKILL => "SIGKILL",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGALRM => "SIGALRM",
        _ => "SIG?",
    }
}

/// One layer that refuses a case: while it is in force the case ends in
/// `outcome`. `layers`: the guard is gone only when all of them are off
/// (Landlock's ptrace rule holds while any part of a Landlock domain
/// exists). `needs`: the guard is also gone when one of these is off (the
/// process limit does not bind root). `when_off`: the guard exists only
/// when these are off (root of the command's user namespace may not signal
/// a host process of another uid).
#[derive(Clone, Debug)]
pub struct Guard {
    pub layers: Vec<Layer>,
    pub needs: Vec<Layer>,
    pub when_off: Vec<Layer>,
    pub outcome: Outcome,
    pub why: &'static str,
}

pub fn guard(layer: Layer, outcome: Outcome, why: &'static str) -> Guard {
    Guard {
        layers: vec![layer],
        needs: Vec::new(),
        when_off: Vec::new(),
        outcome,
        why,
    }
}

impl Guard {
    pub fn needs(mut self, layer: Layer) -> Guard {
        self.needs.push(layer);
        self
    }

    /// Exists only when `layer` is off.
    pub fn only_without(mut self, layer: Layer) -> Guard {
        self.when_off.push(layer);
        self
    }

    /// Gone only when `layer` is off as well as the guard's own layers.
    pub fn or(mut self, layer: Layer) -> Guard {
        self.layers.push(layer);
        self
    }

    fn active(&self, off: &BTreeSet<Layer>) -> bool {
        let gone = !self.layers.is_empty() && self.layers.iter().all(|l| off.contains(l));
        !gone
            && !self.needs.iter().any(|l| off.contains(l))
            && self.when_off.iter().all(|l| off.contains(l))
    }
}

/// A refusal by something no switch leaves out (the user namespace
/// itself, a sysctl): it holds in every run, so the attack never gets
/// through and the last run shows this refusal instead.
pub fn fixed(outcome: Outcome, why: &'static str) -> Guard {
    Guard {
        layers: Vec::new(),
        needs: Vec::new(),
        when_off: Vec::new(),
        outcome,
        why,
    }
}

pub fn errno(e: i32) -> Outcome {
    Outcome::Errno(e)
}

/// A host-side check: did the attack reach the host?
pub type Effect = Box<dyn Fn() -> bool + Send>;

/// One attack with its control.
pub struct Case {
    pub name: &'static str,
    /// Python statements (a function body) doing the attack; raising
    /// OSError reports its errno, `Refused(why)` a harmless success.
    pub attack: String,
    /// The same operation on an allowed target (a function body).
    pub control: String,
    /// The layers refusing the attack, first consulted first.
    pub guards: Vec<Guard>,
    /// The outcome with every guard off.
    pub open: Outcome,
    /// Layers the control itself needs (it is not checked without them).
    pub control_needs: Vec<Layer>,
    /// Whether the attack reached the host, checked after the run.
    pub effect: Option<Effect>,
}

impl Case {
    pub fn new(name: &'static str, attack: impl Into<String>, control: impl Into<String>) -> Case {
        Case {
            name,
            attack: attack.into(),
            control: control.into(),
            guards: Vec::new(),
            open: Outcome::Done,
            control_needs: Vec::new(),
            effect: None,
        }
    }

    pub fn guard(mut self, g: Guard) -> Case {
        self.guards.push(g);
        self
    }

    /// Adds `g` only when `cond` holds (a layer this level has).
    pub fn guard_if(self, cond: bool, g: Guard) -> Case {
        if cond {
            self.guard(g)
        } else {
            self
        }
    }

    pub fn open(mut self, o: Outcome) -> Case {
        self.open = o;
        self
    }

    pub fn control_needs(mut self, l: Layer) -> Case {
        self.control_needs.push(l);
        self
    }

    pub fn effect(mut self, f: impl Fn() -> bool + Send + 'static) -> Case {
        self.effect = Some(Box::new(f));
        self
    }

    /// The outcome expected with `off` switched off, and the guard deciding it.
    pub fn expect(&self, off: &BTreeSet<Layer>) -> (Outcome, Option<&Guard>) {
        match self.guards.iter().find(|g| g.active(off)) {
            Some(g) => (g.outcome.clone(), Some(g)),
            None => (self.open.clone(), None),
        }
    }

    /// The sets of layers to switch off to see each guard refuse in turn
    /// and, last, the attack get through: for guard k, the layers of
    /// guards 0..=k.
    pub fn off_sets(&self) -> Vec<(Layer, BTreeSet<Layer>)> {
        let mut acc = BTreeSet::new();
        let mut out = Vec::new();
        for g in &self.guards {
            if g.layers.is_empty() {
                if g.needs.is_empty() && g.when_off.is_empty() {
                    // Always in force: nothing behind it can be reached.
                    break;
                }
                continue;
            }
            acc.extend(g.layers.iter().copied());
            out.push((g.layers[0], acc.clone()));
        }
        out
    }
}

/// The Python program running every case of `cases` (attack, then
/// control), each in a forked child with a 5 s alarm, printing one
/// `CASE name result` line per function.
pub fn script(cases: &[Case]) -> String {
    let mut s = String::from(PRELUDE);
    for (i, c) in cases.iter().enumerate() {
        for (kind, body) in [("attack", &c.attack), ("control", &c.control)] {
            s.push_str(&format!("def {kind}_{i}():\n"));
            for line in body.lines() {
                s.push_str("    ");
                s.push_str(line);
                s.push('\n');
            }
            s.push_str("    pass\n");
        }
    }
    for (i, c) in cases.iter().enumerate() {
        s.push_str(&format!("case('{}', attack_{i})\n", c.name));
        s.push_str(&format!("case('{}.control', control_{i})\n", c.name));
    }
    s
}

const PRELUDE: &str = r#"
import ctypes, errno, os, signal, socket, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)

class Refused(Exception):
    pass

def sc(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if r == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r

def case(name, fn):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        signal.alarm(5)
        try:
            fn()
            res = 'done'
        except Refused as e:
            res = 'refused ' + str(e)
        except OSError as e:
            res = 'errno ' + errno.errorcode.get(e.errno, str(e.errno))
        except BaseException as e:
            res = 'error ' + type(e).__name__ + ': ' + str(e)
        os.write(w, res.encode())
        os._exit(0)
    os.close(w)
    data = b''
    while True:
        b = os.read(r, 4096)
        if not b:
            break
        data += b
    os.close(r)
    _, st = os.waitpid(pid, 0)
    if os.WIFSIGNALED(st):
        res = 'signal ' + signal.Signals(os.WTERMSIG(st)).name
    else:
        res = data.decode() or 'nothing'
    print('CASE', name, res.replace('\n', ' '), flush=True)
"#;

/// Compares a run's output with what `cases` predict for `off`; returns
/// one line per mismatch (empty when everything is as predicted).
pub fn check(level: Level, off: &BTreeSet<Layer>, cases: &[Case], stdout: &str) -> Vec<String> {
    let got = |name: &str| -> Option<String> {
        stdout.lines().find_map(|l| {
            let rest = l.strip_prefix("CASE ")?;
            let (n, r) = rest.split_once(' ')?;
            (n == name).then(|| r.to_string())
        })
    };
    let mut bad = Vec::new();
    for c in cases {
        let (want, by) = c.expect(off);
        let why = by.map_or("every guard off", |g| g.why);
        let attack = got(c.name);
        if attack.as_deref() != Some(want.reported().as_str()) {
            bad.push(format!(
                "{level:?} off {off:?}: {}: expected {want} ({why}), got {}",
                c.name,
                attack.as_deref().unwrap_or("no result")
            ));
        }
        if let Some(effect) = &c.effect {
            let reached = effect();
            if reached != (want == Outcome::Done) {
                bad.push(format!(
                    "{level:?} off {off:?}: {}: the attack {} the host, expected {want} ({why})",
                    c.name,
                    if reached { "reached" } else { "did not reach" }
                ));
            }
        }
        if !c.control_needs.iter().any(|l| off.contains(l)) {
            let control = format!("{}.control", c.name);
            if got(&control).as_deref() != Some("done") {
                bad.push(format!(
                    "{level:?} off {off:?}: {control} failed: {}",
                    got(&control).as_deref().unwrap_or("no result")
                ));
            }
        }
    }
    bad
}

/// The distinct off-sets of `cases` in which `layer` is the last guard
/// switched off: the runs that show `layer` refusing (or, with the last
/// guard of a case, the attack getting through).
pub fn off_sets_for(layer: Layer, cases: &[Case]) -> Vec<BTreeSet<Layer>> {
    let mut out: Vec<BTreeSet<Layer>> = Vec::new();
    for c in cases {
        for (first, set) in c.off_sets() {
            if first == layer && !out.contains(&set) {
                out.push(set);
            }
        }
    }
    out
}
