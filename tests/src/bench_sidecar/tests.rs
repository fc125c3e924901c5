use super::{
    report::{median, report},
    *,
};
use crate::harness::parse_cpu;

#[test]
fn reads_wrk_reports() {
    let report = "Running 1s test @ http://127.0.0.1:8080/
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
Latency   420.12us  100.00us   2.31ms   90.00%
Req/Sec    70.00k     1.00k   75.00k    80.00%
  Latency Distribution
 50%  410.00us
 75%  450.00us
 90%  500.00us
 99%    1.20ms
  70000 requests in 1.00s, 5.00MB read
  Non-2xx or 3xx responses: 3
Requests/sec:  69999.50
Transfer/sec:      5.00MB
";
    let pass = Pass { requests: 70000, requests_per_sec: 69999.5, p50_us: 410.0, p99_us: 1200.0, non_2xx: 3 };
    assert_eq!(parse_wrk(report), Some(pass));
    assert_eq!(micros("2.00s"), Some(2e6));
    assert_eq!(micros("3.00m"), None);
}

#[test]
fn reads_cpu_times_after_a_command_name_with_spaces() {
    let stat = "4242 (nginx: worker (1)) R 1 4242 4242 0 -1 4194560 120 0 0 0 1234 567 0 0 20 0 1 0 99 0 0";
    assert_eq!(parse_cpu(stat), Some((12.34, 5.67)));
    assert_eq!(parse_cpu("4242 (x) R 1"), None);
    let cpu = per_request((1.0, 2.0), (1.5, 3.0), 250_000);
    assert_eq!(cpu, Cpu { user: 2.0, system: 4.0 });
}

#[test]
fn goals_are_judged_on_the_median_round() {
    let pass = |rps, p50| {
        let load = Pass { requests: 0, requests_per_sec: rps, p50_us: 0.0, p99_us: 0.0, non_2xx: 0 };
        (load, Pass { requests: 0, requests_per_sec: 0.0, p50_us: p50, p99_us: 0.0, non_2xx: 0 })
    };
    let mut results = Vec::new();
    for (round, nginx, sidecar) in [(1, 50_000.0, 65_000.0), (2, 50_000.0, 52_000.0), (3, 40_000.0, 50_000.0)] {
        for (target, rps, p50) in
            [(Target::Direct, 100_000.0, 100.0), (Target::Nginx, nginx, 130.0), (Target::Sidecar, sidecar, 120.0)]
        {
            let (load, single) = pass(rps, p50);
            let cpu = (target != Target::Direct).then_some(Cpu { user: 4.0, system: 8.0 + f64::from(round) });
            results.push(Measurement { round, target, load, single, cpu });
        }
    }
    let text = report(&results, 3, &[(Target::Sidecar, 8.5)]);
    assert!(text.contains("4.00+9.00 µs"), "{text}");
    assert!(text.contains("CPU per request, nginx       median   14.00 µs  (rounds: 13.00, 14.00, 15.00)"), "{text}");
    // Rounds: 1.30, 1.04, 1.25 → median 1.25.
    assert!(text.contains("median    1.25×  (rounds: 1.30, 1.04, 1.25)  goal ≥ 1.2×  PASS"), "{text}");
    assert!(text.contains("sidecar idle RSS                        8.5 MB   goal ≤ 15 MB   PASS"), "{text}");
    assert!(text.contains("added p50 sidecar, 1 conn    median   20.00 µs"), "{text}");
    assert!(text.contains("spread   14.3%"), "{text}");
    assert_eq!(median(&[3.0, 1.0]), 2.0);
}

#[test]
fn a_second_sidecar_joins_after_the_first_and_is_compared_with_it() {
    let args =
        |extra: &[&str]| Args::try_parse_from(["sluice-bench-sidecar"].iter().chain(extra)).expect("valid arguments");
    let alt = targets(&args(&["--sidecar-alt", "/bin/other"])).unwrap();
    assert_eq!(alt, [Target::Direct, Target::Nginx, Target::Relay, Target::Sidecar, Target::SidecarAlt]);
    let first = targets(&args(&["--sidecar-alt", "x", "--targets", "sidecar,direct"])).unwrap();
    assert_eq!(first, [Target::Sidecar, Target::SidecarAlt, Target::Direct]);
    assert!(targets(&args(&["--targets", "sidecar-alt"])).is_err());

    let pass = |rps, p50| Pass { requests: 0, requests_per_sec: rps, p50_us: p50, p99_us: 0.0, non_2xx: 0 };
    let mut results = Vec::new();
    for round in 1..=2 {
        for (target, rps, cpu) in [
            (Target::Direct, 100_000.0, None),
            (Target::Sidecar, 50_000.0, Some(16.0)),
            (Target::SidecarAlt, 40_000.0, Some(20.0)),
        ] {
            let cpu = cpu.map(|total| Cpu { user: total / 4.0, system: total * 3.0 / 4.0 });
            results.push(Measurement { round, target, load: pass(rps, 0.0), single: pass(0.0, 100.0), cpu });
        }
    }
    let text = report(&results, 2, &[(Target::Sidecar, 8.0), (Target::SidecarAlt, 9.0)]);
    assert!(text.contains("sidecar-alt/sidecar throughput median    0.80×"), "{text}");
    assert!(text.contains("CPU per request, alt/sidecar median    1.25×"), "{text}");
    assert!(text.contains("sidecar-alt idle RSS"), "{text}");
}
