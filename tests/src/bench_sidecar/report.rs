//! The benchmark's report: every round's figures, then the medians over rounds against the goals.

use std::fmt::Write as _;

use super::{Cpu, GOAL_ADDED_P50_US, GOAL_RSS_MB, GOAL_VS_NGINX, Measurement, Target};

/// Every pass, then the goals judged on the median over the rounds of each round's figure.
pub(super) fn report(results: &[Measurement], rounds: u32, sidecar_rss: &[(Target, f64)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{:<6} {:<11} {:>10} {:>14} {:>14} {:>16} {:>8} {:>17}",
        "round", "target", "req/s", "p50 load µs", "p99 load µs", "p50 1 conn µs", "non-2xx", "CPU/req user+sys"
    );
    for m in results {
        let cpu = m.cpu.map_or_else(|| "-".to_owned(), |c| format!("{:.2}+{:.2} µs", c.user, c.system));
        let _ = writeln!(
            out,
            "{:<6} {:<11} {:>10.0} {:>14.0} {:>14.0} {:>16.1} {:>8} {:>17}",
            m.round,
            m.target.name(),
            m.load.requests_per_sec,
            m.load.p50_us,
            m.load.p99_us,
            m.single.p50_us,
            m.load.non_2xx + m.single.non_2xx,
            cpu
        );
    }
    // One figure per round, from that round's passes; `None` if a target was not measured.
    let per_round = |figure: &dyn Fn(Round<'_>) -> Option<f64>| -> Option<Vec<f64>> {
        (1..=rounds).map(|round| figure(Round { results, round })).collect()
    };
    let line = |out: &mut String, label: &str, unit: &str, values: &[f64], goal: Option<(bool, String)>| {
        let each: Vec<String> = values.iter().map(|v| format!("{v:.2}")).collect();
        let _ = write!(out, "{label:<28} median {:>7.2}{unit}  (rounds: {})", median(values), each.join(", "));
        if let Some((pass, goal)) = goal {
            let _ = write!(out, "  goal {goal}  {}", if pass { "PASS" } else { "MISS" });
        }
        out.push('\n');
    };
    out.push('\n');
    let throughput = |of: Target, over: Target| {
        per_round(&|r| Some(r.get(of)?.load.requests_per_sec / r.get(over)?.load.requests_per_sec))
    };
    if let Some(ratios) = throughput(Target::Sidecar, Target::Nginx) {
        let goal = (median(&ratios) >= GOAL_VS_NGINX, format!("≥ {GOAL_VS_NGINX}×"));
        line(&mut out, "sidecar/nginx throughput", "×", &ratios, Some(goal));
    }
    // How far the sidecar is from the relay, what no proxy can pass here, and the second sidecar
    // against the first.
    for (of, over) in [
        (Target::Sidecar, Target::Direct),
        (Target::Sidecar, Target::Relay),
        (Target::Relay, Target::Nginx),
        (Target::SidecarAlt, Target::Sidecar),
    ] {
        if let Some(ratios) = throughput(of, over) {
            line(&mut out, &format!("{}/{} throughput", of.name(), over.name()), "×", &ratios, None);
        }
    }
    let proxies = [Target::Sidecar, Target::SidecarAlt, Target::Nginx, Target::Relay];
    for target in proxies {
        let added = per_round(&|r| Some(r.get(target)?.single.p50_us - r.get(Target::Direct)?.single.p50_us));
        if let Some(added) = added {
            let goal =
                target.is_sidecar().then(|| (median(&added) <= GOAL_ADDED_P50_US, format!("≤ {GOAL_ADDED_P50_US} µs")));
            line(&mut out, &format!("added p50 {}, 1 conn", target.name()), " µs", &added, goal);
        }
    }
    // CPU per request is the figure least disturbed by other work on the machine; its spread over
    // the rounds, (max − min) / median, is the run-to-run noise a difference must exceed.
    for target in proxies {
        if let Some(cpu) = per_round(&|r| r.get(target)?.cpu.map(Cpu::total)) {
            line(&mut out, &format!("CPU per request, {}", target.name()), " µs", &cpu, None);
            let _ = writeln!(out, "{:<28} spread {:>6.1}%", "", spread(&cpu) * 100.0);
        }
    }
    let cpu_ratio =
        per_round(&|r| Some(r.get(Target::SidecarAlt)?.cpu?.total() / r.get(Target::Sidecar)?.cpu?.total()));
    if let Some(ratios) = cpu_ratio {
        line(&mut out, "CPU per request, alt/sidecar", "×", &ratios, None);
    }
    for &(target, rss) in sidecar_rss {
        let _ = writeln!(
            out,
            "{:<28} {rss:>14.1} MB   goal ≤ {GOAL_RSS_MB} MB   {}",
            format!("{} idle RSS", target.name()),
            if rss <= GOAL_RSS_MB { "PASS" } else { "MISS" }
        );
    }
    out
}

/// (max − min) / median: how far the rounds' figures scatter.
fn spread(values: &[f64]) -> f64 {
    let (min, max) = values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    (max - min) / median(values)
}

/// One round's passes.
#[derive(Clone, Copy)]
struct Round<'a> {
    results: &'a [Measurement],
    round: u32,
}

impl<'a> Round<'a> {
    fn get(self, target: Target) -> Option<&'a Measurement> {
        self.results.iter().find(|m| m.round == self.round && m.target == target)
    }
}

pub(super) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 }
}
