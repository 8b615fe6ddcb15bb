//! `Executor::would_hit`: which nodes a run with a cache would find there, without running any.
//!
//! Keys are made as a run makes them ([`crate::run::keys`]), in plan order, with each entry's
//! digest read from the cache ([`NodeCache::peek`]) and no output read or unpickled. A node
//! whose key is not there would run; what reads it is then keyed on an output not computed
//! yet, so it is counted as running too — though, with early cutoff, it may yet hit.

use crate::model::id::NodeId;
use crate::model::value::Value;
use crate::run::executor::Executor;
use crate::run::keys::RunKeys;
use crate::run::program::{Op, Program, Step};

impl Executor {
    /// For each step of `program`, in plan order, its node and whether a run on `input` with
    /// this executor's cache would find its output there; empty without a cache.
    pub fn would_hit(&self, program: &Program, input: &Value) -> Vec<(NodeId, bool)> {
        let Some(cache) = &self.cache else {
            return Vec::new();
        };
        let keys = RunKeys::new(std::sync::Arc::clone(cache), program);
        steps(&program.root)
            .into_iter()
            .map(|step| {
                let id = &program.ids[step.slot()];
                let found = cache
                    .fingerprint(id, &*step.node)
                    .and_then(|fingerprint| keys.key_of(id, &fingerprint, step, input))
                    .and_then(|key| Some((key, cache.peek(id, &key)?)));
                if let Some((key, digest)) = found {
                    keys.settle(step.slot(), Some(digest.unwrap_or(key)));
                }
                (id.clone(), found.is_some())
            })
            .collect()
    }
}

/// The steps under `root`, in plan order, from a stack: any depth costs no stack.
fn steps(root: &Op) -> Vec<&Step> {
    let mut found = Vec::new();
    let mut pending = vec![root];
    while let Some(op) = pending.pop() {
        match op {
            Op::Execute(step) => found.push(step),
            Op::Sequence { steps, .. } => pending.extend(steps.iter().rev()),
            Op::Wave { branches, .. } => pending.extend(branches.iter().rev()),
            // A decision is never read from the cache: what it runs is not in its key.
            Op::Empty | Op::Map(_) | Op::Switch(_) | Op::Loop(_) => {}
        }
    }
    found
}
