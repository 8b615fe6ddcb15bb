//! Reading a trace: the Chrome trace-event JSON that Perfetto opens, and a summary of the slowest
//! nodes. The timeline drawing is in `timeline.rs`; the recording itself is the run's.

use std::fmt::Write as _;
use std::time::Duration;

use crate::model::id::NodeId;
use crate::run::trace::{Span, Trace};

impl Trace {
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
            if let Some(host) = &span.host {
                out.push_str(",\"host\":");
                json_string(host.as_str(), &mut out);
            }
            if let Some(device) = span.device {
                // A device is written in lowercase letters, digits and `:`: nothing to escape.
                let _ = write!(out, ",\"device\":\"{device}\"");
            }
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
}

/// One track per thread, in the order threads first ended a span, each with the label of the
/// first branch seen on it (and its host, for a remote slice's thread).
pub(super) fn tracks(spans: &[Span]) -> Vec<(u64, String)> {
    let mut threads: Vec<(u64, String)> = Vec::new();
    for span in spans {
        if !threads.iter().any(|(t, _)| *t == span.thread) {
            threads.push((span.thread, span.track_label()));
        }
    }
    threads
}

/// The earliest start and the latest end; zero for no span.
pub(super) fn window(spans: &[Span]) -> (Duration, Duration) {
    let start = spans.iter().map(|s| s.start).min().unwrap_or_default();
    let end = spans.iter().map(|s| s.end).max().unwrap_or_default();
    (start, end)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A duration for people: `812 ns`, `14.2 µs`, `3.10 ms`, `1.25 s`.
pub(super) fn human(d: Duration) -> String {
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
