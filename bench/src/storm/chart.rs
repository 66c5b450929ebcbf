//! The storm's chart: single-shard registrations per second against concurrent clients, one line
//! per arm, as an SVG file.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// One line of the chart: an arm's name and its (clients, registrations/s) points.
pub struct Series {
    pub name: String,
    pub points: Vec<(usize, f64)>,
}

/// Draws `series` into the SVG file at `path`; the client axis is logarithmic (base 2).
pub fn draw(path: &Path, series: &[Series]) -> Result<()> {
    let max_clients = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .max()
        .unwrap_or(1)
        .max(2) as f64;
    let max_rate = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(1.0f64, f64::max);
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Single-shard registrations through the HTTP API, 3-node cluster",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.3f64..max_clients.log2() + 0.3, 0f64..max_rate * 1.15)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("concurrent clients")
        .y_desc("registrations / s")
        .x_labels((max_clients.log2().ceil() as usize) + 2)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{}", 2f64.powf(x.round()))
            } else {
                String::new()
            }
        })
        .light_line_style(WHITE.mix(0.0))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(plot_err)?;
    let colors = [RGBColor(31, 119, 180), RGBColor(214, 39, 40), GREEN, BLACK];
    for (i, s) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|&(c, r)| ((c as f64).log2(), r))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(plot_err)?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(plot_err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

fn plot_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("draw chart: {e}")
}
