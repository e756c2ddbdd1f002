//! A small hand-written SVG writer: grouped bar charts and line charts.
//!
//! Output is a self-contained `<svg>` string with a title, labelled axes with "nice" ticks,
//! a legend, and (for bars) the value printed on each bar. No dependency, no scripts.

use std::fmt::Write;

use crate::hist::fmt_si;

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 480.0;
const MARGIN_LEFT: f64 = 90.0;
const MARGIN_RIGHT: f64 = 190.0;
const MARGIN_TOP: f64 = 50.0;
const MARGIN_BOTTOM: f64 = 70.0;
const Y_TICKS: usize = 5;

/// Colours for series, in order (colour-blind friendly, from the Okabe–Ito palette).
const PALETTE: [&str; 8] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
];

/// One series of a bar chart: one value per category (`None`: not measured).
#[derive(Clone, Debug)]
pub struct BarSeries {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

/// Bars grouped by category (x), one bar per series in each group.
#[derive(Clone, Debug)]
pub struct BarChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub categories: Vec<String>,
    pub series: Vec<BarSeries>,
}

/// One line of a line chart.
#[derive(Clone, Debug)]
pub struct LineSeries {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

#[derive(Clone, Debug)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<LineSeries>,
}

/// An axis label: [`fmt_si`] without trailing zeros (`50 k`, `2.5 M`).
fn fmt_tick(v: f64) -> String {
    let s = fmt_si(v);
    let (number, suffix) = match s.find(' ') {
        Some(i) => s.split_at(i),
        None => (s.as_str(), ""),
    };
    let number = if number.contains('.') {
        number.trim_end_matches('0').trim_end_matches('.')
    } else {
        number
    };
    format!("{number}{suffix}")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step (1, 2 or 5 × 10^k) giving about `ticks` intervals up to `max`.
fn nice_step(max: f64, ticks: usize) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / ticks as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let fraction = raw / magnitude;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

/// The axis top (a multiple of the step at or above `max`) and the step.
fn nice_axis(max: f64) -> (f64, f64) {
    let step = nice_step(max, Y_TICKS);
    let top = (max / step).ceil().max(1.0) * step;
    (top, step)
}

struct Frame {
    out: String,
    plot_x: f64,
    plot_y: f64,
    plot_w: f64,
    plot_h: f64,
}

impl Frame {
    fn new(title: &str, x_label: &str, y_label: &str) -> Frame {
        let mut out = String::with_capacity(8192);
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            out,
            r#"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
        );
        let plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
        let plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="28" text-anchor="middle" font-size="16" font-weight="bold">{}</text>"#,
            MARGIN_LEFT + plot_w / 2.0,
            escape(title)
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            MARGIN_LEFT + plot_w / 2.0,
            HEIGHT - 18.0,
            escape(x_label)
        );
        let cy = MARGIN_TOP + plot_h / 2.0;
        let _ = writeln!(
            out,
            r#"<text x="20" y="{cy}" text-anchor="middle" transform="rotate(-90 20 {cy})">{}</text>"#,
            escape(y_label)
        );
        Frame {
            out,
            plot_x: MARGIN_LEFT,
            plot_y: MARGIN_TOP,
            plot_w,
            plot_h,
        }
    }

    /// Horizontal grid lines and y tick labels from 0 to `top` every `step`.
    fn y_axis(&mut self, top: f64, step: f64) {
        let mut v = 0.0;
        while v <= top + step / 2.0 {
            let y = self.y_of(v, top);
            let _ = writeln!(
                self.out,
                r##"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#dddddd"/>"##,
                self.plot_x,
                self.plot_x + self.plot_w
            );
            let _ = writeln!(
                self.out,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                self.plot_x - 8.0,
                y + 4.0,
                fmt_tick(v)
            );
            v += step;
        }
        let _ = writeln!(
            self.out,
            r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#333333"/>"##,
            self.plot_y,
            self.plot_y + self.plot_h,
            x = self.plot_x
        );
        let _ = writeln!(
            self.out,
            r##"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="#333333"/>"##,
            self.plot_x,
            self.plot_x + self.plot_w,
            y = self.plot_y + self.plot_h
        );
    }

    fn y_of(&self, v: f64, top: f64) -> f64 {
        self.plot_y + self.plot_h - (v / top).clamp(0.0, 1.0) * self.plot_h
    }

    fn legend(&mut self, names: &[&str]) {
        let x = self.plot_x + self.plot_w + 20.0;
        for (i, name) in names.iter().enumerate() {
            let y = self.plot_y + 10.0 + i as f64 * 22.0;
            let _ = writeln!(
                self.out,
                r#"<rect x="{x}" y="{}" width="14" height="14" fill="{}"/>"#,
                y - 11.0,
                PALETTE[i % PALETTE.len()]
            );
            let _ = writeln!(
                self.out,
                r#"<text x="{}" y="{y}">{}</text>"#,
                x + 20.0,
                escape(name)
            );
        }
    }

    fn finish(mut self) -> String {
        self.out.push_str("</svg>\n");
        self.out
    }
}

