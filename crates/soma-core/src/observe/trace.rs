//! `Trace`: where a run spent its time — one span per node, with its thread and branch.
//!
//! A trace is opt-in and shared: pass one to [`crate::Executor::with_trace`] and every step of
//! the run records a [`Span`] when it ends (start, end, thread, branch, turns, error). A run
//! without a trace checks one `Option` per node and records nothing. The spans of one trace can
//! come from several runs and several threads; they are kept in the order they ended, behind a
//! lock that only traced runs ever take.
//!
//! What a trace is for is looking at it: [`Trace::to_chrome`] writes the Chrome trace-event
//! format that Perfetto and `chrome://tracing` open (one track per thread), [`Trace::summary`]
//! lists the slowest nodes, and [`Trace::to_svg`] draws a timeline.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::model::id::NodeId;
use crate::observe::draw::{svg_open, xml};

/// One node's run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// The node.
    pub node: NodeId,
    /// When its first turn started, since the trace was created.
    pub start: Duration,
    /// When it was done (or failed), since the trace was created.
    pub end: Duration,
    /// The thread it ran on: a number unique in this process, stable for the thread's life.
    pub thread: u64,
    /// The branch it ran in: the index of the branch in each enclosing wave, outermost first;
    /// empty outside any wave.
    pub branch: Vec<usize>,
    /// Calls to its `forward`: one, plus one per answered `Await`.
    pub turns: u32,
    /// Its error, if it failed.
    pub error: Option<String>,
}

impl Span {
    /// How long the node took.
    pub fn duration(&self) -> Duration {
        self.end.saturating_sub(self.start)
    }

    /// The branch as text: `main` outside any wave, else the indices joined by dots (`1.0`).
    pub fn branch_label(&self) -> String {
        if self.branch.is_empty() {
            return "main".to_string();
        }
        let parts: Vec<String> = self.branch.iter().map(ToString::to_string).collect();
        parts.join(".")
    }
}

/// Spans recorded by traced runs.
#[derive(Debug)]
pub struct Trace {
    origin: Instant,
    spans: Mutex<Vec<Span>>,
}

impl Default for Trace {
    fn default() -> Self {
        Self::new()
    }
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// This thread's number in traces.
pub(crate) fn thread_number() -> u64 {
    THREAD.with(|n| *n)
}

impl Trace {
    /// An empty trace; span times count from now.
    pub fn new() -> Self {
        Trace {
            origin: Instant::now(),
            spans: Mutex::new(Vec::new()),
        }
    }

    /// The time since the trace was created.
    pub(crate) fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Records a span.
    pub fn record(&self, span: Span) {
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(span);
    }

