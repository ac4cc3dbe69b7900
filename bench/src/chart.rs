//! Line charts of the benchmarks' time series, drawn with `plotters`, as
//! SVG and as PNG, in-process.
//!
//! Why in-process: the PNG used to come from `rsvg-convert`, a system tool a
//! fresh machine does not have (the test that needed it failed there). Here
//! both formats come from the same drawing code; text is laid out and, in
//! the PNG, rasterized with `ab_glyph` and the DejaVu Sans font compiled into
//! the binary (`dejavu` crate), so neither a font nor fontconfig has to be
//! installed.
//!
//! Layout: one panel per chart stacked vertically, each with a title, axes
//! with ticks and labels, and a legend on its right. Time is on a log axis
//! where systems converge between tens of milliseconds and minutes
//! (`log_x`); the `auto` chart uses a linear axis that may start below
//! zero (time before the trigger). Pause lengths, from microseconds to
//! tens of milliseconds, go on a log y axis (`log_y`).

use std::ops::Range;
use std::sync::OnceLock;

use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Width of the picture (pixels; SVG user units).
pub const WIDTH: u32 = 960;
/// Height of one panel.
pub const PANEL_HEIGHT: u32 = 380;
/// Room on the right of each panel for the legend.
const LEGEND_WIDTH: u32 = 200;
/// The font family every text uses; registered with the embedded font.
const FAMILY: &str = "sans-serif";
/// plotters sizes fonts so that SVG text ends up at size / 1.24 px: these
/// give 16 px titles, 13 px axis and legend text, 12 px tick labels.
const TITLE_SIZE: f64 = 16.0 * 1.24;
const DESC_SIZE: f64 = 13.0 * 1.24;
const TICK_SIZE: f64 = 12.0 * 1.24;
const COLORS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x17, 0xbe, 0xcf),
];
const GRID: RGBColor = RGBColor(0xdd, 0xdd, 0xdd);

/// Errors of chart rendering.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ChartError {
    #[error("registering the embedded font: {0}")]
    Font(String),
    #[error("drawing the chart: {0}")]
    Draw(String),
    #[error("encoding the PNG: {0}")]
    Encode(String),
}

fn draw_err(e: impl std::fmt::Display) -> ChartError {
    ChartError::Draw(e.to_string())
}

/// One line: (x, y) points in data units; x > 0 on a log axis (other
/// points are left out there).
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
    /// Log-scale y axis (y > 0), for values spread over decades such as
    /// pause lengths; otherwise linear from 0.
    pub log_y: bool,
    pub lines: Vec<Line>,
}

/// Panels stacked vertically on one picture.
#[derive(Debug, Clone)]
pub struct Chart {
    pub panels: Vec<Panel>,
}

/// Registers the embedded DejaVu Sans under [`FAMILY`] once per process:
/// plotters' `ab_glyph` text support only knows fonts registered this way.
fn register_fonts() -> Result<(), ChartError> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let reg = |style, bytes| {
            plotters::style::register_font(FAMILY, style, bytes)
                .map_err(|_| format!("DejaVu Sans ({}) is not a valid font", style.as_str()))
        };
        reg(FontStyle::Normal, dejavu::sans::regular())?;
        reg(FontStyle::Bold, dejavu::sans::bold())
    })
    .clone()
    .map_err(ChartError::Font)
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
/// each change (so lines stay step-shaped) and the last point: a run
/// samples every 10 ms for minutes, the picture needs only the changes.
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

/// Tick label: integers without decimals, small values as they are.
fn fmt_tick(v: f64) -> String {
    if v < 0.0 {
        return format!("-{}", fmt_tick(-v));
    }
    // Key points computed as powers of ten carry float noise (0.1 as
    // 0.10000000000000002): 12 significant digits are plenty for a tick.
    let v: f64 = format!("{v:.12e}").parse().unwrap_or(v);
    if v >= 1000.0 {
        format!("{}", v.round() as u64)
    } else if v >= 1.0 {
        format!("{}", (v * 100.0).round() / 100.0)
    } else {
        format!("{v}")
    }
}

