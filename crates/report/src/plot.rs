//! PNG plots: line charts (linear or logarithmic axes), latency CDFs and bar charts, drawn with
//! plotters' bitmap backend. Text uses DejaVu Sans embedded in the binary (the `dejavu` crate),
//! registered with plotters' `ab_glyph` font table, so no system font or fontconfig is needed.

use std::path::Path;
use std::sync::Once;

use anyhow::{Context, Result, anyhow, bail};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, Ranged, ValueFormatter};
use plotters::prelude::*;

/// Pixels of one panel; a figure is a grid of them.
const PANEL_PX: (u32, u32) = (660, 430);
const FONT: &str = "sans-serif";

/// Distinct colours (Okabe–Ito, readable by colour-blind readers), by series index.
const COLORS: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(240, 228, 66),
];

/// The colour of series `index` (the same index gets the same colour in every panel).
pub(crate) fn color(index: usize) -> RGBColor {
    COLORS[index % COLORS.len()]
}

/// One line of a chart.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub(crate) name: String,
    /// Index into the palette (keep it the same for one server or target across panels).
    pub(crate) color_index: usize,
    pub(crate) points: Vec<(f64, f64)>,
    /// Dashed-looking thin line without markers (a goal or reference level).
    pub(crate) reference: bool,
}

impl Series {
    pub(crate) fn new(name: impl Into<String>, color_index: usize, points: Vec<(f64, f64)>) -> Series {
        Series { name: name.into(), color_index, points, reference: false }
    }
}

/// A chart of lines; points are joined in the order given and marked.
#[derive(Debug, Clone, Default)]
pub(crate) struct LineChart {
    pub(crate) title: String,
    pub(crate) x_label: String,
    pub(crate) y_label: String,
    pub(crate) x_log: bool,
    /// x values are powers of two (queue depths): a log2 axis labelled 1, 2, 4, ...
    pub(crate) x_pow2: bool,
    /// y values are percentiles: an axis of "nines" (0, 90, 99, 99.9, 99.99 equally spaced), so
    /// that the tail of a CDF is as readable as its middle.
    pub(crate) y_nines: bool,
    /// The legend in the lower right corner (else the upper left).
    pub(crate) legend_lower_right: bool,
    pub(crate) y_log: bool,
    /// Start a linear y axis at zero (else at the smallest value, with a margin).
    pub(crate) y_from_zero: bool,
    /// Fixed y range (a CDF's 0..100), else taken from the data.
    pub(crate) y_range: Option<(f64, f64)>,
    pub(crate) series: Vec<Series>,
}

/// Bars, one per category, with their value written above them.
#[derive(Debug, Clone, Default)]
pub(crate) struct BarChart {
    pub(crate) title: String,
    pub(crate) y_label: String,
    /// (label, value, colour index)
    pub(crate) bars: Vec<(String, f64, usize)>,
    /// Text above each bar (defaults to the value).
    pub(crate) annotations: Vec<String>,
}

/// Groups of bars side by side: one group per category, one bar per series in each group, and
/// a legend naming the series.
#[derive(Debug, Clone, Default)]
pub(crate) struct GroupedBarChart {
    pub(crate) title: String,
    pub(crate) y_label: String,
    /// The label under each group.
    pub(crate) categories: Vec<String>,
    pub(crate) series: Vec<BarSeries>,
}

/// One series of a [`GroupedBarChart`]: a value per category (`None`: no bar).
#[derive(Debug, Clone, Default)]
pub(crate) struct BarSeries {
    pub(crate) name: String,
    pub(crate) color_index: usize,
    pub(crate) values: Vec<Option<f64>>,
    /// Text above each bar (empty or absent: none).
    pub(crate) annotations: Vec<String>,
}

/// One panel of a figure.
#[derive(Debug, Clone)]
pub(crate) enum Panel {
    Lines(LineChart),
    Bars(BarChart),
    Groups(GroupedBarChart),
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for (style, bytes) in [
            (FontStyle::Normal, dejavu::sans::regular()),
            (FontStyle::Bold, dejavu::sans::bold()),
            (FontStyle::Italic, dejavu::sans::oblique()),
            (FontStyle::Oblique, dejavu::sans::oblique()),
        ] {
            // The bytes are a valid TrueType font shipped by the crate: failing is a bug.
            assert!(plotters::style::register_font(FONT, style, bytes).is_ok(), "DejaVu Sans must parse");
        }
    });
}

