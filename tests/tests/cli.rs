//! Every binary's manners on the command line: output to a reader that went away (`--help |
//! head -1`) ends the program quietly, never in a panic; a misspelt flag gets one line offering
//! the flag meant.

use std::{io::Read, process::Command};

use sluice_tests::harness::binary;

const BINARIES: &[&str] = &[
    "sluice-server",
    "sluice-sidecar",
    "sluice-demo",
    "sluice-upstream",
    "sluice-loadgen",
    "sluice-relay",
    "sluice-bench-sidecar",
    "sluice-connections",
    "sluice-soak",
    "sluice-sim",
];

/// Runs `name` with `args`, its standard output (`into_stdout`) or error going to a pipe whose
/// reading end is closed before the program starts; returns its exit code and standard error
/// (empty when that was the closed pipe).
fn with_closed_pipe(name: &str, args: &[&str], into_stdout: bool) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let mut command = Command::new(binary(name));
    command.args(args).stdin(std::process::Stdio::null());
    let (err_reader, err_writer) = std::io::pipe().expect("pipe");
    if into_stdout {
        command.stdout(writer).stderr(err_writer);
    } else {
        command.stdout(std::process::Stdio::null()).stderr(writer);
        drop(err_writer);
    }
    let mut child = command.spawn().expect("binary runs");
    // The parent's copy of the write end must go, or the read below never ends.
    drop(command);
    let mut stderr = String::new();
    if into_stdout {
        let mut err_reader = err_reader;
        err_reader.read_to_string(&mut stderr).expect("stderr");
    }
    (child.wait().expect("wait").code(), stderr)
}

#[test]
fn help_into_a_closed_pipe_exits_0_without_a_panic() {
    for name in BINARIES {
        let (code, stderr) = with_closed_pipe(name, &["--help"], true);
        assert!(!stderr.contains("panicked"), "{name} --help panicked:\n{stderr}");
        assert_eq!(code, Some(0), "{name} --help into a closed pipe:\n{stderr}");
    }
}

#[test]
fn a_bad_flag_with_stderr_closed_still_exits_64() {
    for name in BINARIES {
        // A panic would exit 101.
        let (code, _) = with_closed_pipe(name, &["--no-such-flag"], false);
        assert_eq!(code, Some(64), "{name} --no-such-flag with a closed stderr");
    }
}

#[test]
fn a_misspelt_flag_gets_one_line_offering_the_flag_meant() {
    for (name, args, meant) in [
        ("sluice-server", &["--confg", "x"][..], "--config"),
        ("sluice-sidecar", &["--admin-adr", "127.0.0.1:1"][..], "--admin-addr"),
        ("sluice-sidecar", &["chek", "--config", "x"][..], "check"),
    ] {
        let out = Command::new(binary(name)).args(args).output().expect("binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{name} {args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{name} {args:?}: {stderr}");
        assert!(stderr.trim_end().ends_with(&format!("(did you mean '{meant}'?)")), "{name} {args:?}: {stderr}");
    }
}
