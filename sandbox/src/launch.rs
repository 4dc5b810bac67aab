//! The launcher: the process `confine::command` spawns. It is this same
//! executable, re-entered through a constructor in `.init_array` that runs
//! before `main` in every binary linking this crate (`mass`, tests,
//! benchmarks). When the process's first argument is [`FLAG`] the
//! constructor never returns: it confines the process (`confine_self`)
//! and `execvp`s the command; otherwise it returns at once.
//!
//! Argument vector (a private interface between `command` and this file):
//! `[exe, FLAG, spec_json, program, args...]`, where `spec_json` is a
//! `confine::LaunchSpec`. The environment, cwd, stdio and process group are
//! the ones the caller set on the launcher's `Command`; they pass to the
//! command unchanged through `execvp`, which looks `program` up in that
//! environment's `PATH`.
//!
//! A failure is named on stderr (`sandbox: ...`) and the process exits with
//! 126 (a step of the confinement failed, or the command cannot be
//! executed) or 127 (the command was not found), as a shell would.

use std::ffi::{CStr, CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use crate::confine::{confine_self, LaunchSpec};
use crate::sys::note;

/// The first argument that makes a process the launcher. No user-facing
/// command of any binary takes it.
pub(crate) const FLAG: &str = "--mass-sandbox-launch-v1";

type InitFn = extern "C" fn(libc::c_int, *const *const libc::c_char, *const *const libc::c_char);

/// Registered as an ELF constructor; glibc passes it `argc`, `argv` and
/// `envp`. Referenced from `confine::command` so that the linker keeps it
/// in every binary that can spawn a launcher.
#[used]
#[link_section = ".init_array"]
pub(crate) static LAUNCH_HOOK: InitFn = launch_hook;

extern "C" fn launch_hook(
    argc: libc::c_int,
    argv: *const *const libc::c_char,
    _envp: *const *const libc::c_char,
) {
    if argc < 2 || argv.is_null() {
        return;
    }
    // SAFETY: glibc passes the process's argv: argc valid C strings.
    let first = unsafe { *argv.add(1) };
    if first.is_null() || unsafe { CStr::from_ptr(first) }.to_bytes() != FLAG.as_bytes() {
        return;
    }
    // SAFETY: as above, every argv[i] for i < argc is a valid C string.
    let args: Vec<OsString> = (0..argc as usize)
        .map(|i| unsafe { CStr::from_ptr(*argv.add(i)) })
        .map(|c| OsString::from_vec(c.to_bytes().to_vec()))
        .collect();
    let code = launch(&args);
    // SAFETY: _exit is always safe; nothing of this process is to be flushed.
    unsafe { libc::_exit(code) }
}

/// Confines this process and execs the command; returns the exit code
/// only when that fails.
fn launch(args: &[OsString]) -> libc::c_int {
    let [_, _, spec, program, ..] = args else {
        note(b"sandbox: launcher started without a command\n");
        return 126;
    };
    let spec: LaunchSpec = match serde_json::from_slice(spec.as_bytes()) {
        Ok(s) => s,
        Err(_) => {
            note(b"sandbox: launcher started with an unreadable policy\n");
            return 126;
        }
    };
    let to_c = |s: &OsString| CString::new(s.as_bytes()).ok();
    let Some(cargs) = args[3..].iter().map(to_c).collect::<Option<Vec<_>>>() else {
        note(b"sandbox: an argument contains a NUL byte\n");
        return 126;
    };
    let Some(prog) = to_c(program) else {
        note(b"sandbox: the program name contains a NUL byte\n");
        return 126;
    };
    let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    if confine_self(&spec).is_err() {
        // The failing step wrote its name to stderr.
        return 126;
    }
    // SAFETY: NUL-terminated strings and a null-terminated pointer array
    // that outlive the call; execvp returns only on failure.
    unsafe { libc::execvp(prog.as_ptr(), ptrs.as_ptr()) };
    let err = std::io::Error::last_os_error();
    note(exec_failure_note(&err).as_bytes());
    exec_failure_code(&err)
}

/// What a command that could not be executed says on its stderr (the
/// launcher's words, also written for a direct start, `direct::spawn`).
pub(crate) fn exec_failure_note(err: &std::io::Error) -> String {
    format!("sandbox: cannot execute the command: {err}\n")
}

/// Its exit code, as a shell's: 127 when the program was not found, else
/// 126.
pub(crate) fn exec_failure_code(err: &std::io::Error) -> libc::c_int {
    if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}