/// Draws `panels` in a grid of `cols` columns into the PNG file `path`.
///
/// # Errors
/// A panel without data, or the file cannot be written.
pub(crate) fn render(path: &Path, panels: &[Panel], cols: usize) -> Result<()> {
    if panels.is_empty() {
        bail!("no panels for {}", path.display());
    }
    register_font();
    let cols = cols.clamp(1, panels.len());
    let rows = panels.len().div_ceil(cols);
    let px = |n: usize, each: u32| each.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
    let size = (px(cols, PANEL_PX.0), px(rows, PANEL_PX.1));
    let mut rgb = vec![0u8; size.0 as usize * size.1 as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        let areas = root.split_evenly((rows, cols));
        for (panel, area) in panels.iter().zip(&areas) {
            match panel {
                Panel::Lines(c) => draw_lines(area, c),
                Panel::Bars(b) => draw_bars(area, b),
                Panel::Groups(g) => draw_groups(area, g),
            }
            .with_context(|| format!("drawing {}", path.display()))?;
        }
        root.present().map_err(|e| anyhow!("{e}"))?;
    }
    write_png(path, size, &rgb).with_context(|| format!("writing {}", path.display()))
}

/// Encodes 8-bit RGB pixels as an indexed-colour PNG file at the best compression (a third of the
/// size of plain RGB: a plot has few colours).
fn write_png(path: &Path, (width, height): (u32, u32), rgb: &[u8]) -> Result<()> {
    let (palette, indices) = quantize(rgb);
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut enc = png::Encoder::new(file, width, height);
    enc.set_color(png::ColorType::Indexed);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_palette(palette);
    enc.set_compression(png::Compression::Best);
    enc.set_adaptive_filter(png::AdaptiveFilterType::NonAdaptive);
    enc.set_filter(png::FilterType::NoFilter);
    let mut writer = enc.write_header()?;
    writer.write_image_data(&indices)?;
    writer.finish()?;
    Ok(())
}

/// A palette of at most 256 colours (flattened RGB) and each pixel's index into it: the most
/// frequent colours exactly, the rare rest (anti-aliased edge pixels) mapped to the nearest one.
fn quantize(rgb: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut counts: std::collections::HashMap<[u8; 3], u64> = std::collections::HashMap::new();
    for px in rgb.chunks_exact(3) {
        *counts.entry([px[0], px[1], px[2]]).or_insert(0) += 1;
    }
    let mut by_count: Vec<([u8; 3], u64)> = counts.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let palette: Vec<[u8; 3]> = by_count.iter().take(256).map(|c| c.0).collect();
    let dist = |a: [u8; 3], b: [u8; 3]| -> i32 {
        a.iter().zip(&b).map(|(&x, &y)| (i32::from(x) - i32::from(y)).pow(2)).sum()
    };
    let index: std::collections::HashMap<[u8; 3], u8> = by_count
        .iter()
        .map(|&(c, _)| {
            let best = (0..palette.len()).min_by_key(|&i| dist(c, palette[i])).unwrap_or(0);
            (c, u8::try_from(best).expect("at most 256 palette entries"))
        })
        .collect();
    let indices = rgb.chunks_exact(3).map(|px| index[&[px[0], px[1], px[2]]]).collect();
    (palette.concat(), indices)
}

/// The range of the data on one axis, widened so that points do not sit on the frame.
fn span(values: impl Iterator<Item = f64>, log: bool, from_zero: bool) -> Result<(f64, f64)> {
    let v: Vec<f64> = values.filter(|v| v.is_finite() && (!log || *v > 0.0)).collect();
    if v.is_empty() {
        bail!("no finite{} values to plot", if log { " positive" } else { "" });
    }
    let (lo, hi) = v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    if log {
        Ok((lo / 1.5, hi * 1.5))
    } else {
        let pad = if hi > lo { (hi - lo) * 0.08 } else { hi.abs().max(1.0) * 0.1 };
        let lo = if from_zero && lo >= 0.0 { 0.0 } else { lo - pad };
        Ok((lo, hi + pad))
    }
}

