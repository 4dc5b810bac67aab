//! `mass sandbox`: runs one command exactly as a rollout's `bash` tool would
//! (same confinement, environment, timeout and output caps), so users can
//! check their setup; `--probe` reports which confinement layers this machine
//! offers and which levels it can run.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use engine::config::SandboxConfig;
use engine::tools::{BashOptions, Confinement, Workspace};

use super::CliError;

/// What to run (`mass sandbox`).
pub struct SandboxOptions<'a> {
    pub workspace: Option<&'a Path>,
    pub limits: Option<&'a Path>,
    pub level: Option<sandbox::Level>,
    pub network: bool,
    pub timeout_secs: u64,
    pub probe: bool,
    pub command: &'a [String],
}

pub fn run(opts: &SandboxOptions<'_>) -> Result<ExitCode> {
    let mut out = crate::output::stdout();
    if opts.probe {
        print_probe(&mut out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let (Some(ws), false) = (opts.workspace, opts.command.is_empty()) else {
        return Err(CliError::Usage(
            "give --workspace DIR and a command after `--` (or --probe)".into(),
        )
        .into());
    };
    let mut cfg = match opts.limits {
        Some(p) => read_config(p)?,
        None => SandboxConfig::default(),
    };
    if let Some(l) = opts.level {
        cfg.level = l;
    }
    let root = std::fs::canonicalize(ws)
        .with_context(|| format!("workspace {} does not exist", ws.display()))?;
    let w = Workspace::new(&root).map_err(|e| CliError::Usage(e.to_string()))?;
    let bash = BashOptions {
        timeout: Duration::from_secs(opts.timeout_secs.max(1)),
        confinement: Confinement {
            level: cfg.level,
            limits: cfg.limits,
            network: opts.network,
            // As a rollout sees its scratch root: the workspace's siblings
            // cannot be named.
            hide: root.parent().map(Path::to_path_buf).into_iter().collect(),
            forward: Vec::new(),
            ..Default::default()
        },
        ..Default::default()
    };
    let line = command_line(opts.command);
    let r = w.bash(&line, &bash).map_err(|e| match e {
        engine::tools::ToolError::Sandbox(s) => {
            anyhow::Error::new(engine::error::EngineError::Sandbox(s))
        }
        other => anyhow::Error::new(other),
    })?;
    let level = cfg.level.as_str();
    let (code, how) = match (r.exit_code, r.signal) {
        (Some(c), _) => (
            c,
            Some(format!(
                "exit {c}{}",
                if r.timed_out { ", timed out" } else { "" }
            )),
        ),
        (None, Some(s)) => (
            128 + s,
            Some(format!(
                "killed by signal {s}{}",
                if r.timed_out { " (timed out)" } else { "" }
            )),
        ),
        (None, None) => (1, None),
    };
    // Decided before the output is written: a reader that stops early
    // (`| head`) leaves the command's own exit code in place.
    let code = crate::output::decide(u8::try_from(code.clamp(0, 255)).unwrap_or(1));
    out.write_all(r.stdout.as_bytes())?;
    std::io::stderr().write_all(r.stderr.as_bytes())?;
    if let Some(how) = how {
        eprintln!("[sandbox level {level}: {how}]");
    }
    Ok(code)
}

/// The bash line `mass sandbox -- ARGS` runs. One argument is a shell
/// line, as a rollout's `bash` tool gets it from the model (`-- 'ls | wc
/// -l'`). Several are a program and its arguments, as the calling shell
/// split them: each is quoted as POSIX sh would (single quotes, `'` as
/// `'\''`; only safe characters stay bare), so `-- python3 -c "print('x')"`
/// runs python3 with exactly those two arguments. (Joined unquoted, the
/// program saw `python3 -c print('x')`, a syntax error.)
fn command_line(args: &[String]) -> String {
    match args {
        [line] => line.clone(),
        words => words
            .iter()
            .enumerate()
            .map(|(i, w)| quote_word(w, i == 0))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// Bash's reserved words: bare in command position they are syntax, not a
/// program's name.
const RESERVED: [&str; 17] = [
    "case", "coproc", "do", "done", "elif", "else", "esac", "fi", "for", "function", "if", "in",
    "select", "then", "time", "until", "while",
];

/// One argument, quoted for bash (`engine::config::shell_quote`, as the
/// trainer and harness commands are). The program's own name is quoted
/// also when bare it would be a reserved word or, holding `=`, a variable
/// assignment rather than the program.
fn quote_word(w: &str, program: bool) -> String {
    if program && (w.contains('=') || RESERVED.contains(&w)) {
        format!("'{}'", w.replace('\'', "'\\''"))
    } else {
        engine::config::shell_quote(w)
    }
}

/// A `[sandbox]` table from an experiment file, or a file holding just its
/// keys (`level`, `[limits]`).
fn read_config(p: &Path) -> Result<SandboxConfig> {
    let text =
        std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
    let mut doc: toml::Table = text
        .parse()
        .map_err(|e| CliError::Usage(format!("{}: {e}", p.display())))?;
    let table = match doc.remove("sandbox") {
        Some(toml::Value::Table(t)) => t,
        Some(_) => {
            return Err(
                CliError::Usage(format!("{}: `sandbox` is not a table", p.display())).into(),
            )
        }
        None => doc,
    };
    toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| {
            CliError::Usage(format!("{}: {}", p.display(), e.message())).into()
        })
}

fn print_probe(out: &mut impl Write) -> Result<()> {
    let a = sandbox::probe();
    let yes = |b: bool| if b { "yes" } else { "no" };
    writeln!(
        out,
        "landlock ABI        {}",
        a.landlock_abi
            .map_or("unavailable".into(), |v| v.to_string())
    )?;
    writeln!(out, "user namespaces     {}", yes(a.user_namespaces))?;
    writeln!(out, "PID namespace       {}", yes(a.pid_namespace))?;
    writeln!(out, "network namespace   {}", yes(a.net_namespace))?;
    writeln!(out, "fresh /proc         {}", yes(a.mount_proc))?;
    writeln!(out, "IPC/UTS namespaces  {}", yes(a.ipc_uts_namespaces))?;
    writeln!(
        out,
        "running as root     {} (commands run as uid {} if so)",
        yes(a.root),
        sandbox::SANDBOX_ID
    )?;
    for level in [
        sandbox::Level::Full,
        sandbox::Level::Landlock,
        sandbox::Level::None,
    ] {
        match a.check(level) {
            Ok(()) => writeln!(out, "level {:<9} available", level.as_str())?,
            Err(e) => writeln!(out, "level {:<9} unavailable: {e}", level.as_str())?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(args: &[&str]) -> String {
        command_line(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn one_argument_is_a_shell_line_as_given() {
        assert_eq!(line(&["ls | wc -l > n.txt"]), "ls | wc -l > n.txt");
        assert_eq!(line(&["echo $HOME"]), "echo $HOME");
    }

    #[test]
    fn several_arguments_are_quoted_as_sh_would() {
        assert_eq!(
            line(&["python3", "-c", "print('x')"]),
            r#"python3 -c 'print('\''x'\'')'"#
        );
        assert_eq!(line(&["echo", "a b", ""]), "echo 'a b' ''");
        assert_eq!(
            line(&["printf", r"%s\n", "$HOME"]),
            r"printf '%s\n' '$HOME'"
        );
        assert_eq!(
            line(&["echo", "say \"hi\"", "a\nb", "back\\slash"]),
            "echo 'say \"hi\"' 'a\nb' 'back\\slash'"
        );
        // Safe characters stay bare.
        assert_eq!(
            line(&["ls", "-la", "./dir/a=b,c:d@e%f+g"]),
            "ls -la ./dir/a=b,c:d@e%f+g"
        );
    }

    #[test]
    fn the_program_is_never_syntax_or_an_assignment() {
        assert_eq!(line(&["if", "x"]), "'if' x");
        assert_eq!(line(&["A=1", "env"]), "'A=1' env");
        assert_eq!(line(&["env", "A=1"]), "env A=1");
        assert_eq!(line(&["it's", "x"]), r"'it'\''s' x");
    }
}
