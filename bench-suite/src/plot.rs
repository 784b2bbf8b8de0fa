//! SVG plots for `--out`: rate against size, one line per implementation and thread count.
//! Drawn with plotters' SVG backend and no font feature, so text is emitted as SVG `<text>` and
//! no system font library is needed.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;

/// Draws one plot into `path`: `series` maps a label to its `(size, rate)` points.
pub fn draw(
    path: &Path,
    title: &str,
    y_label: &str,
    series: &BTreeMap<String, Vec<(f64, f64)>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let xs = series.values().flatten().map(|p| p.0);
    let (x_min, x_max) = xs.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let y_max = series.values().flatten().map(|p| p.1).fold(0.0f64, f64::max);
    if !(x_min.is_finite() && x_max > 0.0 && y_max.is_finite()) {
        return Err("nothing to plot".into());
    }
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x_min * 0.9..x_max * 1.1).log_scale(), 0.0..y_max * 1.1)?;
    chart.configure_mesh().x_desc("size").y_desc(y_label).draw()?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let mut pts = pts.clone();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
