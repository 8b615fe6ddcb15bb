//! The model: what a user builds before anything runs.
//!
//! Ids and the [`Graph`](graph::Graph) of them (topology only), the [`Value`](value::Value)s
//! that flow on edges, the contracts of a [`Node`](node::Node) and a [`Driver`](driver::Driver),
//! the [`Catalog`](catalog::Catalog) that says what each node does, the
//! [`Placement`](device::Placement) that says where, the policies written on nodes
//! ([`WrittenPolicies`](policy::WrittenPolicies)), the [`Key`](key::Key)s a cache files
//! outputs under, and the DSL
//! ([`Expr`](expr::Expr), `>>` and `|`) that writes graph and catalog together. Nothing here
//! knows about plans, threads or drawing: every later stage reads the model, never the reverse.

pub(crate) mod catalog;
pub(crate) mod decision;
pub(crate) mod device;
pub(crate) mod driver;
pub(crate) mod expr;
pub(crate) mod failure;
pub(crate) mod graph;
pub(crate) mod host;
pub(crate) mod id;
pub(crate) mod key;
pub(crate) mod node;
pub(crate) mod policy;
pub(crate) mod reading;
pub(crate) mod value;
