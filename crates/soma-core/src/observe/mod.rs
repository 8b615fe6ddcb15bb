//! Seeing what was decided and what happened: drawings of plans and graphs, and traces of runs.
//!
//! Everything here reads the model, the plan and the spans a run recorded; nothing in the
//! stages before it imports it, so a plan or a graph knows nothing of how it is drawn. Each
//! drawing is an inherent method of the type it draws (`Plan::to_svg`, `Graph::to_svg`,
//! `Trace::to_chrome`), written here.

pub(crate) mod devices;
mod dot;
mod layout;
mod marks;
mod mermaid;
mod svg;
mod timeline;
mod trace;
mod tree;