impl Panel {
    /// The points drawn for `line`: simplified, and x > 0 (y > 0) on a
    /// log axis.
    fn drawn(&self, line: &Line) -> Vec<(f64, f64)> {
        simplify(&line.points)
            .into_iter()
            .filter(|&(x, y)| {
                x.is_finite()
                    && y.is_finite()
                    && (!self.log_x || x > 0.0)
                    && (!self.log_y || y > 0.0)
            })
            .collect()
    }

    /// The x range: whole decades on a log axis, otherwise nice steps that
    /// include 0 (negative times stay visible).
    fn x_range(&self) -> Range<f64> {
        let xs: Vec<f64> = self
            .lines
            .iter()
            .flat_map(|l| self.drawn(l))
            .map(|p| p.0)
            .collect();
        let xmax = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let xmax = if xmax.is_finite() { xmax } else { 1.0 };
        if self.log_x {
            let xmax = xmax.max(0.01);
            let xmin = xs.iter().copied().fold(f64::INFINITY, f64::min);
            let lo = xmin.min(xmax).max(1e-3).log10().floor();
            let hi = xmax.log10().ceil().max(lo + 1.0);
            10f64.powf(lo)..10f64.powf(hi)
        } else {
            let xmin = xs.iter().copied().fold(f64::INFINITY, f64::min).min(0.0);
            let step = nice_step((xmax - xmin).max(1e-9), 8.0);
            let lo = (xmin / step).floor() * step;
            let hi = ((xmax / step).ceil() * step).max(lo + step);
            lo..hi
        }
    }

    /// 0 up to a nice step above the largest value; on a log axis, the
    /// whole decades around every value.
    fn y_range(&self) -> Range<f64> {
        let ys: Vec<f64> = self
            .lines
            .iter()
            .flat_map(|l| self.drawn(l))
            .map(|p| p.1)
            .collect();
        let ymax = ys.iter().copied().fold(0.0f64, f64::max);
        if self.log_y {
            let ymax = if ymax > 0.0 { ymax } else { 1.0 };
            let ymin = ys.iter().copied().fold(f64::INFINITY, f64::min).min(ymax);
            let lo = ymin.log10().floor();
            let hi = ymax.log10().ceil().max(lo + 1.0);
            return 10f64.powf(lo)..10f64.powf(hi);
        }
        let step = nice_step(ymax.max(1.0), 5.0);
        0.0..(ymax / step).ceil().max(1.0) * step
    }
}

/// Axes, grid and lines of one panel on any kinds of axes.
fn draw_plot<DB, X, Y>(
    mut chart: ChartContext<'_, DB, Cartesian2d<X, Y>>,
    p: &Panel,
    (x_ticks, y_ticks): (usize, usize),
) -> Result<(), ChartError>
where
    DB: DrawingBackend,
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let tick = |v: &f64| fmt_tick(*v);
    chart
        .configure_mesh()
        .x_desc(p.x_label.as_str())
        .y_desc(p.y_label.as_str())
        .x_labels(x_ticks)
        .y_labels(y_ticks)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .max_light_lines(0)
        .bold_line_style(GRID)
        .axis_style(BLACK)
        .label_style((FAMILY, TICK_SIZE))
        .axis_desc_style((FAMILY, DESC_SIZE))
        .draw()
        .map_err(draw_err)?;
    for (i, l) in p.lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(p.drawn(l), color.stroke_width(2)))
            .map_err(draw_err)?;
    }
    // The frame around the plot (the mesh draws only the two axes), in
    // pixels: a rectangle in data units would be clipped at the edges.
    let frame = chart.plotting_area().strip_coord_spec();
    let (w, h) = frame.dim_in_pixel();
    frame
        .draw(&Rectangle::new(
            [(0, 0), (w as i32 - 1, h as i32 - 1)],
            BLACK.stroke_width(1),
        ))
        .map_err(draw_err)?;
    Ok(())
}

/// Whole decades in a log axis's range.
fn decades(r: &Range<f64>) -> usize {
    (r.end / r.start).log10().round() as usize
}

/// A log axis's range widened by a hair: plotters finds the first decade
/// tick with ceil(ln(start) / ln(10)), which float rounding pushes past an
/// exact power of ten (0.01 gives -1.99..96, so no 0.01 tick).
fn widen(r: &Range<f64>) -> Range<f64> {
    r.start * (1.0 - 1e-9)..r.end * (1.0 + 1e-9)
}

