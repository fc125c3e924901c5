//! Small inline SVG line charts for the status pages of both binaries: a few lines over the last
//! minutes, the y axis from 0 to a round maximum, and a legend with each line's latest value.

use std::fmt::Write;

use crate::{html::escape, when};

const WIDTH: f64 = 380.0;
const PLOT_LEFT: f64 = 46.0;
const PLOT_RIGHT: f64 = WIDTH - 10.0;
const PLOT_TOP: f64 = 10.0;
const PLOT_BOTTOM: f64 = 100.0;
/// The x axis labels sit below the plot, the legend below them in rows of two.
const LEGEND_TOP: f64 = PLOT_BOTTOM + 36.0;
const LEGEND_ROW: f64 = 16.0;
const LEGEND_COLUMN: f64 = (WIDTH - PLOT_LEFT) / 2.0;

/// The capacity line's colour on both binaries' charts.
pub const CAPACITY_COLOR: &str = "#555555";

/// Lays the charts of a status page out side by side.
pub const CHART_STYLE: &str = ".charts{display:flex;flex-wrap:wrap;gap:8px}figure{margin:0;border:1px solid #ddd;padding:4px}figcaption{font-size:13px}";

/// One line: its name in the legend, its colour, whether it is dashed (so that a limit shows
/// through a line that runs along it), and `(time, value)` points oldest first. A value that is
/// not finite (unknown, or no limit) leaves a gap.
pub struct Line {
    pub label: String,
    pub color: &'static str,
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

pub struct Chart<'a> {
    /// What the chart shows, for screen readers and as a tooltip.
    pub title: &'a str,
    /// Appended to the values shown, e.g. "/s"; may be empty.
    pub unit: &'a str,
    /// The time at the right edge (the page's), and how many seconds before it the left edge is.
    pub end: f64,
    pub window: f64,
    pub lines: Vec<Line>,
}

impl Chart<'_> {
    /// The chart as an `<svg>` element to put inline in a page.
    pub fn svg(&self) -> String {
        let window = if self.window.is_finite() && self.window > 0.0 { self.window } else { 1.0 };
        let start = self.end - window;
        let shown = |&&(t, v): &&(f64, f64)| t >= start && t <= self.end && v.is_finite();
        let top = self.lines.iter().flat_map(|l| l.points.iter().filter(shown).map(|&(_, v)| v)).fold(0.0, f64::max);
        let y_max = round_up(top);
        let x = |t: f64| PLOT_LEFT + (t - start) / window * (PLOT_RIGHT - PLOT_LEFT);
        let y = |v: f64| PLOT_BOTTOM - v.clamp(0.0, y_max) / y_max * (PLOT_BOTTOM - PLOT_TOP);
        let rows = self.lines.len().div_ceil(2) as f64;
        let height = LEGEND_TOP + rows * LEGEND_ROW;
        let unit = escape(self.unit);

        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" role=\"img\" width=\"{WIDTH}\" height=\"{height}\" \
             viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\" font-size=\"11\"><title>{}</title>",
            escape(self.title)
        );
        // The frame, a middle grid line and the axis labels.
        let middle = (PLOT_TOP + PLOT_BOTTOM) / 2.0;
        let _ = write!(
            svg,
            "<rect x=\"{PLOT_LEFT}\" y=\"{PLOT_TOP}\" width=\"{}\" height=\"{}\" fill=\"#fafafa\" stroke=\"#bbb\"/>\
             <line x1=\"{PLOT_LEFT}\" y1=\"{middle}\" x2=\"{PLOT_RIGHT}\" y2=\"{middle}\" stroke=\"#e4e4e4\"/>\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}{unit}</text>\
             <text x=\"{}\" y=\"{PLOT_BOTTOM}\" text-anchor=\"end\">0</text>\
             <text x=\"{PLOT_LEFT}\" y=\"{}\">{} ago</text>\
             <text x=\"{PLOT_RIGHT}\" y=\"{}\" text-anchor=\"end\">now</text>",
            PLOT_RIGHT - PLOT_LEFT,
            PLOT_BOTTOM - PLOT_TOP,
            PLOT_LEFT - 4.0,
            PLOT_TOP + 8.0,
            number(y_max),
            PLOT_LEFT - 4.0,
            PLOT_BOTTOM + 14.0,
            when::span(window as u64),
            PLOT_BOTTOM + 14.0,
        );
        for (i, line) in self.lines.iter().enumerate() {
            let dash = if line.dashed { " stroke-dasharray=\"6 3\"" } else { "" };
            // Runs of shown points, split where a value is missing or out of the window.
            let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
            for point in &line.points {
                match shown(&point) {
                    true => runs.last_mut().expect("a run").push((x(point.0), y(point.1))),
                    false if runs.last().is_some_and(|r| !r.is_empty()) => runs.push(Vec::new()),
                    false => {}
                }
            }
            for run in runs.iter().filter(|r| !r.is_empty()) {
                let points: Vec<String> = run.iter().map(|(px, py)| format!("{px:.1},{py:.1}")).collect();
                let _ = write!(
                    svg,
                    "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{dash} points=\"{}\"/>",
                    line.color,
                    points.join(" ")
                );
            }
            // The latest value: a dot at the end of the line, and in the legend.
            let latest = line.points.iter().rev().find(shown).copied();
            if let Some((t, v)) = latest {
                let _ =
                    write!(svg, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{}\"/>", x(t), y(v), line.color);
            }
            let (lx, ly) = (
                PLOT_LEFT + (i % 2) as f64 * LEGEND_COLUMN,
                LEGEND_TOP + (i / 2) as f64 * LEGEND_ROW - LEGEND_ROW / 2.0,
            );
            let value = latest.map_or_else(|| "–".to_owned(), |(_, v)| format!("{}{unit}", number(v)));
            let _ = write!(
                svg,
                "<line x1=\"{lx}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"3\"{dash}/>\
                 <text x=\"{}\" y=\"{ly}\">{} <tspan font-weight=\"bold\">{value}</tspan></text>",
                ly - 4.0,
                lx + 14.0,
                ly - 4.0,
                line.color,
                lx + 18.0,
                escape(&line.label),
            );
        }
        svg.push_str("</svg>");
        svg
    }
}