fn draw_lines(area: &DrawingArea<BitMapBackend<'_>, Shift>, c: &LineChart) -> Result<()> {
    if c.x_pow2 {
        return draw_pow2(area, c);
    }
    let nines;
    let c = if c.y_nines {
        nines = to_nines(c);
        &nines
    } else {
        c
    };
    let points = || c.series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = span(points().map(|p| p.0), c.x_log, false)?;
    let (y0, y1) = y_span(c)?;
    let fmt = |v: &f64| tick(*v);
    let y_fmt = |v: &f64| tick(*v);
    let y_fmt: &dyn Fn(&f64) -> String = if c.y_nines { &nines_label } else { &y_fmt };
    match (c.x_log, c.y_log) {
        (false, false) => lines_on(area, c, x0..x1, y0..y1, &fmt, y_fmt),
        (true, false) => lines_on(area, c, (x0..x1).log_scale(), y0..y1, &fmt, y_fmt),
        (false, true) => lines_on(area, c, x0..x1, (y0..y1).log_scale(), &fmt, y_fmt),
        (true, true) => lines_on(area, c, (x0..x1).log_scale(), (y0..y1).log_scale(), &fmt, y_fmt),
    }
}

/// Percent -> nines: -log10(1 - p/100) (90 % -> 1, 99 % -> 2); 100 % is taken as 99.999 %.
pub(crate) fn nines(pct: f64) -> f64 {
    -(1.0 - pct.clamp(0.0, 99.999) / 100.0).log10()
}

/// The label of a tick on a nines axis: only whole nines are labelled.
fn nines_label(v: &f64) -> String {
    let r = v.round();
    if (v - r).abs() > 1e-6 || r < 0.0 {
        return String::new();
    }
    let pct = 100.0 * (1.0 - 10f64.powf(-r));
    // Whole nines: 0, 90, 99, 99.9, 99.99, ...; the decimals follow from the value.
    let text = format!("{pct:.6}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The chart with its y values (percent) on the nines scale, and a y range of whole nines.
fn to_nines(c: &LineChart) -> LineChart {
    let mut t = c.clone();
    for s in &mut t.series {
        for p in &mut s.points {
            p.1 = nines(p.1);
        }
    }
    let top = t.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(2.0, f64::max);
    t.y_range = Some((0.0, top.ceil() + 0.25));
    t.y_log = false;
    t
}

fn y_span(c: &LineChart) -> Result<(f64, f64)> {
    match c.y_range {
        Some(r) => Ok(r),
        None => span(c.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)), c.y_log, c.y_from_zero),
    }
}

/// x = log2 of the values on a linear axis, labelled with the powers of two.
fn draw_pow2(area: &DrawingArea<BitMapBackend<'_>, Shift>, c: &LineChart) -> Result<()> {
    let mut t = c.clone();
    t.x_pow2 = false;
    t.x_log = false;
    for s in &mut t.series {
        s.points.retain(|p| p.0 > 0.0);
        for p in &mut s.points {
            p.0 = p.0.log2();
        }
    }
    let xs = || t.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (lo, hi) = (xs().fold(f64::INFINITY, f64::min), xs().fold(f64::NEG_INFINITY, f64::max));
    if !(lo.is_finite() && hi.is_finite()) {
        bail!("no positive x values to plot");
    }
    let (x0, x1) = (lo - 0.3, hi + 0.3);
    let (y0, y1) = y_span(&t)?;
    let fmt = |v: &f64| {
        let r = v.round();
        if (v - r).abs() < 1e-6 && r >= 0.0 { tick(2f64.powf(r)) } else { String::new() }
    };
    let y_fmt = |v: &f64| tick(*v);
    if t.y_log {
        lines_on(area, &t, x0..x1, (y0..y1).log_scale(), &fmt, &y_fmt)
    } else {
        lines_on(area, &t, x0..x1, y0..y1, &fmt, &y_fmt)
    }
}

/// A number for an axis label: no trailing zeros, thousands as `k`.
pub(crate) fn tick(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = if v.abs() >= 100.0 { format!("{v:.0}") } else { format!("{v:.2}") };
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_owned() } else { s }
}