    /// A copy of the spans, in the order they ended.
    pub fn spans(&self) -> Vec<Span> {
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Number of spans.
    pub fn len(&self) -> usize {
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every span.
    pub fn clear(&self) {
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The Chrome trace-event JSON (the format Perfetto and `chrome://tracing` open): one
    /// complete event per span, on one track per thread, each track named after the first
    /// branch seen on it; times in microseconds.
    pub fn to_chrome(&self) -> String {
        let spans = self.spans();
        let threads = tracks(&spans);
        let mut out = String::from("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
        let mut first = true;
        let mut separator = |out: &mut String| {
            if !first {
                out.push_str(",\n");
            }
            first = false;
        };
        for (thread, label) in &threads {
            separator(&mut out);
            out.push_str("{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":");
            let _ = write!(out, "{thread},\"args\":{{\"name\":");
            json_string(&format!("branch {label}"), &mut out);
            out.push_str("}}");
        }
        for span in &spans {
            separator(&mut out);
            out.push_str("{\"ph\":\"X\",\"cat\":\"node\",\"name\":");
            json_string(span.node.as_str(), &mut out);
            let _ = write!(
                out,
                ",\"pid\":1,\"tid\":{},\"ts\":{:.3},\"dur\":{:.3},\"args\":{{\"branch\":",
                span.thread,
                micros(span.start),
                micros(span.duration()),
            );
            json_string(&span.branch_label(), &mut out);
            let _ = write!(out, ",\"turns\":{}", span.turns);
            if let Some(error) = &span.error {
                out.push_str(",\"error\":");
                json_string(error, &mut out);
            }
            out.push_str("}}");
        }
        out.push_str("\n]}\n");
        out
    }

    /// A table of the `top` slowest nodes, total time per node over every span of it.
    pub fn summary(&self, top: usize) -> String {
        let spans = self.spans();
        let mut totals: Vec<(NodeId, Duration, u32, Duration)> = Vec::new();
        for span in &spans {
            match totals.iter_mut().find(|(node, ..)| *node == span.node) {
                Some((_, total, runs, longest)) => {
                    *total += span.duration();
                    *runs += 1;
                    *longest = (*longest).max(span.duration());
                }
                None => totals.push((span.node.clone(), span.duration(), 1, span.duration())),
            }
        }
        // Slowest first; ties in first-seen order, so the table is stable.
        totals.sort_by_key(|entry| std::cmp::Reverse(entry.1));
        let (start, end) = window(&spans);
        let wall = end.saturating_sub(start);
        let width = totals
            .iter()
            .take(top)
            .map(|(node, ..)| node.as_str().chars().count())
            .max()
            .unwrap_or(0)
            .max(4);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<width$}  {:>12}  {:>5}  {:>12}  {:>6}",
            "node", "total", "runs", "longest", "share"
        );
        for (node, total, runs, longest) in totals.iter().take(top) {
            let share = if wall.is_zero() {
                0.0
            } else {
                100.0 * total.as_secs_f64() / wall.as_secs_f64()
            };
            let _ = writeln!(
                out,
                "{:<width$}  {:>12}  {:>5}  {:>12}  {:>5.1}%",
                node.as_str(),
                human(*total),
                runs,
                human(*longest),
                share
            );
        }
        if totals.len() > top {
            let _ = writeln!(out, "... and {} more", totals.len() - top);
        }
        out
    }

    /// A timeline: one row per thread, one bar per span, labelled with its node.
    pub fn to_svg(&self) -> String {
        const ROW: i64 = 28;
        const BAR: i64 = 20;
        const PLOT: i64 = 720;
        const MARGIN: i64 = 16;
        let spans = self.spans();
        let threads = tracks(&spans);
        let names: Vec<String> = threads
            .iter()
            .map(|(thread, label)| match label.as_str() {
                "main" => format!("thread {thread} · main"),
                _ => format!("thread {thread} · branch {label}"),
            })
            .collect();
        // Wide enough for the longest row name, in the monospace font the drawing uses.
        let longest = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
        let label_width = i64::try_from(longest).unwrap_or(0) * 8 + 16;
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
                "<line x1=\"{x}\" y1=\"{MARGIN}\" x2=\"{x}\" y2=\"{axis}\" stroke=\"#e3e3e3\"/><text x=\"{x}\" y=\"{}\" fill=\"#888888\" font-size=\"11\" text-anchor=\"middle\">{}</text>",
                axis + 14,
                human(at.saturating_sub(start))
            );
        }
        for (row, ((thread, _), name)) in threads.iter().zip(&names).enumerate() {
            let y = MARGIN + i64::try_from(row).unwrap_or(0) * ROW;
            let _ = write!(
                out,
                "<text x=\"{MARGIN}\" y=\"{}\" fill=\"#1a1a1a\">",
                y + BAR / 2 + 4
            );
            xml(name, &mut out);
            out.push_str("</text>\n");
            for span in spans.iter().filter(|s| s.thread == *thread) {
                let (x0, x1) = (x_of(span.start), x_of(span.end));
                let fill = if span.error.is_some() {
                    "#f4b4b4"
                } else {
                    "#e8f0fe"
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
                    "</title><rect x=\"{x0}\" y=\"{y}\" width=\"{}\" height=\"{BAR}\" fill=\"{fill}\" stroke=\"#3366aa\"/>",
                    (x1 - x0).max(1)
                );
                if x1 - x0 > 40 {
                    let _ = write!(
                        out,
                        "<text x=\"{}\" y=\"{}\" fill=\"#1a1a1a\" font-size=\"11\">",
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

/// One track per thread, in the order threads first ended a span, each with the label of the
/// first branch seen on it.
fn tracks(spans: &[Span]) -> Vec<(u64, String)> {
    let mut threads: Vec<(u64, String)> = Vec::new();
    for span in spans {
        if !threads.iter().any(|(t, _)| *t == span.thread) {
            threads.push((span.thread, span.branch_label()));
        }
    }
    threads
}

/// The earliest start and the latest end; zero for no span.
fn window(spans: &[Span]) -> (Duration, Duration) {
    let start = spans.iter().map(|s| s.start).min().unwrap_or_default();
    let end = spans.iter().map(|s| s.end).max().unwrap_or_default();
    (start, end)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A duration for people: `812 ns`, `14.2 µs`, `3.10 ms`, `1.25 s`.
fn human(d: Duration) -> String {
    let ns = d.as_secs_f64() * 1e9;
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Writes `text` as a JSON string literal.
fn json_string(text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
