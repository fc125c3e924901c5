//! `make demo` keeps working: the limit holds with one sidecar, and two sidecars share it.

use sluice_tests::harness;

/// The figures of one `t=` line: per sidecar (admitted, lease), and Σ admitted.
fn parse(line: &str) -> (Vec<(f64, f64)>, f64) {
    let number_before = |text: &str, word: &str| -> f64 {
        text.split(word).next().unwrap().split_whitespace().last().unwrap().parse().unwrap()
    };
    let (pods, total) = line.split_once("Σ admitted").unwrap();
    let pods = pods
        .split('|')
        .filter(|p| p.contains("lease"))
        .map(|p| {
            let lease = p.split("lease").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap_or(f64::NAN);
            (number_before(p, " admitted"), lease)
        })
        .collect();
    (pods, total.trim().split('/').next().unwrap().parse().unwrap())
}

#[test]
fn the_demo_enforces_the_limit_and_shares_it() {
    let out = harness::run("sluice-demo", &["--duration", "16s", "--join-after", "8s", "--rate", "200"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<(Vec<(f64, f64)>, f64)> = stdout.lines().filter(|l| l.starts_with("t=")).map(parse).collect();
    assert!(lines.len() >= 14, "a line a second: {stdout}");
    // SPEC §4.4: over any 10 s window, admitted ≤ capacity × 10 s + burst. The 5% slack covers
    // both sidecars' bursts (0.1 s of their rate) and the first answer's round trip; on top, a
    // joining sidecar admits without limit (the `safe` fallback, no safe capacity known yet)
    // until its first lease, asked for 0.25 s after its first request (`FIRST_ASK_AFTER`):
    // 50 of the 200 a second it is offered — nothing like the 2× and more that is offered. A
    // single second may go further over for that.
    // On a loaded machine that first answer can take longer: what a sidecar admits in a second
    // it ends still `pending` (no lease yet, lease shown as `none`) is its fallback's, not the
    // capacity's, and is left out.
    let joining = 200.0 * 0.25;
    let on_fallback =
        |pods: &[(f64, f64)]| pods.iter().filter(|(_, lease)| lease.is_nan()).map(|(a, _)| a).sum::<f64>();
    let totals: Vec<f64> = lines.iter().map(|(pods, total)| total - on_fallback(pods)).collect();
    for window in totals.windows(10) {
        assert!(window.iter().sum::<f64>() <= 1050.0 + joining, "admitted above 100/s over 10 s: {stdout}");
    }
    assert!(totals.iter().all(|t| *t <= 150.0 + joining), "admitted far above the capacity of 100: {stdout}");
    let (alone, _) = &lines[5];
    assert_eq!(alone.len(), 1);
    assert!((alone[0].1 - 100.0).abs() < 1.0, "one sidecar leases it all: {stdout}");
    let (shared, _) = lines.last().unwrap();
    assert_eq!(shared.len(), 2);
    for (_, lease) in shared {
        assert!((lease - 50.0).abs() < 1.0, "two sidecars share 100: {stdout}");
    }
}