fn lines_on<X, Y>(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    c: &LineChart,
    x: X,
    y: Y,
    x_fmt: &dyn Fn(&f64) -> String,
    y_fmt: &dyn Fn(&f64) -> String,
) -> Result<()>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("{e}");
    let mut chart = ChartBuilder::on(area)
        .caption(&c.title, (FONT, 20))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(&c.x_label)
        .y_desc(&c.y_label)
        .x_labels(8)
        .y_labels(if c.y_nines { 30 } else { 10 })
        .x_label_formatter(x_fmt)
        .y_label_formatter(y_fmt)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(err)?;
    for s in &c.series {
        // A reference level is grey, whatever its index, so that it never looks like a series.
        let col = if s.reference { RGBColor(130, 130, 130) } else { color(s.color_index) };
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|&(a, b)| {
                a.is_finite() && b.is_finite() && (!c.x_log || a > 0.0) && (!c.y_log || b > 0.0)
            })
            .collect();
        let style = if s.reference { col.stroke_width(1) } else { col.stroke_width(2) };
        let marker = if s.reference || pts.len() > 40 { 0 } else { 4 };
        chart
            .draw_series(LineSeries::new(pts, style).point_size(marker))
            .map_err(err)?
            .label(&s.name)
            .legend(move |(px, py)| PathElement::new(vec![(px, py), (px + 18, py)], col.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(if c.legend_lower_right {
            SeriesLabelPosition::LowerRight
        } else {
            SeriesLabelPosition::UpperLeft
        })
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Axes for bars: one category per integer x from 0, labelled with `labels`, y from 0 to `top`.
fn category_chart<'a, 'b>(
    area: &'a DrawingArea<BitMapBackend<'b>, Shift>,
    title: &str,
    y_label: &str,
    labels: &[String],
    top: f64,
) -> Result<
    ChartContext<
        'a,
        BitMapBackend<'b>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
> {
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("{e}");
    let n = labels.len();
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(72)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|v| {
            // Only the ticks at a category's position (an integer) get its label.
            labels
                .iter()
                .enumerate()
                .find(|&(i, _)| (i as f64 - v).abs() < 0.01)
                .map(|(_, l)| l.clone())
                .unwrap_or_default()
        })
        .y_label_formatter(&|v| tick(*v))
        .y_desc(y_label)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(err)?;
    Ok(chart)
}

fn draw_bars(area: &DrawingArea<BitMapBackend<'_>, Shift>, b: &BarChart) -> Result<()> {
    if b.bars.is_empty() {
        bail!("bar chart {:?} has no bars", b.title);
    }
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("{e}");
    let top = b.bars.iter().map(|x| x.1).filter(|v| v.is_finite()).fold(0.0, f64::max).max(1e-9) * 1.18;
    let labels: Vec<String> = b.bars.iter().map(|x| x.0.clone()).collect();
    let mut chart = category_chart(area, &b.title, &b.y_label, &labels, top)?;
    chart
        .draw_series(b.bars.iter().enumerate().map(|(i, (_, v, ci))| {
            let x = i as f64;
            Rectangle::new([(x - 0.35, 0.0), (x + 0.35, v.max(0.0))], color(*ci).filled())
        }))
        .map_err(err)?;
    chart
        .draw_series(b.bars.iter().enumerate().map(|(i, (_, v, _))| {
            let text = b.annotations.get(i).cloned().unwrap_or_else(|| tick(*v));
            let style = TextStyle::from((FONT, 14).into_font()).pos(plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Center,
                plotters::style::text_anchor::VPos::Bottom,
            ));
            Text::new(text, (i as f64, v.max(0.0) + top * 0.01), style)
        }))
        .map_err(err)?;
    Ok(())
}

fn draw_groups(area: &DrawingArea<BitMapBackend<'_>, Shift>, g: &GroupedBarChart) -> Result<()> {
    let values =
        || g.series.iter().flat_map(|s| s.values.iter().flatten().copied()).filter(|v| v.is_finite());
    if g.categories.is_empty() || g.series.is_empty() || values().next().is_none() {
        bail!("grouped bar chart {:?} has no bars", g.title);
    }
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("{e}");
    let k = g.series.len();
    // Headroom for the annotations and the legend above the tallest bar.
    let top = values().fold(0.0, f64::max).max(1e-9) * (1.2 + 0.08 * k as f64);
    let width = 0.8 / k as f64;
    let mut chart = category_chart(area, &g.title, &g.y_label, &g.categories, top)?;
    for (j, s) in g.series.iter().enumerate() {
        let col = color(s.color_index);
        let x_of = |i: usize| i as f64 - 0.4 + width * (j as f64 + 0.5);
        let bars: Vec<(usize, f64)> = s
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.filter(|v| v.is_finite()).map(|v| (i, v.max(0.0))))
            .collect();
        chart
            .draw_series(bars.iter().map(|&(i, v)| {
                let x = x_of(i);
                Rectangle::new([(x - width * 0.45, 0.0), (x + width * 0.45, v)], col.filled())
            }))
            .map_err(err)?
            .label(&s.name)
            .legend(move |(px, py)| Rectangle::new([(px, py - 5), (px + 14, py + 5)], col.filled()));
        let style = TextStyle::from((FONT, 12).into_font()).pos(plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Center,
            plotters::style::text_anchor::VPos::Bottom,
        ));
        chart
            .draw_series(bars.iter().filter_map(|&(i, v)| {
                let text = s.annotations.get(i).filter(|t| !t.is_empty())?;
                Some(Text::new(text.clone(), (x_of(i), v + top * 0.01), style.clone()))
            }))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// A CDF line from (percentile, latency) pairs: x = latency, y = percentile.