/// One panel: title, plot, and the legend in the strip on the right.
fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
) -> Result<(), ChartError> {
    let (plot, legend) = area.split_horizontally(WIDTH - LEGEND_WIDTH);
    let mut builder = ChartBuilder::on(&plot);
    builder
        .caption(
            p.title.as_str(),
            (FAMILY, TITLE_SIZE).into_font().style(FontStyle::Bold),
        )
        .margin_top(8)
        .margin_left(10)
        .margin_right(10)
        .margin_bottom(8)
        .x_label_area_size(50)
        .y_label_area_size(80);
    let (x, y) = (p.x_range(), p.y_range());
    let (xt, yt) = (
        if p.log_x { decades(&x) + 1 } else { 10 },
        if p.log_y { decades(&y) + 1 } else { 6 },
    );
    match (p.log_x, p.log_y) {
        (false, false) => draw_plot(
            builder.build_cartesian_2d(x, y).map_err(draw_err)?,
            p,
            (xt, yt),
        )?,
        (true, false) => draw_plot(
            builder
                .build_cartesian_2d(widen(&x).log_scale(), y)
                .map_err(draw_err)?,
            p,
            (xt, yt),
        )?,
        (false, true) => draw_plot(
            builder
                .build_cartesian_2d(x, widen(&y).log_scale())
                .map_err(draw_err)?,
            p,
            (xt, yt),
        )?,
        (true, true) => draw_plot(
            builder
                .build_cartesian_2d(widen(&x).log_scale(), widen(&y).log_scale())
                .map_err(draw_err)?,
            p,
            (xt, yt),
        )?,
    }
    let font = (FAMILY, DESC_SIZE).into_font();
    for (i, l) in p.lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let y = 50 + 22 * i as i32;
        legend
            .draw(&PathElement::new(
                vec![(16, y), (40, y)],
                color.stroke_width(3),
            ))
            .map_err(draw_err)?;
        legend
            .draw(&Text::new(
                l.name.clone(),
                (46, y),
                TextStyle::from(font.clone()).pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(draw_err)?;
    }
    Ok(())
}

fn draw_all<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    chart: &Chart,
) -> Result<(), ChartError> {
    root.fill(&WHITE).map_err(draw_err)?;
    let n = chart.panels.len().max(1);
    for (area, p) in root.split_evenly((n, 1)).iter().zip(&chart.panels) {
        draw_panel(area, p)?;
    }
    root.present().map_err(draw_err)
}

impl Chart {
    pub fn new(panels: Vec<Panel>) -> Self {
        Self { panels }
    }

    /// Picture size in pixels: [`WIDTH`] x [`PANEL_HEIGHT`] per panel.
    pub fn size(&self) -> (u32, u32) {
        (WIDTH, PANEL_HEIGHT * self.panels.len().max(1) as u32)
    }

    /// The chart as an SVG document.
    pub fn svg(&self) -> Result<String, ChartError> {
        register_fonts()?;
        let mut out = String::new();
        draw_all(
            SVGBackend::with_string(&mut out, self.size()).into_drawing_area(),
            self,
        )?;
        Ok(out)
    }

    /// The chart as RGB pixels, row by row (3 bytes per pixel).
    pub fn rgb(&self) -> Result<Vec<u8>, ChartError> {
        register_fonts()?;
        let (w, h) = self.size();
        let mut buf = vec![0u8; w as usize * h as usize * 3];
        draw_all(
            BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area(),
            self,
        )?;
        Ok(buf)
    }

    /// The chart as a PNG file's bytes.
    pub fn png(&self) -> Result<Vec<u8>, ChartError> {
        let rgb = self.rgb()?;
        let (w, h) = self.size();
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let enc_err = |e: png::EncodingError| ChartError::Encode(e.to_string());
        let mut writer = enc.write_header().map_err(enc_err)?;
        writer.write_image_data(&rgb).map_err(enc_err)?;
        writer.finish().map_err(enc_err)?;
        Ok(out)
    }
}

