//! Reading a trace: the Chrome trace-event JSON that Perfetto opens, and a summary of the slowest
//! nodes. The timeline drawing is in `timeline.rs`; the recording itself is the run's.

use std::fmt::Write as _;
use std::time::Duration;

use crate::run::trace::{Span, ThreadRole, Trace};

impl Trace {
    /// The Chrome trace-event JSON (the format Perfetto and `chrome://tracing` open): one
    /// complete event per span, on one track per thread, each track named after its thread
    /// and its [`ThreadRole`]: `thread 1 (caller)`, `crew thread 2`, `event loop (thread 3)`,
    /// `host gpu-box, thread 4`; each span's branch in its `args`; times in microseconds.
    pub fn to_chrome(&self) -> String {
        let spans = self.spans();
        let threads = tracks(self, &spans);
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
            json_string(label, &mut out);
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

    /// A table of the `top` slowest nodes, total time per node over every span of it. The spans
    /// of a step's items, cases or iterations (`chunks[0]`, `chunks[1]`, ...) make one row,
    /// `chunks[…]`, so that a step of a thousand items takes one row, not the table. `share` is
    /// a node's part of the time every node call took together (node-seconds, which waves and
    /// streams overlap in wall time): the nodes' shares add up to 100%; a step's parts, which
    /// hold node calls already counted, have none (`-`).
    pub fn summary(&self, top: usize) -> String {
        let spans = self.spans();
        // (row, total, runs, longest, whether it is a step's parts)
        let mut totals: Vec<(String, Duration, u32, Duration, bool)> = Vec::new();
        let mut calls = Duration::ZERO;
        for span in &spans {
            let row = if let Some(step) = &span.part_of {
                format!("{step}[…]")
            } else {
                calls += span.duration();
                span.node.as_str().to_owned()
            };
            let parts = span.part_of.is_some();
            match totals
                .iter_mut()
                .find(|(name, .., of_parts)| *name == row && *of_parts == parts)
            {
                Some((_, total, runs, longest, _)) => {
                    *total += span.duration();
                    *runs += 1;
                    *longest = (*longest).max(span.duration());
                }
                None => totals.push((row, span.duration(), 1, span.duration(), parts)),
            }
        }
        // Slowest first; ties in first-seen order, so the table is stable.
        totals.sort_by_key(|entry| std::cmp::Reverse(entry.1));
        let width = totals
            .iter()
            .take(top)
            .map(|(row, ..)| row.chars().count())
            .max()
            .unwrap_or(0)
            .max(4);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<width$}  {:>12}  {:>5}  {:>12}  {:>6}",
            "node", "total", "runs", "longest", "share"
        );
        for (row, total, runs, longest, parts) in totals.iter().take(top) {
            let share = if *parts {
                "-".to_owned()
            } else if calls.is_zero() {
                "0.0%".to_owned()
            } else {
                format!("{:.1}%", 100.0 * total.as_secs_f64() / calls.as_secs_f64())
            };
            let _ = writeln!(
                out,
                "{row:<width$}  {:>12}  {runs:>5}  {:>12}  {share:>6}",
                human(*total),
                human(*longest),
            );
        }
        if totals.len() > top {
            let _ = writeln!(out, "... and {} more", totals.len() - top);
        }
        out
    }
}

/// One track per thread, in the order threads first ended a span, each named after its thread:
/// its number, and what it is ([`ThreadRole`]) or the host it ran on. A wave's branches are
/// the spans' own (`args.branch`): a thread runs many branches one after another.
pub(super) fn tracks(trace: &Trace, spans: &[Span]) -> Vec<(u64, String)> {
    let mut threads: Vec<(u64, String)> = Vec::new();
    for span in spans {
        if threads.iter().any(|(t, _)| *t == span.thread) {
            continue;
        }
        let n = span.thread;
        let label = match &span.host {
            Some(host) => format!("host {host}, thread {n}"),
            None => match trace.role_of(n) {
                ThreadRole::Caller => format!("thread {n} (caller)"),
                ThreadRole::Crew => format!("crew thread {n}"),
                ThreadRole::EventLoop => format!("event loop (thread {n})"),
            },
        };
        threads.push((n, label));
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
