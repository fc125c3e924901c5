//! `make demo` keeps working: the demo runs, never shows grants above capacity, and settles on
//! the fair shares.

use sluice_tests::harness;

#[test]
fn the_demo_shows_fair_shares_within_capacity() {
    let out = harness::run("sluice-demo", &["--duration", "12s"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("t=")).collect();
    assert!(lines.len() >= 10, "a line a second: {stdout}");
    for line in &lines {
        let total: f64 = line.rsplit('Σ').next().unwrap().split('/').next().unwrap().trim().parse().unwrap();
        assert!(total <= 100.0, "over capacity: {line}");
    }
    let last = lines.last().unwrap();
    for share in ["alpha  20.0 ( 20)", "bravo  40.0 ( 50)", "charlie  40.0 ( 80)"] {
        assert!(last.contains(share), "{last} should show {share}");
    }
}
