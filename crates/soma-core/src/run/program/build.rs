//! The second pass of resolving a plan: the tree of [ops](super::ops) built from the numbering
//! ([`super::numbering`]) and the liveness found on it ([`super::drops`]), each decision step's
//! sub-plans resolved into programs of their own.
//!
//! Built bottom up on an explicit stack rather than by recursion, each container's children
//! written once into a list of their exact number, so that the tree takes no more memory than
//! it holds; a decision step's sub-plans are resolved through `Program::placed`, every few
//! levels on a fresh stack ([`crate::nesting`]).

use std::sync::Arc;

use super::drops::{drops_after, Liveness};
use super::numbering::Numbering;
use super::ops::{
    to_u32, Joined, LoopOp, MapOp, Op, Read, Reads, Step, SwitchOp, HAS_POLICY, IS_ASYNC,
};
use super::Program;
use crate::model::device::Placement;
use crate::model::id::NodeId;
use crate::nesting::nested;
use crate::plan::{Plan, Visit};
use crate::run::error::ProgramError;
use crate::run::policy::Policies;

/// What the second pass resolves each step with, besides the numbering.
#[derive(Clone, Copy)]
struct Resolved<'r> {
    liveness: &'r Liveness,
    placement: Option<&'r Placement>,
    policies: Option<&'r Policies>,
    /// How many decision steps hold the plan being resolved.
    depth: usize,
}

