//! What Ctrl-C says during a run: that nothing recorded is lost and how to
//! continue; and, for `mass worker`, SIGINT and SIGTERM as a request to stop
//! (its items are released to other workers). The ledger is crash-safe (an interrupted run resumes from its
//! last durable event), so the handler only prints and then lets SIGINT do
//! what it always does: end the process, with the usual signal status.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

static MESSAGE: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static LEN: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_sigint(_: libc::c_int) {
    // Only async-signal-safe calls here: write(2), signal(2), raise(3).
    let (p, n) = (MESSAGE.load(Ordering::Acquire), LEN.load(Ordering::Acquire));
    // SAFETY: `p` is null or points to `n` bytes leaked by `say_on_sigint`,
    // never freed; the default disposition is restored before re-raising.
    unsafe {
        if !p.is_null() {
            libc::write(2, p as *const libc::c_void, n);
        }
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::raise(libc::SIGINT);
    }
}

/// Prints `message` on stderr if the process gets SIGINT from now on.
pub fn say_on_sigint(message: String) {
    let bytes: &'static mut [u8] = Box::leak(message.into_bytes().into_boxed_slice());
    LEN.store(bytes.len(), Ordering::Release);
    MESSAGE.store(bytes.as_mut_ptr(), Ordering::Release);
    // SAFETY: installing a handler that only uses async-signal-safe calls.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
}

/// Set by SIGINT or SIGTERM once `stop_on_signals` installed its handler.
static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    // An atomic store is async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM set the returned flag instead of ending the
/// process (a worker then stops its items and releases them to others).
pub fn stop_on_signals() -> &'static std::sync::atomic::AtomicBool {
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_stop as *const () as libc::sighandler_t);
    }
    &STOP
}