/// `x.svg` -> `x.png`; any other name gets `.png` appended.
pub fn png_path(svg_path: &str) -> String {
    match svg_path.strip_suffix(".svg") {
        Some(stem) => format!("{stem}.png"),
        None => format!("{svg_path}.png"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The `<text>` contents of an SVG document, parsed as XML.
    pub(crate) fn svg_texts(svg: &str) -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).expect("the SVG is well-formed XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| n.text().unwrap_or("").trim().to_string())
            .collect()
    }

    /// The points of every data series' `<polyline>` (stroke width 2;
    /// axes and ticks have 1, legend marks 3), in SVG pixels.
    pub(crate) fn svg_polylines(svg: &str) -> Vec<Vec<(f64, f64)>> {
        let doc = roxmltree::Document::parse(svg).unwrap();
        doc.descendants()
            .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke-width") == Some("2"))
            .map(|n| {
                n.attribute("points")
                    .unwrap_or("")
                    .split_whitespace()
                    .map(|xy| {
                        let (x, y) = xy.split_once(',').unwrap();
                        (x.parse().unwrap(), y.parse().unwrap())
                    })
                    .collect()
            })
            .collect()
    }

    /// Decodes a PNG: (width, height, RGB(A) bytes, bytes per pixel).
    pub(crate) fn decode_png(bytes: &[u8]) -> (u32, u32, Vec<u8>, usize) {
        let dec = png::Decoder::new(bytes);
        let mut reader = dec.read_info().expect("a PNG header");
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).expect("PNG image data");
        buf.truncate(info.buffer_size());
        let bpp = info.color_type.samples();
        (info.width, info.height, buf, bpp)
    }

    fn two_lines() -> Panel {
        Panel {
            title: "t <1>".into(),
            x_label: "time (s)".into(),
            y_label: "pages_sharing".into(),
            log_x: true,
            log_y: false,
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
        }
    }

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
    fn tick_labels_are_clean() {
        assert_eq!(fmt_tick(0.1f64.powi(1) * 1.0000000000000002), "0.1");
        assert_eq!(fmt_tick(0.01), "0.01");
        assert_eq!(fmt_tick(80000.0), "80000");
        assert_eq!(fmt_tick(2.5), "2.5");
        assert_eq!(fmt_tick(-10.0), "-10");
    }

    #[test]
    fn svg_has_title_axes_ticks_legend_and_one_polyline_per_series() {
        let svg = Chart::new(vec![two_lines()]).svg().unwrap();
        let texts = svg_texts(&svg);
        let has = |t: &str| texts.iter().any(|x| x == t);
        // The XML parser unescaped the title's "<1>".
        assert!(has("t <1>"), "{texts:?}");
        assert!(has("ksm-default") && has("ksm-max"), "{texts:?}");
        assert!(has("time (s)") && has("pages_sharing"), "{texts:?}");
        // Decades 0.01 .. 100 on x, 0 .. 80000 on y.
        for t in ["0.01", "0.1", "1", "10", "100", "0", "80000"] {
            assert!(has(t), "tick {t} missing: {texts:?}");
        }
        let lines = svg_polylines(&svg);
        // Two series, simplified to 4 and 3 points.
        assert_eq!(
            lines.iter().map(|l| l.len()).collect::<Vec<_>>(),
            [4, 3],
            "{lines:?}"
        );
        // The ksm-max series rises: its last point is higher up (smaller y)
        // than its first, and it ends left of ksm-default's last point.
        let (a, b) = (&lines[0], &lines[1]);
        assert!(b.last().unwrap().1 < b[0].1, "{b:?}");
        assert!(b.last().unwrap().0 < a.last().unwrap().0);
        for &(x, y) in lines.iter().flatten() {
            assert!(
                (0.0..=WIDTH as f64).contains(&x) && (0.0..=PANEL_HEIGHT as f64).contains(&y),
                "({x}, {y}) outside the picture"
            );
        }
    }

    #[test]
    fn linear_axis_spans_negative_time() {
        let p = Panel {
            title: "auto".into(),
            x_label: "s".into(),
            y_label: "MiB".into(),
            log_x: false,
            log_y: false,
            lines: vec![Line {
                name: "a".into(),
                points: vec![(-10.0, 0.0), (0.0, 0.0), (30.0, 256.0)],
            }],
        };
        let svg = Chart::new(vec![p]).svg().unwrap();
        let texts = svg_texts(&svg);
        assert!(
            texts.iter().any(|t| t == "-10") && texts.iter().any(|t| t == "30"),
            "{texts:?}"
        );
        let lines = svg_polylines(&svg);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let series = &lines[0];
        // x = -10 is the left end of the axis, 30 the right end: the first
        // point is left of x = 0's, which is left of the last.
        assert!(series[0].0 < series[1].0 && series[1].0 < series[2].0);
        assert!(series[2].1 < series[1].1, "256 MiB is above 0: {series:?}");
    }

    #[test]
    fn log_y_axis_spans_whole_decades_and_drops_non_positive_values() {
        let p = Panel {
            title: "pauses".into(),
            x_label: "1/(1-q)".into(),
            y_label: "us".into(),
            log_x: true,
            log_y: true,
            lines: vec![Line {
                name: "a".into(),
                points: vec![
                    (2.0, 3.0),
                    (100.0, 0.0),
                    (1000.0, 450.0),
                    (10000.0, 20000.0),
                ],
            }],
        };
        // 3 µs .. 20 ms: the decades 1 .. 100000.
        assert_eq!(p.y_range(), 1.0..100_000.0);
        let svg = Chart::new(vec![p]).svg().unwrap();
        let texts = svg_texts(&svg);
        for t in ["1", "10", "100", "1000", "10000", "100000"] {
            assert!(texts.iter().any(|x| x == t), "no {t} tick: {texts:?}");
        }
        let lines = svg_polylines(&svg);
        assert_eq!(lines.len(), 1, "{lines:?}");
        // The 0 µs point is left out; each later point is higher up.
        let series = &lines[0];
        assert_eq!(series.len(), 3, "{series:?}");
        assert!(series.windows(2).all(|w| w[1].1 < w[0].1), "{series:?}");
        // Equal decades take equal heights: 3 -> 450 (2.18 decades) and
        // 450 -> 20000 (1.65 decades).
        let (d1, d2) = (series[0].1 - series[1].1, series[1].1 - series[2].1);
        let want = (450f64 / 3.0).log10() / (20000f64 / 450.0).log10();
        assert!((d1 / d2 - want).abs() < 0.05, "{d1} {d2} {want}");
    }

    #[test]
    fn empty_panel_still_renders() {
        let p = Panel {
            title: "none".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            log_x: true,
            log_y: false,
            lines: vec![],
        };
        let c = Chart::new(vec![p]);
        let svg = c.svg().unwrap();
        assert!(svg_texts(&svg).iter().any(|t| t == "none"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        let (w, h, _, _) = decode_png(&c.png().unwrap());
        assert_eq!((w, h), (WIDTH, PANEL_HEIGHT));
    }

    #[test]
    fn png_decodes_with_the_charts_size_and_drawn_pixels() {
        let c = Chart::new(vec![two_lines(), two_lines()]);
        let bytes = c.png().unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let (w, h, px, bpp) = decode_png(&bytes);
        assert_eq!((w, h), (WIDTH, 2 * PANEL_HEIGHT));
        assert_eq!(bpp, 3);
        let at = |x: u32, y: u32| {
            let i = (y as usize * w as usize + x as usize) * bpp;
            [px[i], px[i + 1], px[i + 2]]
        };
        // White background; the first series' blue and the second's red
        // are both somewhere in the picture (lines and legend).
        assert_eq!(at(0, 0), [255, 255, 255]);
        let pixels: Vec<[u8; 3]> = px.chunks(3).map(|c| [c[0], c[1], c[2]]).collect();
        for color in [COLORS[0], COLORS[1]] {
            let want = [color.0, color.1, color.2];
            assert!(
                pixels.iter().filter(|&&p| p == want).count() > 100,
                "{want:?} hardly drawn"
            );
        }
        // Text is rasterized: dark, anti-aliased pixels in the title row of
        // the first panel (the font is the embedded one: no system fonts).
        let title_dark = (0..WIDTH - LEGEND_WIDTH)
            .flat_map(|x| (0..30).map(move |y| (x, y)))
            .filter(|&(x, y)| at(x, y).iter().all(|&v| v < 100))
            .count();
        assert!(title_dark > 50, "title not drawn: {title_dark} dark pixels");
    }

    #[test]
    fn png_names() {
        assert_eq!(png_path("docs/results/auto.svg"), "docs/results/auto.png");
        assert_eq!(png_path("plot"), "plot.png");
    }
}
