//! `distribute`: a compiled plan cut into remote slices, one per largest subtree on one host.
//!
//! Distribution is a step of its own after [`crate::compile()`], not part of it: compiling
//! decides what may run at the same time, from the graph alone; distributing decides where,
//! from a [`HostPlacement`] beside it. Keeping them apart keeps the plan of a graph without
//! hosts exactly what it was, and lets a transport (Ray, or another) be the only thing that
//! knows what a host is.
//!
//! A subtree is *on* host `h` when every step in it is placed on `h` (an `Empty` is on any
//! host); the distributed plan wraps each largest such subtree in one [`Plan::Remote`], so a
//! slice is one trip there and back. In a `Sequence` that is not on one host as a whole, the
//! consecutive steps on the same host are merged into one slice as well (`a@h >> b@h >> c`
//! makes one trip for `a` and `b`); the branches of a `Wave` are not, since a wave's branches
//! run at the same time, and two slices on one host are free to as well.
//!
//! Steps and their order are untouched: `distribute(p, hosts).steps() == p.steps()`, and a plan
//! with no host in it comes back equal to itself. The walk is bottom up on a stack of its own:
//! no recursion, however deep the plan.

use crate::model::host::{HostName, HostPlacement};
use crate::plan::{Plan, Visit};

/// Where a finished subtree lives, as far as slicing it goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lives<'h> {
    /// No step at all: it goes wherever its neighbours go.
    Anywhere,
    /// Every step on this host.
    On(&'h HostName),
    /// Some step runs locally, or steps on different hosts: not one slice.
    Split,
}

