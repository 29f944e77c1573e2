//! busbw against size (log axis), one line per transport, as SVG.

use crate::report::Row;
use plotters::prelude::*;

pub(crate) fn write_svg(path: &str, title: &str, rows: &[Row]) -> Result<(), String> {
    let points: Vec<&Row> = rows.iter().filter(|r| r.size_bytes > 0).collect();
    if points.is_empty() {
        return Err("nothing to plot (no sized rows)".into());
    }
    let min = points
        .iter()
        .map(|r| r.size_bytes)
        .min()
        .unwrap_or(1)
        .max(1) as f64;
    let max = points
        .iter()
        .map(|r| r.size_bytes)
        .max()
        .unwrap_or(2)
        .max(2) as f64;
    let ymax = points
        .iter()
        .map(|r| r.busbw_gbps)
        .fold(0.0f64, f64::max)
        .max(1e-3)
        * 1.15;
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| format!("plot {path}: {e}");
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d((min..max * 1.01).log_scale(), 0.0..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("bus bandwidth (GB/s)")
        .x_label_formatter(&|v| human(*v))
        .draw()
        .map_err(err)?;
    let mut transports: Vec<&str> = Vec::new();
    for r in &points {
        if !transports.contains(&r.transport.as_str()) {
            transports.push(&r.transport);
        }
    }
    for (i, t) in transports.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let series: Vec<(f64, f64)> = points
            .iter()
            .filter(|r| r.transport == *t)
            .map(|r| (r.size_bytes as f64, r.busbw_gbps))
            .collect();
        chart
            .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(t.to_string())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                series
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Axis labels in decimal units (the log axis ticks at powers of ten).
fn human(v: f64) -> String {
    match v {
        v if v >= 1e9 => format!("{} GB", v / 1e9),
        v if v >= 1e6 => format!("{} MB", v / 1e6),
        v if v >= 1e3 => format!("{} kB", v / 1e3),
        v => format!("{v} B"),
    }
}
