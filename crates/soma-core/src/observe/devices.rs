//! A plan drawn with the devices its nodes are placed on: the same drawings (tree, Mermaid, DOT,
//! SVG), each placed node labelled `id @ device`; and a graph's SVG drawn the same way.
//! Placement is part of neither a plan nor a graph, so it is drawn beside them.

use std::fmt;

use super::dot::plan_dot;
use super::layout::{graph_svg, plan_svg};
use super::mermaid::plan_mermaid;
use super::tree::write_tree;
use crate::model::device::Placement;
use crate::model::graph::Graph;
use crate::plan::Plan;

/// A plan and where its nodes are placed, for drawing; made by [`Plan::with_devices`].
#[derive(Clone, Copy, Debug)]
pub struct WithDevices<'a> {
    plan: &'a Plan,
    placement: &'a Placement,
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
    pub fn with_devices<'a>(&'a self, placement: &'a Placement) -> WithDevices<'a> {
        WithDevices {
            plan: self,
            placement,
        }
    }
}

impl WithDevices<'_> {
    /// [`Plan::to_mermaid`], each placed node labelled `id @ device`.
    pub fn to_mermaid(&self) -> String {
        plan_mermaid(self.plan, Some(self.placement))
    }

    /// [`Plan::to_dot`], each placed node labelled `id @ device`.
    pub fn to_dot(&self) -> String {
        plan_dot(self.plan, Some(self.placement))
    }

    /// [`Plan::to_svg`], each placed node's box saying `id @ device`.
    pub fn to_svg(&self) -> String {
        plan_svg(self.plan, Some(self.placement))
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
        graph_svg(self.graph, Some(self.placement))
    }
}

impl fmt::Display for WithDevices<'_> {
    /// The plan's indented tree, `@ device` after each placed node's line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_tree(self.plan, Some(self.placement), f)
    }
}