impl Numbering<'_> {
    /// The op of the step `entered` (an `Execute`, `Map`, `Switch` or `Loop`) in `slot`, reading
    /// `from` through the reads numbered from `*read` on; a decision's sub-plans each resolved
    /// into a program of its own.
    fn step_op(
        &self,
        entered: &Plan,
        from: &[NodeId],
        slot: usize,
        read: &mut usize,
        resolved: &Resolved<'_>,
    ) -> Result<Op, ProgramError> {
        let Resolved {
            liveness,
            placement,
            policies,
            depth,
        } = *resolved;
        let mut next = || {
            let (_, read_slot) = self.reads[*read];
            let take = liveness.takes[*read];
            *read += 1;
            Read {
                slot: read_slot,
                take,
            }
        };
        let from = match from {
            [] => Reads::Input,
            [_] => Reads::One(next()),
            many => Reads::Many(Box::new(Joined {
                reads: many.iter().map(|source| (source.clone(), next())).collect(),
            })),
        };
        let id = self.ids[slot];
        let policy = policies.is_some_and(|p| p.get(id.as_str()).is_some());
        let node = Arc::clone(self.implementations[slot]);
        let asynchronous = node.is_async();
        let step = Step {
            node,
            from,
            slot: to_u32(slot)
                | if policy { HAS_POLICY } else { 0 }
                | if asynchronous { IS_ASYNC } else { 0 },
            device: placement.and_then(|p| p.device(id.as_str())),
        };
        let catalog = self.catalog;
        let inner = |plan: &Plan| {
            nested(depth + 1, || {
                Program::placed(plan, catalog, placement, policies, depth + 1)
            })
        };
        Ok(match entered {
            Plan::Map {
                body, in_flight, ..
            } => {
                let body = inner(body)?;
                Op::Map(Box::new(MapOp {
                    asynchronous: asynchronous || body.is_async(),
                    step,
                    body,
                    in_flight: *in_flight,
                }))
            }
            Plan::Switch { keys, cases, .. } => {
                let cases: Box<[Program]> = cases.iter().map(inner).collect::<Result<_, _>>()?;
                Op::Switch(Box::new(SwitchOp {
                    asynchronous: asynchronous || cases.iter().any(Program::is_async),
                    step,
                    keys: keys.clone().into(),
                    cases,
                }))
            }
            Plan::Loop {
                body,
                max_iterations,
                ..
            } => {
                let body = inner(body)?;
                Op::Loop(Box::new(LoopOp {
                    asynchronous: asynchronous || body.is_async(),
                    step,
                    body,
                    max_iterations: *max_iterations,
                }))
            }
            Plan::Execute { .. }
            | Plan::Empty
            | Plan::Sequence(_)
            | Plan::Wave(_)
            | Plan::Remote { .. } => Op::Execute(step),
        })
    }

    /// The second pass: the tree of ops, built bottom up on an explicit stack.
    ///
    /// Each container's children go straight into a list of their exact number, which becomes
    /// the container's boxed slice without a copy: the tree is written once, into as much new
    /// memory as it takes — memory a first run touches for the first time, a page fault a page.
    pub(super) fn build(
        &self,
        plan: &Plan,
        liveness: &Liveness,
        placement: Option<&Placement>,
        policies: Option<&Policies>,
        depth: usize,
    ) -> Result<Op, ProgramError> {
        /// What a container being built is.
        enum Container {
            /// The list the root op goes into.
            Root,
            /// A sequence, by number.
            Sequence(u32),
            /// A wave, with its bounds so far.
            Wave(Vec<usize>),
        }
        /// A container being built, and its children so far.
        struct Building {
            children: Vec<Op>,
            container: Container,
        }
        let mut open = vec![Building {
            children: Vec::with_capacity(1),
            container: Container::Root,
        }];
        let (mut slot, mut read, mut sequences) = (0_usize, 0_usize, 0_u32);
        let resolved = Resolved {
            liveness,
            placement,
            policies,
            depth,
        };
        for visit in plan.own_visits() {
            match visit {
                Visit::Enter(entered) => {
                    let parent = open.last_mut().expect("the root stays open");
                    if let Container::Wave(bounds) = &mut parent.container {
                        bounds.push(slot);
                    }
                    match entered {
                        Plan::Empty => parent.children.push(Op::Empty),
                        Plan::Execute { from, .. }
                        | Plan::Map { from, .. }
                        | Plan::Switch { from, .. }
                        | Plan::Loop { from, .. } => {
                            let op = self.step_op(entered, from, slot, &mut read, &resolved)?;
                            parent.children.push(op);
                            slot += 1;
                        }
                        Plan::Sequence(children) => {
                            open.push(Building {
                                children: Vec::with_capacity(children.len()),
                                container: Container::Sequence(sequences),
                            });
                            sequences += 1;
                        }
                        Plan::Wave(children) => open.push(Building {
                            children: Vec::with_capacity(children.len()),
                            container: Container::Wave(Vec::with_capacity(children.len() + 1)),
                        }),
                        Plan::Remote { .. } => unreachable!("`Numbering::of` refuses a slice"),
                    }
                }
                Visit::Leave(
                    Plan::Empty
                    | Plan::Execute { .. }
                    | Plan::Remote { .. }
                    | Plan::Map { .. }
                    | Plan::Switch { .. }
                    | Plan::Loop { .. },
                ) => {}
                Visit::Leave(Plan::Sequence(_) | Plan::Wave(_)) => {
                    let built = open.pop().expect("entered before");
                    // Exactly as many as the plan has children: no copy, no spare room.
                    let children: Box<[Op]> = built.children.into_boxed_slice();
                    let asynchronous = children.iter().any(Op::is_async);
                    let op = match built.container {
                        Container::Sequence(number) => Op::Sequence {
                            drop_after: drops_after(&liveness.drops, number, children.len()),
                            steps: children,
                            asynchronous,
                        },
                        Container::Wave(mut bounds) => {
                            bounds.push(slot);
                            Op::Wave {
                                branches: children,
                                bounds: bounds.into(),
                                asynchronous,
                            }
                        }
                        Container::Root => unreachable!("the root is never left"),
                    };
                    open.last_mut()
                        .expect("the root stays open")
                        .children
                        .push(op);
                }
            }
        }
        let mut root = open.pop().expect("the root stays open").children;
        Ok(root.pop().expect("the root was built"))
    }
}
