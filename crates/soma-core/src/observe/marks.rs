//! What a drawing says of a node besides its id: the device it is placed on, and whether a run
//! would find it in a cache — one place for the label every drawing writes, so that the tree,
//! Mermaid, DOT and SVG say the same.

use std::collections::HashSet;

use crate::model::device::{Device, Placement};
use crate::model::id::NodeId;

/// What a drawing says of a node besides its id.
#[derive(Clone, Copy, Default)]
pub(super) struct Marks<'a> {
    pub(super) devices: Option<&'a Placement>,
    pub(super) cached: Option<&'a HashSet<NodeId>>,
}

impl Marks<'_> {
    /// The device `node` is placed on, if any.
    pub(super) fn device(&self, node: &NodeId) -> Option<Device> {
        self.devices
            .and_then(|devices| devices.device(node.as_str()))
    }

    /// Whether `node` would be found in the cache the drawing was given.
    pub(super) fn cached(&self, node: &NodeId) -> bool {
        self.cached.is_some_and(|cached| cached.contains(node))
    }

    /// What a node's box says: its id, `@ device` when it is placed, and ` (cached)` when it
    /// would be found in the cache.
    pub(super) fn label(&self, node: &NodeId) -> String {
        let mut label = match self.device(node) {
            Some(device) => format!("{node} @ {device}"),
            None => node.to_string(),
        };
        if self.cached(node) {
            label.push_str(" (cached)");
        }
        label
    }
}
