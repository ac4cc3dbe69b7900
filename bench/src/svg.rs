//! A small self-contained SVG line-chart writer (no plotting dependency):
//! axes with ticks, labels, a legend, one panel per chart stacked
//! vertically. Time is on a log axis because the systems converge between
//! tens of milliseconds and minutes (`log_x`); the `auto` chart uses a
//! linear axis that may start below zero (time before the trigger).

use std::fmt::Write as _;

use crate::seed::SeedReport;

const W: f64 = 960.0;
const PANEL_H: f64 = 380.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One line: (x, y) points in data units, x > 0 for the log axis.
#[derive(Debug, Clone)]
pub struct Line {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One panel.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Log-scale x axis (x > 0); otherwise linear.
    pub log_x: bool,
    pub lines: Vec<Line>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" tick step (1, 2 or 5 x 10^k) giving about `n` ticks up to `max`.
pub fn nice_step(max: f64, n: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let raw = max / n;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

/// Drops samples that repeat the previous value, keeping the point before
/// each change (so lines stay step-shaped) and the last point.
pub fn simplify(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (i, &p) in points.iter().enumerate() {
        let prev = i.checked_sub(1).map(|j| points[j]);
        let next = points.get(i + 1);
        let changes = prev.is_none_or(|q| q.1 != p.1) || next.is_none_or(|q| q.1 != p.1);
        if changes {
            out.push(p);
        }
    }
    out
}

fn fmt_tick(v: f64) -> String {
    if v < 0.0 {
        return format!("-{}", fmt_tick(-v));
    }
    if v >= 1000.0 {
        format!("{}", v as u64)
    } else if v >= 1.0 {
        format!("{}", (v * 100.0).round() / 100.0)
    } else {
        format!("{v}")
    }
}

/// Maps data x to pixels and lists the x ticks (value, label).
struct XAxis {
    log: bool,
    lo: f64,
    hi: f64,
}

impl XAxis {
    fn new(p: &Panel) -> XAxis {
        let xs = || p.lines.iter().flat_map(|l| l.points.iter().map(|q| q.0));
        let xmax = xs().fold(f64::NEG_INFINITY, f64::max);
        let xmax = if xmax.is_finite() { xmax } else { 1.0 };
        if p.log_x {
            let xmax = xmax.max(0.01);
            let xmin = xs().filter(|&x| x > 0.0).fold(f64::INFINITY, f64::min);
            let lo = xmin.min(xmax).max(1e-3).log10().floor();
            let hi = xmax.log10().ceil().max(lo + 1.0);
            XAxis { log: true, lo, hi }
        } else {
            let xmin = xs().fold(f64::INFINITY, f64::min).min(0.0);
            let step = nice_step((xmax - xmin).max(1e-9), 8.0);
            let lo = (xmin / step).floor() * step;
            let hi = ((xmax / step).ceil() * step).max(lo + step);
            XAxis { log: false, lo, hi }
        }
    }

    /// 0..1 across the plot.
    fn frac(&self, x: f64) -> f64 {
        if self.log {
            (x.max(10f64.powf(self.lo)).log10() - self.lo) / (self.hi - self.lo)
        } else {
            (x - self.lo) / (self.hi - self.lo)
        }
    }

    fn ticks(&self) -> Vec<f64> {
        let mut out = Vec::new();
        if self.log {
            let mut k = self.lo;
            while k <= self.hi + 1e-9 {
                out.push(10f64.powf(k));
                k += 1.0;
            }
        } else {
            let step = nice_step(self.hi - self.lo, 8.0);
            let mut x = self.lo;
            while x <= self.hi + step / 2.0 {
                out.push((x / step).round() * step);
                x += step;
            }
        }
        out
    }
}

fn panel(out: &mut String, p: &Panel, y0: f64) {
    let pw = W - LEFT - RIGHT;
    let ph = PANEL_H - TOP - BOTTOM;
    let all = || p.lines.iter().flat_map(|l| l.points.iter());
    let xa = XAxis::new(p);
    let ymax_data = all().map(|q| q.1).fold(0.0f64, f64::max);
    let ystep = nice_step(ymax_data.max(1.0), 5.0);
    let ymax = (ymax_data / ystep).ceil().max(1.0) * ystep;
    let sx = |x: f64| LEFT + xa.frac(x) * pw;
    let sy = |y: f64| y0 + TOP + ph - y / ymax * ph;
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="16" font-weight="bold" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        y0 + TOP - 18.0,
        esc(&p.title)
    );
    // Grid and ticks.
    for t in xa.ticks() {
        let x = sx(t);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" font-size="12" text-anchor="middle">{}</text>"##,
            y0 + TOP,
            y0 + TOP + ph,
            y0 + TOP + ph + 18.0,
            fmt_tick(t)
        );
    }
    let mut y = 0.0;
    while y <= ymax + ystep / 2.0 {
        let py = sy(y);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            py + 4.0,
            fmt_tick(y)
        );
        y += ystep;
    }
    let _ = writeln!(
        out,
        r#"<rect x="{LEFT}" y="{:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="black"/>"#,
        y0 + TOP
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        y0 + TOP + ph + 40.0,
        esc(&p.x_label)
    );
    let (lx, ly) = (22.0, y0 + TOP + ph / 2.0);
    let _ = writeln!(
        out,
        r#"<text x="{lx}" y="{ly:.1}" font-size="13" text-anchor="middle" transform="rotate(-90 {lx} {ly:.1})">{}</text>"#,
        esc(&p.y_label)
    );
    for (i, l) in p.lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = simplify(&l.points)
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = y0 + TOP + 10.0 + i as f64 * 22.0;
        let lx = LEFT + pw + 16.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/><text x="{:.1}" y="{:.1}" font-size="13">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            esc(&l.name)
        );
    }
}

