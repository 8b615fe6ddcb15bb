//! What every SVG Soma draws shares: the palette, the font and its metrics, escaping, and the
//! opening of a document — so a plan, a graph and a trace's timeline look like one family.

use std::fmt::Write as _;

// Light colours on an opaque background, set explicitly everywhere: a notebook's dark theme
// then shows a light card rather than dark text on a dark page.
pub(super) const BACKGROUND: &str = "#fcfcfc";
pub(super) const NODE_FILL: &str = "#e8f0fe";
pub(super) const NODE_STROKE: &str = "#3366aa";
pub(super) const TEXT: &str = "#1a1a1a";
pub(super) const EDGE: &str = "#666666";
pub(super) const WAVE_STROKE: &str = "#b7791f";
pub(super) const WAVE_TEXT: &str = "#975a16";
/// A remote slice's frame: the host it runs on.
pub(super) const HOST_STROKE: &str = "#2f855a";
pub(super) const HOST_TEXT: &str = "#276749";
pub(super) const ORDER_STROKE: &str = "#8a8a8a";
pub(super) const ORDER_TEXT: &str = "#6b6b6b";
pub(super) const MUTED: &str = "#888888";
/// A timeline's gridlines: fainter than anything drawn on them.
pub(super) const GRID: &str = "#e3e3e3";
/// A node a run would find in a cache: green, as what needs no work.
pub(super) const CACHED_FILL: &str = "#d9f2e3";
pub(super) const CACHED_STROKE: &str = "#2f855a";
/// A span that ended in an error.
pub(super) const FAILED_FILL: &str = "#f4b4b4";

pub(super) const FONT_SIZE: i64 = 13;
/// The advance of one character of a 13px monospace font, rounded up so a box never clips.
pub(super) const CHAR_WIDTH: i64 = 8;
/// From a box's vertical centre down to the baseline that centres a line of 13px text.
pub(super) const BASELINE: i64 = 4;
pub(super) const NODE_HEIGHT: i64 = 32;
pub(super) const NODE_MIN_WIDTH: i64 = 64;
pub(super) const NODE_PADDING: i64 = 12;
/// Between columns: the room arrows are drawn in.
pub(super) const COLUMN_GAP: i64 = 48;
pub(super) const ROW_GAP: i64 = 16;
/// Around the drawing; at least what an arrow drawn over a top row rises above it.
pub(super) const MARGIN: i64 = 20;
/// Inside a frame, left and right.
pub(super) const FRAME_SIDE: i64 = 12;
/// Inside a frame, top and bottom: the same both ways so that a frame's centre is its
/// content's centre and arrows into a wave stay level; the top one holds the label.
pub(super) const FRAME_END: i64 = 20;
pub(super) const HEAD: i64 = 8;
pub(super) const CORNER: i64 = 6;
/// How far each arrow drawn over a row rises above the boxes, per column it skips, so that
/// arrows over the same row do not run on one line; capped to stay inside [`MARGIN`].
pub(super) const ARC_STEP: i64 = 5;
pub(super) const ARC_LEVELS: i64 = 3;

/// Escapes text for XML content and attribute values. Ids hold no control characters; the two
/// noncharacters XML still refuses become U+FFFD so the document always parses.
pub(super) fn xml(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\u{FFFE}' | '\u{FFFF}' => out.push('\u{FFFD}'),
            c if c.is_control() => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
}

pub(super) fn svg_open(width: i64, height: i64, out: &mut String) {
    let _ = write!(
        out,
        concat!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" ",
            "viewBox=\"0 0 {w} {h}\" font-family=\"Menlo, Consolas, DejaVu Sans Mono, monospace\" ",
            "font-size=\"{size}\">\n",
            "<rect class=\"background\" x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"{bg}\"/>\n",
        ),
        w = width,
        h = height,
        size = FONT_SIZE,
        bg = BACKGROUND,
    );
}
