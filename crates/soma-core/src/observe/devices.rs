//! A plan drawn with what is known of its nodes besides the plan: the device each is placed on
//! (labelled `id @ device`) and which would be found in a cache (labelled `id (cached)` and
//! filled apart) — the same drawings (tree, Mermaid, DOT, SVG); and a graph's SVG drawn with its
//! devices. Neither placement nor a cache is part of a plan or a graph, so they are drawn
//! beside them.

use std::collections::HashSet;
use std::fmt;

use super::dot::plan_dot;
use super::layout::{graph_svg, plan_svg};
use super::marks::Marks;
use super::mermaid::plan_mermaid;
use super::tree::write_tree;
use crate::model::device::Placement;
use crate::model::graph::Graph;
use crate::model::id::NodeId;
use crate::plan::Plan;

/// A plan with where its nodes are placed and which would be found in a cache, for drawing;
/// made by [`Plan::with_devices`] or [`Plan::with_cached`], each adding what the other says.
#[derive(Clone, Copy)]
pub struct Drawing<'a> {
    plan: &'a Plan,
    marks: Marks<'a>,
}

impl fmt::Debug for Drawing<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drawing")
            .field("plan", &self.plan.compact())
            .field("devices", &self.marks.devices)
            .field("cached", &self.marks.cached)
            .finish()
    }
}

impl Plan {
    /// This plan with `placement`, to draw each placed node with its device.
    ///
    /// ```
    /// use soma_core::{compile, node, Device, NodeError, Placement, Value};
    /// let pass = |x: &Value| -> Result<Value, NodeError> { Ok(x.clone()) };
    /// let (graph, catalog) = (node("a", pass) >> node("b", pass)).somatize()?;
    /// let plan = compile(&graph, &catalog)?;
    /// let mut placement = Placement::new();
    /// placement.place("b", "cuda:1".parse::<Device>()?);
    /// assert_eq!(plan.with_devices(&placement).to_string(), "Sequence\n├── a <- (input)\n└── b <- a @ cuda:1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_devices<'a>(&'a self, placement: &'a Placement) -> Drawing<'a> {
        Drawing {
            plan: self,
            marks: Marks::default(),
        }
        .with_devices(placement)
    }

    /// This plan with the nodes a run would find in a cache (as
    /// [`Executor::would_hit`](crate::Executor::would_hit) says), to draw each of them
    /// labelled `id (cached)` and filled apart from those that would run.
    ///
    /// ```
    /// use std::collections::HashSet;
    /// use soma_core::{compile, node, NodeError, NodeId, Value};
    /// let pass = |x: &Value| -> Result<Value, NodeError> { Ok(x.clone()) };
    /// let (graph, catalog) = (node("a", pass) >> node("b", pass)).somatize()?;
    /// let plan = compile(&graph, &catalog)?;
    /// let cached: HashSet<NodeId> = [NodeId::new("a")].into();
    /// assert_eq!(plan.with_cached(&cached).to_string(), "Sequence\n├── a <- (input) (cached)\n└── b <- a");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_cached<'a>(&'a self, cached: &'a HashSet<NodeId>) -> Drawing<'a> {
        Drawing {
            plan: self,
            marks: Marks::default(),
        }
        .with_cached(cached)
    }
}

impl<'a> Drawing<'a> {
    /// The same drawing, each placed node labelled `id @ device`.
    #[must_use]
    pub fn with_devices(mut self, placement: &'a Placement) -> Self {
        self.marks.devices = Some(placement);
        self
    }

    /// The same drawing, each node in `cached` labelled `id (cached)` and filled apart.
    #[must_use]
    pub fn with_cached(mut self, cached: &'a HashSet<NodeId>) -> Self {
        self.marks.cached = Some(cached);
        self
    }

    /// [`Plan::to_mermaid`], each node labelled as its marks say; the nodes that would be found
    /// in the cache in the class `soma_cached`, filled apart.
    pub fn to_mermaid(&self) -> String {
        plan_mermaid(self.plan, self.marks)
    }

    /// [`Plan::to_dot`], each node labelled as its marks say; the nodes that would be found in
    /// the cache filled apart.
    pub fn to_dot(&self) -> String {
        plan_dot(self.plan, self.marks)
    }

    /// [`Plan::to_svg`], each node's box saying what its marks say; the boxes of the nodes that
    /// would be found in the cache in the class `node cached`, filled apart.
    pub fn to_svg(&self) -> String {
        plan_svg(self.plan, self.marks)
    }
}

/// A graph and where its nodes are placed, for drawing; made by [`Graph::with_devices`].
#[derive(Clone, Copy, Debug)]
pub struct GraphWithDevices<'a> {
    graph: &'a Graph,
    placement: &'a Placement,
}

impl Graph {
    /// This graph with `placement`, to draw each placed node with its device.
    ///
    /// ```
    /// use soma_core::{Device, Graph, Placement};
    /// let mut graph = Graph::new();
    /// graph.add_node("a")?;
    /// graph.add_node("b")?;
    /// graph.add_edge("a", "b")?;
    /// let mut placement = Placement::new();
    /// placement.place("b", "cuda:1".parse::<Device>()?);
    /// assert!(graph.with_devices(&placement).to_svg().contains(">b @ cuda:1<"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_devices<'a>(&'a self, placement: &'a Placement) -> GraphWithDevices<'a> {
        GraphWithDevices {
            graph: self,
            placement,
        }
    }
}

impl GraphWithDevices<'_> {
    /// [`Graph::to_svg`], each placed node's box saying `id @ device`.
    pub fn to_svg(&self) -> String {
        graph_svg(
            self.graph,
            Marks {
                devices: Some(self.placement),
                cached: None,
            },
        )
    }
}

impl fmt::Display for Drawing<'_> {
    /// The plan's indented tree, `@ device` after each placed node's line and ` (cached)`
    /// after each that would be found in the cache.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_tree(self.plan, self.marks, f)
    }
}
