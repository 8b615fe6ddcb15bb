//! A trace drawn as an SVG timeline: one row per thread, one bar per span.

use std::fmt::Write as _;
use std::time::Duration;

use super::svg::{
    svg_open, xml, CHAR_WIDTH, FAILED_FILL, GRID, MUTED, NODE_FILL, NODE_STROKE, TEXT,
};
use super::trace::{human, tracks, window};
use crate::run::trace::Trace;

impl Trace {
    /// A timeline: one row per thread, one bar per span, labelled with its node.
    pub fn to_svg(&self) -> String {
        const ROW: i64 = 28;
        const BAR: i64 = 20;
        const PLOT: i64 = 720;
        const MARGIN: i64 = 16;
        let spans = self.spans();
        let threads = tracks(self, &spans);
        let names: Vec<String> = threads.iter().map(|(_, label)| label.clone()).collect();
        // Wide enough for the longest row name, in the monospace font the drawing uses.
        let longest = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
        let label_width = i64::try_from(longest).unwrap_or(0) * CHAR_WIDTH + 16;
        let (start, end) = window(&spans);
        let wall = end.saturating_sub(start).as_secs_f64().max(1e-9);
        let rows = i64::try_from(threads.len().max(1)).unwrap_or(i64::MAX);
        // Room on the right for the last tick's label, centred on the end of the plot.
        let (width, height) = (
            label_width + PLOT + 2 * MARGIN + 32,
            rows * ROW + 2 * MARGIN + 24,
        );
        let mut out = String::new();
        svg_open(width, height, &mut out);
        let x_of = |at: Duration| {
            // A pixel position within PLOT: small numbers, exact in f64 either way.
            #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
            let x = (at.saturating_sub(start).as_secs_f64() / wall * PLOT as f64).round() as i64;
            MARGIN + label_width + x
        };
        // A time axis under the rows: five ticks, with faint gridlines through the rows so a bar's
        // start and end can be read off.
        let axis = MARGIN + rows * ROW;
        for tick in 0..=4_u32 {
            let at = start + end.saturating_sub(start) * tick / 4;
            let x = x_of(at);
            let _ = writeln!(
                out,
                "<line x1=\"{x}\" y1=\"{MARGIN}\" x2=\"{x}\" y2=\"{axis}\" stroke=\"{GRID}\"/><text x=\"{x}\" y=\"{}\" fill=\"{MUTED}\" font-size=\"11\" text-anchor=\"middle\">{}</text>",
                axis + 14,
                human(at.saturating_sub(start))
            );
        }
        for (row, ((thread, _), name)) in threads.iter().zip(&names).enumerate() {
            let y = MARGIN + i64::try_from(row).unwrap_or(0) * ROW;
            let _ = write!(
                out,
                "<text x=\"{MARGIN}\" y=\"{}\" fill=\"{TEXT}\">",
                y + BAR / 2 + 4
            );
            xml(name, &mut out);
            out.push_str("</text>\n");
            for span in spans.iter().filter(|s| s.thread == *thread) {
                let (x0, x1) = (x_of(span.start), x_of(span.end));
                let fill = if span.error.is_some() {
                    FAILED_FILL
                } else {
                    NODE_FILL
                };
                out.push_str("<g class=\"span\"><title>");
                xml(
                    &format!(
                        "{} — {} (branch {}, {} turn{})",
                        span.node,
                        human(span.duration()),
                        span.branch_label(),
                        span.turns,
                        if span.turns == 1 { "" } else { "s" }
                    ),
                    &mut out,
                );
                let _ = writeln!(
                    out,
                    "</title><rect x=\"{x0}\" y=\"{y}\" width=\"{}\" height=\"{BAR}\" fill=\"{fill}\" stroke=\"{NODE_STROKE}\"/>",
                    (x1 - x0).max(1)
                );
                if x1 - x0 > 40 {
                    let _ = write!(
                        out,
                        "<text x=\"{}\" y=\"{}\" fill=\"{TEXT}\" font-size=\"11\">",
                        x0 + 4,
                        y + BAR / 2 + 4
                    );
                    xml(span.node.as_str(), &mut out);
                    out.push_str("</text>");
                }
                out.push_str("</g>\n");
            }
        }
        out.push_str("</svg>\n");
        out
    }
}
