//! `soma._soma`: the glue between Python and `soma-core`, and nothing else.
//!
//! Python objects become nodes and drivers here, values cross the boundary here, and core
//! errors become Python exceptions here; the graph algorithms and the executor stay in the
//! core. The public Python API (`soma.Graph`, the DSL, the exception hierarchy) is written in
//! Python on top of this module.

mod aio;
mod arrow_text;
mod board;
mod cache;
mod cache_state;
mod code;
mod context;
mod convert;
mod device;
mod device_queues;
mod digest;
mod driver;
mod errors;
mod exit;
mod flow;
mod graph;
mod hashed_write;
mod hosts;
mod native;
mod node;
mod observer;
mod plan;
mod policy;
mod protocol;
mod py_modules;
mod reach;
mod reading;
mod reentry;
mod seconds;
mod step_ids;
mod stopped;
mod stream;
mod text;
mod thread_state;
mod torch_state;
mod trace;
mod watch;
mod witness;

use pyo3::prelude::*;

/// Whether a thread waits in the process's reserve (`soma_core::keep_a_thread_in_reserve`),
/// which is filled first if it was taken: for tests that count the process's threads, which
/// must know whether the reserve's one is among them. Not API.
#[pyfunction]
fn _thread_in_reserve() -> bool {
    let _ = soma_core::keep_a_thread_in_reserve();
    soma_core::thread_in_reserve().is_some()
}

// The module needs the GIL: it tells a free-threaded interpreter so (which then keeps its GIL
// on while the module is loaded), where PyO3 since 0.28 declares a module safe without one unless
// told otherwise. Nobody has checked that it is. Before this may become `false`, an audit must
// cover at least:
// - `aio.rs`'s waker (`Wake`), which assumes no Python runs while its lock is held, and its
//   thread-locals (`RESUME`, `YIELDED`, ...) that hand a step's state across one poll;
// - `torch_state.rs`'s borrowed reference to `sys.modules` from `PyImport_GetModuleDict`, and
//   its reads of torch's thread state;
// - every comment that reasons from the GIL (`grep -rn GIL crates/soma-python/src`: about eighty
//   lines, in `exit.rs`, `thread_state.rs`, `graph/interpreter.rs`, `context.rs`, `witness.rs`,
//   `digest.rs`, `code.rs`, `cache.rs`, `node.rs`, `observer.rs`, `watch.rs`, `flow.rs`,
//   `stream.rs`, `driver.rs`, `native.rs`, `device_queues.rs`, `graph/mod.rs`), each of which
//   holds only while the GIL serializes Python: a crew thread holding it from one node to the
//   next, the exit's door counting threads inside the interpreter, the `unsafe` blocks whose
//   SAFETY rests on "the GIL is held".
#[pymodule(gil_used = true)]
fn _soma(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<graph::GraphCore>()?;
    module.add_class::<plan::PyPlan>()?;
    module.add_class::<protocol::Await>()?;
    module.add_class::<protocol::Done>()?;
    module.add_class::<protocol::PyCtx>()?;
    module.add_class::<native::NativeNode>()?;
    module.add_class::<trace::PyTrace>()?;
    module.add_class::<stream::StreamCore>()?;
    module.add_class::<trace::PySpan>()?;
    module.add_class::<board::PyBoard>()?;
    module.add_class::<watch::StopFlag>()?;
    module.add_class::<aio::Stepper>()?;
    module.add_class::<flow::FlowCore>()?;
    module.add_class::<flow::FlowNext>()?;
    module.add_class::<digest::Hasher>()?;
    module.add_class::<cache_state::MemoryEntries>()?;
    module.add_class::<cache_state::CacheCounts>()?;
    module.add_class::<witness::Witness>()?;
    module.add_class::<witness::Remembered>()?;
    module.add_function(wrap_pyfunction!(digest::blake3, module)?)?;
    module.add_function(wrap_pyfunction!(hashed_write::write_hashed, module)?)?;
    module.add_function(wrap_pyfunction!(hashed_write::xxh3_128, module)?)?;
    module.add_function(wrap_pyfunction!(text::text_column, module)?)?;
    module.add_function(wrap_pyfunction!(arrow_text::arrow_text, module)?)?;
    module.add_function(wrap_pyfunction!(text::text_pack, module)?)?;
    module.add_function(wrap_pyfunction!(text::text_unpack, module)?)?;
    module.add_function(wrap_pyfunction!(code::py_code_digest, module)?)?;
    module.add_function(wrap_pyfunction!(reach::reach, module)?)?;
    module.add("DEFAULT_TURN_LIMIT", soma_core::DEFAULT_TURN_LIMIT)?;
    module.add("MAX_NESTED_FORWARDS", reentry::MAX_NESTED_FORWARDS)?;
    module.add_function(wrap_pyfunction!(context::_carry_context, module)?)?;
    module.add_function(wrap_pyfunction!(_thread_in_reserve, module)?)?;
    module.add_function(wrap_pyfunction!(observer::observe, module)?)?;
    module.add_function(wrap_pyfunction!(board::boarded_runs, module)?)?;
    module.add_function(wrap_pyfunction!(board::run_number, module)?)?;
    module.add_function(wrap_pyfunction!(protocol::_journal_run_held, module)?)?;
    module.add_function(wrap_pyfunction!(device::parse_device, module)?)?;
    module.add_function(wrap_pyfunction!(hosts::parse_host, module)?)?;
    module.add_function(wrap_pyfunction!(hosts::host_refused, module)?)?;
    module.add_function(wrap_pyfunction!(stopped::checked_timeout, module)?)?;
    module.add_function(wrap_pyfunction!(stopped::hosts_past_timeout, module)?)?;
    module.add_function(wrap_pyfunction!(step_ids::node_inside, module)?)?;
    module.add_function(wrap_pyfunction!(step_ids::step_and_rest, module)?)?;
    exit::register(module)?;
    // Off any run's path, what the first forward of the first graph would otherwise do in the
    // middle of its run: start a thread for its first wave (`soma_core::keep_a_thread_in_reserve`;
    // refused, the crews start their own, and report a refusal they meet themselves), and look
    // up `threading.stack_size`.
    let _ = soma_core::keep_a_thread_in_reserve();
    graph::thread_stack_asked(module.py());
    Ok(())
}
