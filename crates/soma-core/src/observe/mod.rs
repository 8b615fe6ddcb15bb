//! Seeing what was decided and what happened: drawings of plans and graphs, and traces of runs.
//!
//! Everything here reads the model, the plan and the spans a run recorded; nothing in the
//! stages before it imports it, so a plan or a graph knows nothing of how it is drawn.

pub(crate) mod draw;
pub(crate) mod trace;
