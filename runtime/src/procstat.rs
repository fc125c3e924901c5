//! The process's own series in /metrics, as Prometheus's client libraries name them
//! (`process_*`, read from /proc/self on Linux; left out elsewhere), and `sluice_build_info`.
//! Written as exposition text rather than through the recorder: the recorder's counters are
//! whole numbers and its gauges go stale when idle, and these are read afresh at each scrape.

use std::fmt::Write;

/// Clock ticks a second in /proc's times: USER_HZ, fixed at 100 in Linux's user-space ABI.
const TICKS_PER_SECOND: f64 = 100.0;

/// The families to append to a /metrics page of `binary` (`sluice-server`, `sluice-sidecar`).
pub fn exposition(binary: &str, version: &str) -> String {
    let mut out = String::with_capacity(1024);
    let mut family = |name: &str, kind: &str, help: &str, value: Option<f64>| {
        if let Some(value) = value {
            let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n\n");
        }
    };
    let stat = Stat::read();
    family(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        stat.as_ref().map(|s| s.cpu_ticks as f64 / TICKS_PER_SECOND),
    );
    family(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        stat.as_ref().and_then(|s| Some(boot_time()? as f64 + s.start_ticks as f64 / TICKS_PER_SECOND)),
    );
    family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", resident_bytes());
    family("process_open_fds", "gauge", "Number of open file descriptors.", open_fds());
    family("process_max_fds", "gauge", "Maximum number of open file descriptors.", max_fds());
    let _ = write!(
        out,
        "# HELP sluice_build_info Always 1: the binary and its version.\n# TYPE sluice_build_info gauge\n\
         sluice_build_info{{version=\"{version}\",binary=\"{binary}\"}} 1\n"
    );
    out
}

/// What /proc/self/stat says, in clock ticks.
struct Stat {
    cpu_ticks: u64,
    /// Since boot.
    start_ticks: u64,
}

impl Stat {
    fn read() -> Option<Stat> {
        let text = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name, in parentheses, may hold spaces; fields 3 onwards follow its `)`.
        let fields: Vec<&str> = text.get(text.rfind(')')? + 1..)?.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(Stat { cpu_ticks: field(14)? + field(15)?, start_ticks: field(22)? })
    }
}

/// Unix time the machine booted, from /proc/stat.
fn boot_time() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()
}

fn resident_bytes() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 =
        text.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib as f64 * 1024.0)
}

fn open_fds() -> Option<f64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as f64)
}

/// The soft limit on open files (+Inf when unlimited).
fn max_fds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    match text.lines().find_map(|l| l.strip_prefix("Max open files"))?.split_whitespace().next()? {
        "unlimited" => Some(f64::INFINITY),
        soft => soft.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_is_there_on_linux() {
        let text = exposition("sluice-test", "1.2.3");
        let value = |name: &str| -> f64 {
            let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert!(value("process_cpu_seconds_total") >= 0.0);
        assert!(value("process_resident_memory_bytes") > 1e6);
        assert!(value("process_open_fds") > 0.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let start = value("process_start_time_seconds");
        assert!(start <= now + 2.0 && start > now - 3600.0, "{start} vs {now}");
        assert!(text.contains("# TYPE process_cpu_seconds_total counter\n"));
        assert!(text.ends_with("sluice_build_info{version=\"1.2.3\",binary=\"sluice-test\"} 1\n"));
    }
}