/// Renders the panels, stacked, as one SVG document.
pub fn render(panels: &[Panel]) -> String {
    let h = PANEL_H * panels.len().max(1) as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, p) in panels.iter().enumerate() {
        panel(&mut out, p, i as f64 * PANEL_H);
    }
    out.push_str("</svg>\n");
    out
}

/// `pages_sharing` over time, one panel per shape, one line per system.
pub fn seed_chart(report: &SeedReport) -> String {
    let mut shapes: Vec<_> = report.series.iter().map(|s| s.shape).collect();
    shapes.dedup();
    shapes.sort_by_key(|c| c.to_string());
    shapes.dedup();
    let panels: Vec<Panel> = shapes
        .iter()
        .map(|&shape| Panel {
            title: format!("ksm-seed, {shape}: pages_sharing + zero_pages over time"),
            x_label: "time since merging was switched on (s, log scale)".into(),
            y_label: "pages_sharing + zero_pages".into(),
            log_x: true,
            lines: report
                .series
                .iter()
                .filter(|s| s.shape == shape)
                .map(|s| Line {
                    name: s.system.clone(),
                    points: s
                        .samples
                        .iter()
                        .map(|p| (p.t_s, (p.pages_sharing + p.zero_pages) as f64))
                        .collect(),
                })
                .collect(),
        })
        .collect();
    render(&panels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(76500.0, 5.0), 20000.0);
        assert_eq!(nice_step(42.0, 5.0), 10.0);
        assert_eq!(nice_step(1.0, 5.0), 0.2);
    }

    #[test]
    fn simplify_keeps_steps_and_ends() {
        let pts = [
            (1.0, 0.0),
            (2.0, 0.0),
            (3.0, 0.0),
            (4.0, 5.0),
            (5.0, 5.0),
            (6.0, 5.0),
        ];
        assert_eq!(
            simplify(&pts),
            [(1.0, 0.0), (3.0, 0.0), (4.0, 5.0), (6.0, 5.0)]
        );
    }

    #[test]
    fn renders_axes_labels_and_legend() {
        let p = Panel {
            title: "t <1>".into(),
            x_label: "time (s)".into(),
            y_label: "pages_sharing".into(),
            log_x: true,
            lines: vec![
                Line {
                    name: "ksm-default".into(),
                    points: vec![(0.01, 0.0), (20.0, 0.0), (37.0, 76500.0), (90.0, 76500.0)],
                },
                Line {
                    name: "ksm-max".into(),
                    points: vec![(0.01, 0.0), (0.5, 76500.0), (0.7, 76500.0)],
                },
            ],
        };
        let svg = render(&[p]);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("t &lt;1&gt;"));
        assert!(svg.contains(">ksm-default</text>") && svg.contains(">ksm-max</text>"));
        assert!(svg.contains(">time (s)</text>") && svg.contains(">pages_sharing</text>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        // Decades 0.01 .. 100 on x, 0 .. 80000 on y.
        assert!(svg.contains(">0.01</text>") && svg.contains(">100</text>"));
        assert!(svg.contains(">80000</text>"));
    }

    #[test]
    fn linear_axis_spans_negative_time() {
        let p = Panel {
            title: "auto".into(),
            x_label: "s".into(),
            y_label: "MiB".into(),
            log_x: false,
            lines: vec![Line {
                name: "a".into(),
                points: vec![(-10.0, 0.0), (0.0, 0.0), (30.0, 256.0)],
            }],
        };
        let svg = render(&[p]);
        assert!(
            svg.contains(">-10</text>") && svg.contains(">30</text>"),
            "{svg}"
        );
        // Every coordinate is a finite number inside the picture.
        let pts = svg
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        for xy in pts.split(' ') {
            let (x, y) = xy.split_once(',').unwrap();
            let (x, y): (f64, f64) = (x.parse().unwrap(), y.parse().unwrap());
            assert!(
                (0.0..=W).contains(&x) && (0.0..=PANEL_H).contains(&y),
                "{xy}"
            );
        }
        // First point at the left edge, last at the right edge of the plot.
        assert!(pts.starts_with(&format!("{LEFT:.1},")), "{pts}");
    }

    #[test]
    fn empty_panel_still_renders() {
        let p = Panel {
            title: "none".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            log_x: false,
            lines: vec![],
        };
        let svg = render(&[p]);
        assert!(svg.trim_end().ends_with("</svg>") && !svg.contains("NaN") && !svg.contains("inf"));
    }
}
