//! One plot per scenario, as a self-contained SVG: capacity, Σ wants, Σ has and Σ offered load
//! over time, the first learning mode shaded and the shifts marked; for a run with a service,
//! its capacity, the capacity learned, the goodput and the p99 latency instead.

use std::fmt::Write as _;

use crate::{
    adaptive::{self, Figures, phases},
    clock::Time,
    metrics::{Cause, Sample},
    service::Record,
    sim::Outcome,
};

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 56.0;
const BOTTOM: f64 = 44.0;
/// A run with a service: the rates above, the latency below.
const SERVICE_HEIGHT: f64 = 620.0;
const LATENCY_TOP: f64 = 420.0;

/// A line drawn: label, colour, dash pattern, points (time, value).
type Line<'a> = (&'a str, &'a str, &'a str, &'a [(f64, f64)]);

/// The series drawn: label, colour, dash pattern, value.
type Series = (&'static str, &'static str, &'static str, fn(&Sample) -> f64);
const SERIES: [Series; 4] = [
    ("offered load", "#999999", "4 3", |s| s.demand),
    ("Σ wants", "#2ca02c", "", |s| s.wants),
    ("capacity", "#d62728", "", |s| s.capacity),
    ("Σ has", "#1f77b4", "", |s| s.has),
];

pub fn plot(outcome: &Outcome) -> String {
    if let Some(record) = &outcome.record {
        return service_plot(outcome, record);
    }
    let samples = &outcome.samples;
    let s = &outcome.summary;
    let end = samples.last().map_or(1.0, |last| last.t).max(1.0);
    let top = SERIES.iter().flat_map(|&(.., value)| samples.iter().map(value)).fold(0.0, f64::max);
    let frame = Frame::new(TOP, HEIGHT - BOTTOM, end, top);
    let subtitle = format!(
        "utilization {:.2}% · peak granted {:.2}% · reconverged ≤ {} after demand shifts, ≤ {} after failures · Jain {} · {:.2} RPC/s",
        s.utilization * 100.0,
        s.granted_peak * 100.0,
        seconds(s.reconvergence_max(Cause::Demand)),
        seconds(s.reconvergence_max(Cause::Failure)),
        s.jain.map_or_else(|| "-".into(), |j| format!("{j:.4}")),
        s.rpcs_per_second,
    );
    let mut svg = header(outcome, HEIGHT, &subtitle);
    let _ = writeln!(
        svg,
        r##"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#f0f0f0"/>"##,
        frame.x(0.0),
        frame.x(s.learning_end.min(end)) - frame.x(0.0),
        HEIGHT - TOP - BOTTOM
    );
    frame.shifts(&mut svg, outcome);
    frame.grid(&mut svg);
    frame.time_axis(&mut svg);
    for (i, &(label, colour, dash, value)) in SERIES.iter().enumerate() {
        let points: Vec<(f64, f64)> = samples.iter().map(|s| (s.t, value(s))).collect();
        frame.line(&mut svg, &points, colour, dash);
        frame.legend(&mut svg, SERIES.len() - i, label, colour, dash);
    }
    svg.push_str("</svg>\n");
    svg
}

/// A run with a service: above, its capacity, the capacity learned and the goodput (calls a
/// second, by the second they were sent in); below, the p99 latency of each second's admitted
/// calls against twice the unloaded latency.
fn service_plot(outcome: &Outcome, record: &Record) -> String {
    let figures: Figures = adaptive::figures(record);
    let end = record.seconds.len().max(1) as f64;
    let capacity: Vec<(f64, f64)> =
        phases(record).iter().flat_map(|p| [(p.start as f64, p.capacity), (p.end as f64, p.capacity)]).collect();
    let learned: Vec<(f64, f64)> = outcome.samples.iter().map(|s| (s.t, s.capacity)).collect();
    // Each second's figure drawn at its middle.
    let per_second = |value: &dyn Fn(usize) -> f64| -> Vec<(f64, f64)> {
        (0..record.seconds.len()).map(|t| (t as f64 + 0.5, value(t))).collect()
    };
    let goodput = per_second(&|t| record.seconds[t].ok as f64);
    let p99 = per_second(&|t| 1000.0 * adaptive::quantile(record.seconds[t].latencies.clone(), 0.99));
    let bound = 2000.0 * record.unloaded;
    let rates: [Line; 3] = [
        ("service", "#999999", "4 3", &capacity),
        ("learned", "#d62728", "", &learned),
        ("goodput", "#1f77b4", "", &goodput),
    ];
    let mut svg = header(outcome, SERVICE_HEIGHT, &adaptive::line(&figures));
    // Up to twice the service's capacity: a start far above it would flatten the rest.
    let top = capacity.iter().map(|p| 2.0 * p.1).fold(0.0, f64::max);
    let above = Frame::new(TOP, LATENCY_TOP - BOTTOM, end, top);
    above.shifts(&mut svg, outcome);
    above.grid(&mut svg);
    above.time_axis(&mut svg);
    for (i, &(label, colour, dash, points)) in rates.iter().enumerate() {
        above.line(&mut svg, &above.clip(points), colour, dash);
        above.legend(&mut svg, rates.len() - i, label, colour, dash);
    }
    // Latency on a scale that shows the bound even when a queue makes it tiny.
    let highest = p99.iter().map(|p| p.1).fold(bound, f64::max).min(25.0 * bound);
    let below = Frame::new(LATENCY_TOP + 24.0, SERVICE_HEIGHT - BOTTOM, end, highest);
    below.shifts(&mut svg, outcome);
    below.grid(&mut svg);
    below.time_axis(&mut svg);
    below.line(&mut svg, &[(0.0, bound), (end, bound)], "#2ca02c", "4 3");
    below.line(&mut svg, &below.clip(&p99), "#9467bd", "");
    below.legend(&mut svg, 2, "p99, ms", "#9467bd", "");
    below.legend(&mut svg, 1, "2 × unloaded", "#2ca02c", "4 3");
    let _ = writeln!(svg, r##"<text x="{LEFT}" y="{:.1}" fill="#444">calls/s</text>"##, TOP - 2.0);
    svg.push_str("</svg>\n");
    svg
}

/// The page, its title and the line under it.
fn header(outcome: &Outcome, height: f64, subtitle: &str) -> String {
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="20" font-size="15" font-weight="bold">{}</text>
<text x="{LEFT}" y="38" fill="#444">{}</text>
"##,
        escape(&title(outcome)),
        escape(subtitle),
    );
    svg
}

/// A chart between `top` and `bottom` on the page: time from 0 to `end` across, values from 0
/// to a round number above `highest` up.
struct Frame {
    top: f64,
    bottom: f64,
    end: f64,
    y_max: f64,
    y_step: f64,
}

impl Frame {
    fn new(top: f64, bottom: f64, end: f64, highest: f64) -> Frame {
        let highest = highest * 1.05;
        let y_step = nice_step(highest.max(1.0));
        Frame { top, bottom, end, y_max: (highest / y_step).ceil().max(1.0) * y_step, y_step }
    }

    fn x(&self, t: f64) -> f64 {
        LEFT + t / self.end * (WIDTH - LEFT - RIGHT)
    }

    fn y(&self, v: f64) -> f64 {
        self.bottom - v / self.y_max * (self.bottom - self.top)
    }

    /// Every shift, a dashed line with its description.
    fn shifts(&self, svg: &mut String, outcome: &Outcome) {
        for shift in &outcome.summary.shifts {
            let _ = writeln!(
                svg,
                r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1}" y2="{2:.1}" stroke="#ff7f0e" stroke-opacity="0.5" stroke-dasharray="2 3"><title>{3}</title></line>"##,
                self.x(shift.at),
                self.top,
                self.bottom,
                escape(&format!("{:.0} s: {}", shift.at, shift.what))
            );
        }
    }

    fn grid(&self, svg: &mut String) {
        for v in ticks(self.y_max, self.y_step) {
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" x2="{:.1}" y1="{1:.1}" y2="{1:.1}" stroke="#ddd"/><text x="{2}" y="{3:.1}" text-anchor="end">{v}</text>"##,
                WIDTH - RIGHT,
                self.y(v),
                LEFT - 6.0,
                self.y(v) + 4.0
            );
        }
    }

    fn time_axis(&self, svg: &mut String) {
        for t in ticks(self.end, nice_step(self.end)) {
            let _ = writeln!(
                svg,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{t}</text>"##,
                self.x(t),
                self.bottom + 16.0
            );
        }
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">simulated seconds</text>"##,
            (LEFT + WIDTH - RIGHT) / 2.0,
            self.bottom + 36.0
        );
    }

    /// `points` with their values cut at the top of the chart.
    fn clip(&self, points: &[(f64, f64)]) -> Vec<(f64, f64)> {
        points.iter().map(|&(t, v)| (t, v.min(self.y_max))).collect()
    }

    /// `points` (time, value) as a polyline.
    fn line(&self, svg: &mut String, points: &[(f64, f64)], colour: &str, dash: &str) {
        let points: Vec<(f64, f64)> = points.iter().map(|&(t, v)| (self.x(t), self.y(v))).collect();
        let points: Vec<String> = corners(&points).map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(
            svg,
            r##"<polyline fill="none" stroke="{colour}" stroke-width="1.5" stroke-dasharray="{dash}" points="{}"/>"##,
            points.join(" ")
        );
    }

    /// A legend entry above the chart, the `from_right`th from its right edge.
    fn legend(&self, svg: &mut String, from_right: usize, label: &str, colour: &str, dash: &str) {
        let lx = WIDTH - RIGHT - 120.0 * from_right as f64;
        let _ = writeln!(
            svg,
            r##"<line x1="{lx}" x2="{end}" y1="{y}" y2="{y}" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{text}" y="{baseline}">{label}</text>"##,
            end = lx + 22.0,
            y = self.top - 6.0,
            text = lx + 26.0,
            baseline = self.top - 2.0,
            label = escape(label)
        );
    }
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