pub(crate) fn cdf_series(name: &str, color_index: usize, pct_value: &[(f64, f64)]) -> Series {
    let mut pts: Vec<(f64, f64)> = pct_value.iter().map(|&(p, v)| (v, p)).collect();
    pts.sort_by(|a, b| a.1.total_cmp(&b.1));
    Series::new(name, color_index, pts)
}

/// A latency CDF chart (x logarithmic, microseconds; y percent on a nines scale).
pub(crate) fn cdf_chart(title: impl Into<String>, series: Vec<Series>) -> LineChart {
    LineChart {
        title: title.into(),
        x_label: "completion latency (us, log scale)".into(),
        y_label: "requests at or below (%, nines scale)".into(),
        x_log: true,
        y_nines: true,
        legend_lower_right: true,
        series,
        ..LineChart::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(64.0), "64");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(120_000.0), "120k");
        assert_eq!(tick(1_500_000.0), "1.5M");
        assert_eq!(tick(250.0), "250");
    }

    #[test]
    fn nines_axis() {
        assert!((nines(90.0) - 1.0).abs() < 1e-9 && (nines(99.9) - 3.0).abs() < 1e-9);
        assert_eq!(nines_label(&0.0), "0");
        assert_eq!(nines_label(&2.0), "99");
        assert_eq!(nines_label(&4.0), "99.99");
        assert_eq!(nines_label(&1.5), "");
    }

    #[test]
    fn renders_lines_and_bars_to_png() {
        let dir = crate::testutil::TempDir::new("plot");
        let path = dir.path().join("t.png");
        let lines = LineChart {
            title: "t".into(),
            x_label: "queue depth".into(),
            y_label: "kIOPS".into(),
            x_log: true,
            series: vec![Series::new("a", 0, vec![(1.0, 10.0), (16.0, 100.0), (64.0, 120.0)])],
            ..LineChart::default()
        };
        let bars = BarChart {
            title: "b".into(),
            y_label: "ops/s".into(),
            bars: vec![("x".into(), 3.0, 0), ("y".into(), 5.0, 1)],
            annotations: vec![],
        };
        let groups = GroupedBarChart {
            title: "g".into(),
            y_label: "GB/s".into(),
            categories: vec!["4+2".into(), "8+3".into()],
            series: vec![
                BarSeries {
                    name: "a".into(),
                    color_index: 0,
                    values: vec![Some(3.0), None],
                    annotations: vec!["1.1x".into()],
                },
                BarSeries {
                    name: "b".into(),
                    color_index: 1,
                    values: vec![Some(2.0), Some(4.0)],
                    annotations: vec![],
                },
            ],
        };
        render(&path, &[Panel::Lines(lines), Panel::Bars(bars), Panel::Groups(groups)], 2).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    }

    #[test]
    fn empty_data_is_an_error() {
        let dir = crate::testutil::TempDir::new("plot-empty");
        let c = LineChart { title: "e".into(), ..LineChart::default() };
        assert!(render(&dir.path().join("e.png"), &[Panel::Lines(c)], 1).is_err());
        let g = GroupedBarChart {
            title: "g".into(),
            categories: vec!["x".into()],
            series: vec![BarSeries { name: "a".into(), values: vec![None], ..BarSeries::default() }],
            ..GroupedBarChart::default()
        };
        assert!(render(&dir.path().join("g.png"), &[Panel::Groups(g)], 1).is_err());
    }
}
