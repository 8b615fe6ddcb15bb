//! soma-core's questionnaire: one test binary, one guarantee per test, named after it.
//!
//! | module | asks about |
//! |---|---|
//! | `aio` | runs with async nodes walked by the engine: results, what is in flight, errors, threads, depth, refusals |
//! | `cache` | a rerun calls only what changed: keys of code, input and predecessors; resume; waves |
//! | `graph` | construction, refusals that change nothing, queries and their orders; embedding under a step's path and reading it back |
//! | `values` | O(1) clones, identity of `Opaque`, maps; deep values drop, compare, print on a small stack |
//! | `execution` | what each node reads, what a run returns, who is blamed, the watch |
//! | `drivers` | awaiting nodes, turns and their limit, driver failures |
//! | `dsl` | `>>` and `|` against `add_node`/`add_edge`, errors that survive gluing |
//! | `decomposition` | the plan of each topology, and compile's refusal |
//! | `drawing` | the tree, Mermaid, DOT and SVG of plans and graphs |
//! | `hosts` | host names read and refused where written; distribution into remote slices, drawn |
//! | `placement` | devices read and refused where written, placement beside the plan, shown in traces and drawings |
//! | `policies` | retries (counts, which failures, pauses, the count in the error) and time limits, each attempt a span |
//! | `messages` | every error's message, word for word (inline snapshots) |
//! | `context` | each branch runs in a copy of the context its wave was reached in, its changes its own |
//! | `decide` | `each`, `switch` and `repeat`: their plans, results, items at once, which error wins, bounds |
//! | `crew` | the threads a program lends its waves: as many as are in flight, idle ones capped, gone with the program |
//! | `layers` | the stages import one way: model, plan, compile, run, observe; the modules of a stage too |
//! | `isolation` | a branch's thread is its own; a million-node chain needs no deep stack |
//! | `depth` | a graph nested 100,000 levels deep compiles, draws, clones and drops on a small stack |
//! | `invariants` | every plan, over a battery and random DAGs; the expression oracle |
//! | `board` | a run's board: each node's last state and attempt, each change read once, the reader woken once per batch, failures alone told the observer, a step's inner nodes |
//! | `observing` | the observer told each work as it begins and ends, on its thread, once: runs, calls, attempts, cache hits, parts, streamed items |
//! | `tracing` | spans per node, their thread and branch, the Chrome trace, summary, timeline |
//! | `streams` | items through a program, stages overlapped, order, bounds, errors, early close |
//! | `waves` | branches really at once, one thread each, failures and panics |
//! | `written_policies` | `.retry()` and `.time_limit()` of the Rust builder: counts, filters, pauses, limits, innermost wins, inside decision steps |

// What `random_graphs` builds; it is shared with a unit test, where its crate differs.
use soma_core::Graph;

mod aio;
mod board;
mod cache;
mod context;
mod crew;
mod decide;
mod decomposition;
mod depth;
mod detach;
mod drawing;
mod drivers;
mod dsl;
mod execution;
mod graph;
mod hosts;
mod invariants;
mod isolation;
mod layers;
mod messages;
mod observing;
mod placement;
mod policies;
mod random_graphs;
mod streams;
mod support;
mod tracing;
mod values;
mod waves;
mod written_policies;