/// The smallest of 1, 2 or 5 times a power of ten at or above `top` (1 for nothing above 0),
/// so that the axis maximum reads as a round number.
fn round_up(top: f64) -> f64 {
    if !(top.is_finite() && top > 0.0) {
        return 1.0;
    }
    let power = 10f64.powf(top.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * power).find(|&v| v >= top).unwrap_or(10.0 * power)
}

/// A value with about three significant digits, without trailing zeros: "0.25", "12.5", "1200".
pub fn number(v: f64) -> String {
    if !v.is_finite() {
        return "–".to_owned();
    }
    let magnitude = v.abs();
    if magnitude >= 1e6 {
        return format!("{v:.2e}");
    }
    let decimals = if magnitude == 0.0 { 0 } else { (2 - magnitude.log10().floor() as i32).clamp(0, 3) as usize };
    let text = format!("{v:.decimals$}");
    match text.contains('.') {
        true => text.trim_end_matches('0').trim_end_matches('.').to_owned(),
        false => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(lines: Vec<Line>) -> Chart<'static> {
        Chart { title: "orders <write>", unit: "/s", end: 1_000.0, window: 600.0, lines }
    }

    #[test]
    fn lines_become_polylines_with_a_round_maximum_and_a_legend() {
        let capacity = Line {
            label: "capacity".into(),
            color: "#d62728",
            dashed: true,
            points: vec![(400.0, 100.0), (1_000.0, 100.0)],
        };
        let has = Line {
            label: "Σ has".into(),
            color: "#1f77b4",
            dashed: false,
            points: vec![(700.0, 30.0), (1_000.0, 42.5)],
        };
        let svg = chart(vec![capacity, has]).svg();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"), "{svg}");
        assert!(svg.contains("<title>orders &lt;write&gt;</title>"), "escaped: {svg}");
        // x: 46 + (t - 400) / 600 × 324; y: 100 - v / 100 × 90.
        assert!(svg.contains("stroke-dasharray=\"6 3\" points=\"46.0,10.0 370.0,10.0\""), "{svg}");
        assert!(svg.contains("points=\"208.0,73.0 370.0,61.8\""), "{svg}");
        assert!(svg.contains(">100/s</text>"), "axis maximum: {svg}");
        assert!(svg.contains(">10 min ago</text>") && svg.contains(">now</text>"), "{svg}");
        assert!(svg.contains("Σ has <tspan font-weight=\"bold\">42.5/s</tspan>"), "latest value: {svg}");
        assert_eq!(svg.matches("<circle").count(), 2);
    }

    #[test]
    fn gaps_and_points_outside_the_window_split_lines() {
        let points = vec![(100.0, 5.0), (500.0, 1.0), (600.0, f64::NAN), (700.0, 2.0), (800.0, 3.0), (2_000.0, 9.0)];
        let svg = chart(vec![Line { label: "a".into(), color: "red", dashed: false, points }]).svg();
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        assert!(svg.contains(">5/s</text>"), "9 at t=2000 is after the end, 5 at t=100 before the start: {svg}");
        assert!(svg.contains("a <tspan font-weight=\"bold\">3/s</tspan>"), "{svg}");
    }

    #[test]
    fn empty_and_odd_charts_still_draw() {
        let empty = Line { label: "nothing".into(), color: "red", dashed: false, points: vec![] };
        let odd = Line {
            label: "odd".into(),
            color: "blue",
            dashed: false,
            points: vec![(f64::NAN, 1.0), (1_000.0, f64::INFINITY)],
        };
        let mut c = chart(vec![empty, odd]);
        c.window = 0.0;
        let svg = c.svg();
        assert!(!svg.contains("<polyline") && svg.contains(">1/s</text>"), "{svg}");
        assert!(svg.contains("nothing <tspan font-weight=\"bold\">–</tspan>"), "{svg}");
    }

    #[test]
    fn axis_maxima_and_numbers_are_round() {
        let cases = [
            (0.0, 1.0),
            (-3.0, 1.0),
            (f64::NAN, 1.0),
            (0.3, 0.5),
            (1.0, 1.0),
            (1.01, 2.0),
            (42.5, 50.0),
            (100.0, 100.0),
            (501.0, 1_000.0),
        ];
        for (top, max) in cases {
            assert_eq!(round_up(top), max, "{top}");
        }
        let numbers = [
            (0.0, "0"),
            (0.25, "0.25"),
            (12.5, "12.5"),
            (1_200.0, "1200"),
            (2.0 / 3.0, "0.667"),
            (-4.0, "-4"),
            (3e9, "3.00e9"),
        ];
        for (v, text) in numbers {
            assert_eq!(number(v), text, "{v}");
        }
    }
}
