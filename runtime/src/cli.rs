//! Flags and terminal output shared by every binary: one parser that exits 64 with one line on a
//! bad flag, the flag types they share, and output that a closed pipe (`| head`) cannot panic.

use std::{
    fmt,
    io::{self, Write},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use clap::{
    Parser, ValueEnum,
    error::{ContextKind, ContextValue, ErrorKind},
};

use crate::defaults::MIN_POLL_INTERVAL;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `check`'s flags: the server and the sidecar check their files alike (`process::check`).
#[derive(Debug, clap::Args)]
pub struct Check {
    /// Configuration file to check.
    #[arg(long)]
    pub config: PathBuf,
}

/// The flags of the binary `name` (the server, the sidecar and the test tools alike): `Err`
/// with the code to exit with once clap printed `--help` or `--version` (0), or once one line
/// said what is wrong (64, EX_USAGE).
pub fn parse<A: Parser>(name: &str) -> Result<A, ExitCode> {
    A::try_parse().map_err(|e| match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            // A reader that went away (`--help | head -1`) has read all it wanted.
            let _ = out(format_args!("{e}"));
            ExitCode::SUCCESS
        }
        _ => {
            let _ = err(format_args!("{name}: {}\n", usage_line(&e)));
            ExitCode::from(64)
        }
    })
}

/// Writes to standard output; unlike `print!`, a closed pipe is an error to handle, not a panic.
pub fn out(text: fmt::Arguments<'_>) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    stdout.write_fmt(text)?;
    stdout.flush()
}

/// Writes to standard error; unlike `eprint!`, a closed pipe is an error to handle, not a panic.
pub fn err(text: fmt::Arguments<'_>) -> io::Result<()> {
    io::stderr().lock().write_fmt(text)
}

/// `println!` that returns an error instead of panicking when standard output is closed.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => { $crate::cli::out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprintln!` that returns an error instead of panicking when standard error is closed.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => { $crate::cli::err(format_args!("{}\n", format_args!($($arg)*))) };
}

/// A clap error's first paragraph on one line, without its "error: " prefix: the missing
/// arguments clap lists under its first line stay in it, and the flag, subcommand or value clap
/// found closest to a misspelt one is offered as "did you mean".
fn usage_line(error: &clap::Error) -> String {
    let text = error.to_string();
    let paragraph: Vec<&str> = text.lines().map(str::trim).take_while(|l| !l.is_empty()).collect();
    let line = paragraph.join(" ");
    let mut line = line.strip_prefix("error: ").unwrap_or(&line).to_owned();
    let suggested = [ContextKind::SuggestedArg, ContextKind::SuggestedSubcommand, ContextKind::SuggestedValue]
        .into_iter()
        .find_map(|kind| match error.get(kind) {
            Some(ContextValue::String(s)) => Some(s.clone()),
            Some(ContextValue::Strings(s)) if !s.is_empty() => Some(s.join("' or '")),
            _ => None,
        });
    if let Some(suggested) = suggested {
        line.push_str(&format!(" (did you mean '{suggested}'?)"));
    }
    line
}

/// A duration flag that must be above zero, e.g. "2s" or "500ms".
pub fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("must be greater than 0".into()),
        Ok(d) => Ok(d),
        Err(_) if text.trim_start().starts_with('-') => Err("must be greater than 0".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// How often a configuration file is polled: at least [`MIN_POLL_INTERVAL`].
pub fn poll_interval(text: &str) -> Result<Duration, String> {
    let interval = positive_duration(text)?;
    if interval < MIN_POLL_INTERVAL {
        return Err(format!("must be at least {}", humantime::format_duration(MIN_POLL_INTERVAL)));
    }
    Ok(interval)
}

/// A `host:port` address to dial or to be dialled at.
pub fn host_port(text: &str) -> Result<String, String> {
    let uri: Result<hyper::Uri, _> = format!("http://{text}").parse();
    match uri {
        Ok(uri)
            if uri.host().is_some_and(|h| !h.is_empty())
                && uri.port().is_some()
                && uri.authority().is_some_and(|a| a.as_str() == text)
                && !text.contains('@') =>
        {
            Ok(text.to_owned())
        }
        _ => Err(format!("{text:?} is not host:port")),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::usage_line;

    #[derive(Debug, Parser)]
    struct Flags {
        #[arg(long)]
        config: Option<String>,
        #[arg(long, value_enum)]
        log_format: Option<super::LogFormat>,
    }

    fn line(args: &[&str]) -> String {
        usage_line(&Flags::try_parse_from([&["tool"], args].concat()).expect_err("a bad flag"))
    }

    #[test]
    fn a_misspelt_flag_or_value_is_answered_with_the_closest_one_on_one_line() {
        let flag = line(&["--confg", "x"]);
        assert_eq!(flag, "unexpected argument '--confg' found (did you mean '--config'?)");
        let value = line(&["--log-format", "jsn"]);
        assert!(value.starts_with("invalid value 'jsn' for '--log-format"), "{value}");
        assert!(value.ends_with("(did you mean 'json'?)") && !value.contains('\n'), "{value}");
        assert!(!line(&["--zzzzzz"]).contains("did you mean"));
    }
}
