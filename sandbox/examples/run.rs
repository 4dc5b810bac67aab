//! Runs one shell command under the sandbox with the current directory as
//! the workspace, for trying policies by hand:
//! `cargo run -p sandbox --example run -- full 'id; ls /root'`.

use sandbox::{command, prepare, Level, Policy};
use std::os::unix::process::CommandExt;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let level = match args.next().as_deref() {
        Some("landlock") => Level::Landlock,
        Some("none") => Level::None,
        _ => Level::Full,
    };
    let script = args.next().unwrap_or_else(|| "id".to_string());
    let ws = std::env::current_dir()?;
    let policy = Policy::new(level, &ws);
    prepare(&policy)?;
    let mut cmd = command("bash", &policy)?;
    cmd.arg("-c")
        .arg(script)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &ws)
        .current_dir(&ws)
        .process_group(0);
    let status = cmd.status()?;
    println!("status: {status}");
    Ok(())
}