impl<'h> Lives<'h> {
    fn and(self, other: Lives<'h>) -> Lives<'h> {
        match (self, other) {
            (Lives::Anywhere, other) | (other, Lives::Anywhere) => other,
            (Lives::On(a), Lives::On(b)) if a == b => Lives::On(a),
            (Lives::On(_) | Lives::Split, Lives::On(_) | Lives::Split) => Lives::Split,
        }
    }
}

fn remote(host: &HostName, inner: Plan) -> Plan {
    Plan::Remote {
        host: host.clone(),
        inner: Box::new(inner),
    }
}

/// `plan` with every largest subtree whose steps are all placed on one host wrapped as one
/// [`Plan::Remote`] slice for that host, and consecutive same-host steps of a sequence merged
/// into one slice. Slices already in `plan` are cut again from `hosts`, so distributing twice
/// is distributing once.
///
/// ```
/// use soma_core::{compile, distribute, node, HostPlacement, NodeError, Value};
/// let pass = |x: &Value| -> Result<Value, NodeError> { Ok(x.clone()) };
/// let (graph, catalog) = (node("a", pass) >> node("b", pass) >> node("c", pass)).somatize()?;
/// let plan = compile(&graph, &catalog)?;
/// let mut hosts = HostPlacement::new();
/// hosts.place("a", "gpu-box".parse()?);
/// hosts.place("b", "gpu-box".parse()?);
/// assert_eq!(
///     distribute(&plan, &hosts).compact(),
///     "Sequence([Remote@gpu-box(Sequence([Execute(a), Execute(b)])), Execute(c)])"
/// );
/// assert_eq!(distribute(&plan, &HostPlacement::new()), plan);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Complexity
/// O(size of the plan), with one host lookup per step.
pub fn distribute(plan: &Plan, hosts: &HostPlacement) -> Plan {
    if hosts.is_empty() {
        return plan.clone();
    }
    // The subtrees finished whose parent is not: a parent's are the last of them.
    let mut done: Vec<(Plan, Lives<'_>)> = Vec::new();
    for visit in plan.own_visits() {
        match visit {
            Visit::Enter(Plan::Empty) => done.push((Plan::Empty, Lives::Anywhere)),
            // What a decision runs goes with the step, wherever its own node is placed (the
            // Python front refuses a host on it, or on a node inside, naming the node; its
            // async walk places it whole, with the other sync steps, on the engine).
            Visit::Enter(
                decision @ (Plan::Map { node, .. }
                | Plan::Switch { node, .. }
                | Plan::Loop { node, .. }),
            ) => {
                let lives = hosts.host(node.as_str()).map_or(Lives::Split, Lives::On);
                done.push((decision.clone(), lives));
            }
            Visit::Enter(Plan::Execute { node, from }) => {
                let lives = hosts.host(node.as_str()).map_or(Lives::Split, Lives::On);
                let step = Plan::Execute {
                    node: node.clone(),
                    from: from.clone(),
                };
                done.push((step, lives));
            }
            // A slice already there is cut again from `hosts`: its subtree stands for it.
            Visit::Enter(Plan::Sequence(_) | Plan::Wave(_) | Plan::Remote { .. })
            | Visit::Leave(
                Plan::Empty
                | Plan::Execute { .. }
                | Plan::Remote { .. }
                | Plan::Map { .. }
                | Plan::Switch { .. }
                | Plan::Loop { .. },
            ) => {}
            Visit::Leave(Plan::Sequence(children)) => {
                let parts = done.split_off(done.len() - children.len());
                done.push(sequence(parts));
            }
            Visit::Leave(Plan::Wave(children)) => {
                let parts = done.split_off(done.len() - children.len());
                done.push(wave(parts));
            }
        }
    }
    match done.pop().expect("the walk leaves the root last") {
        (plan, Lives::On(host)) => remote(host, plan),
        (plan, Lives::Anywhere | Lives::Split) => plan,
    }
}

/// A finished sequence: whole, if it lives on one host (its parent decides whether to wrap it);
/// else its runs of consecutive steps on one host, each one slice.
fn sequence(parts: Vec<(Plan, Lives<'_>)>) -> (Plan, Lives<'_>) {
    let lives = parts
        .iter()
        .fold(Lives::Anywhere, |lives, &(_, part)| lives.and(part));
    if lives != Lives::Split {
        return (
            Plan::Sequence(parts.into_iter().map(|(p, _)| p).collect()),
            lives,
        );
    }
    let mut steps: Vec<Plan> = Vec::with_capacity(parts.len());
    // The run of steps on one host being gathered.
    let mut run: Option<(&HostName, Vec<Plan>)> = None;
    for (part, lives) in parts {
        let host = match lives {
            Lives::On(host) => Some(host),
            Lives::Anywhere | Lives::Split => None,
        };
        match (&mut run, host) {
            (Some((open, gathered)), Some(host)) if *open == host => gathered.push(part),
            (_, host) => {
                if let Some((open, gathered)) = run.take() {
                    steps.push(slice(open, gathered));
                }
                match host {
                    Some(host) => run = Some((host, vec![part])),
                    None => steps.push(part),
                }
            }
        }
    }
    if let Some((open, gathered)) = run {
        steps.push(slice(open, gathered));
    }
    (Plan::Sequence(steps), Lives::Split)
}

/// One slice of consecutive steps of a sequence, all on `host`.
fn slice(host: &HostName, mut steps: Vec<Plan>) -> Plan {
    if steps.len() == 1 {
        remote(host, steps.pop().expect("one step"))
    } else {
        remote(host, Plan::Sequence(steps))
    }
}

/// A finished wave: whole, if it lives on one host; else each branch that does, its own slice.
fn wave(parts: Vec<(Plan, Lives<'_>)>) -> (Plan, Lives<'_>) {
    let lives = parts
        .iter()
        .fold(Lives::Anywhere, |lives, &(_, part)| lives.and(part));
    let branches = parts
        .into_iter()
        .map(|(part, branch)| match (lives, branch) {
            (Lives::Split, Lives::On(host)) => remote(host, part),
            (Lives::Split | Lives::Anywhere | Lives::On(_), _) => part,
        });
    (Plan::Wave(branches.collect()), lives)
}
