//! One plot per scenario, as a self-contained SVG: capacity, Σ wants, Σ has and Σ offered load
//! over time, the first learning mode shaded and the shifts marked.

use std::fmt::Write as _;

use crate::{
    clock::Time,
    metrics::{Cause, Sample},
    sim::Outcome,
};

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 56.0;
const BOTTOM: f64 = 44.0;

/// The series drawn: label, colour, dash pattern, value.
type Series = (&'static str, &'static str, &'static str, fn(&Sample) -> f64);
const SERIES: [Series; 4] = [
    ("offered load", "#999999", "4 3", |s| s.demand),
    ("Σ wants", "#2ca02c", "", |s| s.wants),
    ("capacity", "#d62728", "", |s| s.capacity),
    ("Σ has", "#1f77b4", "", |s| s.has),
];

pub fn plot(outcome: &Outcome) -> String {
    let samples = &outcome.samples;
    let s = &outcome.summary;
    let end = samples.last().map_or(1.0, |last| last.t).max(1.0);
    let top = SERIES.iter().flat_map(|&(.., value)| samples.iter().map(value)).fold(0.0, f64::max) * 1.05;
    let y_step = nice_step(top.max(1.0));
    let y_max = (top / y_step).ceil().max(1.0) * y_step;
    let x = |t: f64| LEFT + t / end * (WIDTH - LEFT - RIGHT);
    let y = |v: f64| HEIGHT - BOTTOM - v / y_max * (HEIGHT - TOP - BOTTOM);

    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="20" font-size="15" font-weight="bold">{}</text>
<text x="{LEFT}" y="38" fill="#444">utilization {:.2}% · peak granted {:.2}% · reconverged ≤ {} after demand shifts, ≤ {} after failures · Jain {} · {:.2} RPC/s</text>
"##,
        escape(&title(outcome)),
        s.utilization * 100.0,
        s.granted_peak * 100.0,
        seconds(s.reconvergence_max(Cause::Demand)),
        seconds(s.reconvergence_max(Cause::Failure)),
        s.jain.map_or_else(|| "-".into(), |j| format!("{j:.4}")),
        s.rpcs_per_second,
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#f0f0f0"/>"##,
        x(0.0),
        x(s.learning_end.min(end)) - x(0.0),
        HEIGHT - TOP - BOTTOM
    );
    for shift in &s.shifts {
        let _ = writeln!(
            svg,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{TOP}" y2="{1:.1}" stroke="#ff7f0e" stroke-opacity="0.5" stroke-dasharray="2 3"><title>{2}</title></line>"##,
            x(shift.at),
            HEIGHT - BOTTOM,
            escape(&format!("{:.0} s: {}", shift.at, shift.what))
        );
    }
    for v in ticks(y_max, y_step) {
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{1:.1}" y2="{1:.1}" stroke="#ddd"/><text x="{2}" y="{3:.1}" text-anchor="end">{v}</text>"##,
            WIDTH - RIGHT,
            y(v),
            LEFT - 6.0,
            y(v) + 4.0
        );
    }
    for t in ticks(end, nice_step(end)) {
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{t}</text>"##,
            x(t),
            HEIGHT - BOTTOM + 16.0
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">simulated seconds</text>"##,
        (LEFT + WIDTH - RIGHT) / 2.0,
        HEIGHT - 8.0
    );
    for (i, &(label, colour, dash, value)) in SERIES.iter().enumerate() {
        let points: Vec<(f64, f64)> = samples.iter().map(|s| (x(s.t), y(value(s)))).collect();
        let points: Vec<String> = corners(&points).map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(
            svg,
            r##"<polyline fill="none" stroke="{colour}" stroke-width="1.5" stroke-dasharray="{dash}" points="{}"/>"##,
            points.join(" ")
        );
        let lx = WIDTH - RIGHT - 120.0 * (SERIES.len() - i) as f64;
        let _ = writeln!(
            svg,
            r##"<line x1="{lx}" x2="{end}" y1="{y}" y2="{y}" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{text}" y="{baseline}">{label}</text>"##,
            end = lx + 22.0,
            y = TOP - 6.0,
            text = lx + 26.0,
            baseline = TOP - 2.0,
            label = escape(label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn seconds(value: Option<Time>) -> String {
    value.map_or_else(|| "-".into(), |t| format!("{t:.0} s"))
}

fn title(outcome: &Outcome) -> String {
    if outcome.description.is_empty() {
        outcome.name.clone()
    } else {
        format!("{}: {}", outcome.name, outcome.description)
    }
}

/// A round step (1, 2 or 5 × 10ⁿ) giving about five ticks over `range`.
fn nice_step(range: f64) -> f64 {
    let rough = range / 5.0;
    let magnitude = 10f64.powf(rough.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|&step| step >= rough).unwrap_or(10.0 * magnitude)
}

/// The points of a polyline that are not in the middle of a flat stretch (a step function
/// such as Σ has needs only its corners).
fn corners(points: &[(f64, f64)]) -> impl Iterator<Item = (f64, f64)> + '_ {
    // Compared as drawn, to a tenth of a pixel.
    let level = |i: usize| (points[i].1 * 10.0).round();
    let last = points.len().saturating_sub(1);
    (0..points.len())
        .filter(move |&i| i == 0 || i == last || level(i - 1) != level(i) || level(i + 1) != level(i))
        .map(|i| points[i])
}

/// 0, step, 2·step, … up to `max`, rounded so that labels print short.
fn ticks(max: f64, step: f64) -> impl Iterator<Item = f64> {
    (0..).map(move |i| (i as f64 * step * 1e6).round() / 1e6).take_while(move |&v| v <= max + step / 2.0)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_stretches_keep_only_their_ends() {
        let points = [(0.0, 1.0), (1.0, 1.0), (2.0, 1.0), (3.0, 2.0), (4.0, 2.0)];
        assert_eq!(corners(&points).collect::<Vec<_>>(), [(0.0, 1.0), (2.0, 1.0), (3.0, 2.0), (4.0, 2.0)]);
    }

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(3600.0), 1000.0);
        assert_eq!(nice_step(600.0), 200.0);
        assert_eq!(nice_step(1100.0), 500.0);
        assert_eq!(nice_step(4.0), 1.0);
    }
}