impl BarChart {
    pub fn render(&self) -> String {
        let mut f = Frame::new(&self.title, &self.x_label, &self.y_label);
        let max = self
            .series
            .iter()
            .flat_map(|s| s.values.iter().flatten())
            .fold(0.0f64, |m, &v| m.max(v));
        let (top, step) = nice_axis(max);
        f.y_axis(top, step);
        let groups = self.categories.len().max(1) as f64;
        let group_w = f.plot_w / groups;
        let bars = self.series.len().max(1) as f64;
        let bar_w = group_w * 0.8 / bars;
        let label_size = if bar_w < 34.0 { 9 } else { 11 };
        for (c, category) in self.categories.iter().enumerate() {
            let group_x = f.plot_x + c as f64 * group_w + group_w * 0.1;
            let _ = writeln!(
                f.out,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
                f.plot_x + (c as f64 + 0.5) * group_w,
                f.plot_y + f.plot_h + 20.0,
                escape(category)
            );
            for (s, series) in self.series.iter().enumerate() {
                let x = group_x + s as f64 * bar_w;
                let cx = x + bar_w / 2.0;
                match series.values.get(c).copied().flatten() {
                    Some(v) => {
                        let y = f.y_of(v, top);
                        let h = f.plot_y + f.plot_h - y;
                        let _ = writeln!(
                            f.out,
                            r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{h:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                            (bar_w - 2.0).max(1.0),
                            PALETTE[s % PALETTE.len()],
                            escape(&series.name),
                            fmt_si(v)
                        );
                        let _ = writeln!(
                            f.out,
                            r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-size="{label_size}">{}</text>"#,
                            y - 4.0,
                            fmt_si(v)
                        );
                    }
                    None => {
                        let _ = writeln!(
                            f.out,
                            r##"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-size="{label_size}" fill="#999999">n/a</text>"##,
                            f.plot_y + f.plot_h - 4.0
                        );
                    }
                }
            }
        }
        let names: Vec<&str> = self.series.iter().map(|s| s.name.as_str()).collect();
        f.legend(&names);
        f.finish()
    }
}

impl LineChart {
    pub fn render(&self) -> String {
        let mut f = Frame::new(&self.title, &self.x_label, &self.y_label);
        let points = || self.series.iter().flat_map(|s| s.points.iter());
        let y_max = points().fold(0.0f64, |m, p| m.max(p.1));
        let x_max = points().fold(0.0f64, |m, p| m.max(p.0));
        let (top, step) = nice_axis(y_max);
        f.y_axis(top, step);
        let (x_top, x_step) = nice_axis(x_max);
        let x_of = |x: f64| f.plot_x + (x / x_top).clamp(0.0, 1.0) * f.plot_w;
        let mut ticks = String::new();
        let mut x = 0.0;
        while x <= x_top + x_step / 2.0 {
            let _ = writeln!(
                ticks,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
                x_of(x),
                f.plot_y + f.plot_h + 20.0,
                fmt_tick(x)
            );
            x += x_step;
        }
        let mut lines = String::new();
        for (i, series) in self.series.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            let path: Vec<String> = series
                .points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", x_of(x), f.y_of(y, top)))
                .collect();
            let _ = writeln!(
                lines,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
                path.join(" ")
            );
            for &(x, y) in &series.points {
                let _ = writeln!(
                    lines,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"><title>{}: {} at {}</title></circle>"#,
                    x_of(x),
                    f.y_of(y, top),
                    escape(&series.name),
                    fmt_si(y),
                    fmt_si(x)
                );
            }
        }
        f.out.push_str(&ticks);
        f.out.push_str(&lines);
        let names: Vec<&str> = self.series.iter().map(|s| s.name.as_str()).collect();
        f.legend(&names);
        f.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_drop_trailing_zeros() {
        assert_eq!(fmt_tick(50_000.0), "50 k");
        assert_eq!(fmt_tick(2_500_000.0), "2.5 M");
        assert_eq!(fmt_tick(0.25), "0.25");
        assert_eq!(fmt_tick(0.0), "0");
    }

    #[test]
    fn nice_axes_are_round() {
        assert_eq!(nice_axis(9.3), (10.0, 2.0));
        assert_eq!(nice_axis(1_234_567.0), (1_500_000.0, 500_000.0));
        assert_eq!(nice_axis(0.0), (1.0, 1.0));
    }

    #[test]
    fn bar_chart_has_bars_values_and_legend() {
        let chart = BarChart {
            title: "rows/s <by> case".into(),
            x_label: "clients".into(),
            y_label: "rows/s".into(),
            categories: vec!["1".into(), "16".into()],
            series: vec![
                BarSeries {
                    name: "sluice".into(),
                    values: vec![Some(1_500_000.0), Some(2_000_000.0)],
                },
                BarSeries {
                    name: "postgres".into(),
                    values: vec![Some(20_000.0), None],
                },
            ],
        };
        let svg = chart.render();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(
            svg.matches("<rect").count(),
            1 + 3 + 2,
            "background, 3 bars, 2 legend keys"
        );
        assert!(svg.contains(">1.50 M<") && svg.contains(">20.0 k<") && svg.contains(">n/a<"));
        assert!(svg.contains("rows/s &lt;by&gt; case"));
    }

    #[test]
    fn line_chart_draws_one_polyline_per_series() {
        let chart = LineChart {
            title: "t".into(),
            x_label: "s".into(),
            y_label: "rows/s".into(),
            series: vec![
                LineSeries {
                    name: "a".into(),
                    points: vec![(1.0, 10.0), (2.0, 12.0)],
                },
                LineSeries {
                    name: "b".into(),
                    points: vec![(1.0, 5.0)],
                },
            ],
        };
        let svg = chart.render();
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 3);
    }
}
