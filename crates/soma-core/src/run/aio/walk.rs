//! The walk of the parts of a plan that hold an async node, as futures: each op a step of an
//! `async fn`, so that a branch waiting on a node's call is a parked future, not a blocked
//! thread.
//!
//! Only the *skeleton* is walked here — the ops that hold an async node somewhere inside
//! ([`Op::is_async`]). Every largest part without one — a sync step, a wave of sync branches,
//! a run of sync steps in a sequence — is a *piece*, handed whole to a thread of the program's
//! crew and walked there by the sync walk (its one entry for walks made from outside it,
//! `Executor::walk_from` in `run/sync`), exactly as a run without async nodes is walked; the
//! task waits for it without a thread of its own. A sync node therefore
//! never runs on the loop's thread, and a graph without an async node never comes here.
//!
//! Everything a step *means* — its cache lookup and filing, its observer's events, its span,
//! its policy's retries (`run/call.rs`), how a wave settles (`run/settle.rs`), whether its
//! branch must stop (`run/branch.rs`), how a `Map` reads its items and a `Switch` its case,
//! and whether either is found whole in the cache (`run/decision.rs`), in what order outputs
//! a hit left unread are read (`run/deferred.rs`) — lies on the floor both walks stand on,
//! called from here as the sync walk calls it; only the waiting differs. A wave's branches and a `Map`'s items are tasks of their own
//! ([`crate::Tasks::spawn`]), joined ([`Join`]); a case or an iteration runs inline, in the
//! task that reached its step, until [`INLINE_LEVELS`] of them nest, when the next runs as a
//! task of its own: no future's poll recurses deeper than that, however deep the plan.

use std::future::Future;
use std::ops::Range;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Instant;

use super::join::Join;
use super::limits::slots_of;
use super::place::{Place, Table, Window};
use super::task::{CatchUnwind, Task};
use crate::model::id::NodeId;
use crate::model::key::Key;
use crate::model::node::Ctx;
use crate::model::value::Value;
use crate::run::attempt::{next_attempt, stopped_pausing, Next};
use crate::run::branch::{Branch, Halt, Standing, WaveState};
use crate::run::call::{gather, NodeCall, Site};
use crate::run::decision;
use crate::run::deferred::Rereading;
use crate::run::error::RunError;
use crate::run::executor::Executor;
use crate::run::hooks::Watch;
use crate::run::keys::{Digested, ItemDigests, RunKeys};
use crate::run::latch::Delivery;
use crate::run::observer::{Ended, Part};
use crate::run::program::{LoopOp, MapOp, Op, Program, Step, SwitchOp};
use crate::run::settle::{settle, Outcome};
use crate::run::sync::Start;

/// How many cases and iterations nest inline in one task before the next runs as a task of its
/// own: each level is a few futures' polls deep, and a task's poll must not grow with the plan.
const INLINE_LEVELS: u32 = 32;

/// A part of the run's program, reached from a task that holds the run: the program outlives
/// every task of its run (`Run::program`), and its ops never move (they live in boxed slices,
/// or in the program itself, which an `Arc` holds in place).
struct At<T: ?Sized>(*const T);

impl<T: ?Sized> Clone for At<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: ?Sized> Copy for At<T> {}

// SAFETY: a program is `Sync`, and an `At` is only followed while its run's program is alive.
#[allow(unsafe_code)]
unsafe impl<T: Sync + ?Sized> Send for At<T> {}
// SAFETY: as for `Send`: an `At` only reads what it points to.
#[allow(unsafe_code)]
unsafe impl<T: Sync + ?Sized> Sync for At<T> {}

impl<T: ?Sized> At<T> {
    fn of(part: &T) -> Self {
        At(part)
    }

    /// The part; `_place` is the proof that the run is alive while it is used.
    fn get(self, _place: &Place) -> &T {
        // SAFETY: see the type's header; `_place` holds the run, and with it the program.
        #[allow(unsafe_code)]
        unsafe {
            &*self.0
        }
    }
}

/// A walk's future, boxed: the walk recurses through the plan's levels.
type Walking<'p> = Pin<Box<dyn Future<Output = Result<(), Halt>> + Send + 'p>>;

impl Place {
    /// Where a node's call is made from this place: its table's program and keys, the
    /// program's crew, the run's bookkeeping and this place's branch.
    fn site(&self) -> Site<'_> {
        Site {
            program: self.table.program(),
            keys: self.table.keys.as_ref(),
            crew: &self.run.program.crew,
            detached: Some(&self.run.detached),
            board: self.run.executor.run_board().map(|board| &**board),
            branch: &*self.branch,
        }
    }

    fn executor(&self) -> &Executor {
        &self.run.executor
    }

    /// What an async node's call that failed with `error` failed for: the run's deadline when
    /// the run is past it and its cancellation stopped the branch — the call ended by the
    /// cancellation the deadline sent (an observer reports it as timed out, not as the node's
    /// `CancelledError`) — and the node's own error otherwise.
    fn call_failed(&self, id: &NodeId, error: crate::NodeError) -> RunError {
        let deadline = self.executor().watch.as_deref().and_then(Watch::deadline);
        if self.branch.stopped() && deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return RunError::PastDeadline;
        }
        RunError::NodeFailed {
            node: id.clone(),
            error,
        }
    }

    /// The checks of a node boundary, as the sync walk's step makes them.
    fn boundary(&self) -> Result<(), Halt> {
        if self.branch.stopped() {
            return Err(Halt::Cancelled);
        }
        if self
            .executor()
            .watch
            .as_deref()
            .is_some_and(Watch::interrupted)
        {
            return Err(Halt::Failed(RunError::Interrupted));
        }
        Ok(())
    }
}

/// Walks `op` from `place`: the skeleton here, each piece on a crew thread.
fn walk<'p>(place: &'p Place, op: &'p Op) -> Walking<'p> {
    Box::pin(async move {
        if !op.is_async() {
            return piece(place, SyncPiece::Op(At::of(op))).await;
        }
        match op {
            Op::Empty => Ok(()),
            Op::Execute(step) => node(place, step).await,
            Op::Sequence {
                steps, drop_after, ..
            } => {
                let mut at = 0;
                while at < steps.len() {
                    // A run of sync steps is one piece: one hop to a thread and back, not one
                    // per step.
                    let end = if steps[at].is_async() {
                        match &steps[at] {
                            // The common step, awaited in this future rather than a box of
                            // its own: a chain of async nodes allocates no future per step.
                            Op::Execute(step) => node(place, step).await?,
                            other => walk(place, other).await?,
                        }
                        let done = at..at + 1;
                        drop_after_each(place, drop_after, done.clone());
                        done.end
                    } else {
                        let end = at + steps[at..].iter().take_while(|op| !op.is_async()).count();
                        piece(
                            place,
                            SyncPiece::Steps {
                                steps: At::of(&**steps),
                                drop_after: At::of(&**drop_after),
                                range: at..end,
                            },
                        )
                        .await?;
                        end
                    };
                    at = end;
                }
                Ok(())
            }
            Op::Wave {
                branches, bounds, ..
            } => wave(place, branches, bounds).await,
            Op::Map(map) => {
                let whole = [("body", &map.body)];
                run_decision(place, &map.step, Some(&whole), async {
                    Ok((each(place, map).await?, None))
                })
                .await
            }
            Op::Switch(switch) => {
                let whole: Vec<(&str, &Program)> = switch
                    .keys
                    .iter()
                    .map(String::as_str)
                    .zip(&*switch.cases)
                    .collect();
                run_decision(place, &switch.step, Some(&whole), async {
                    choose(place, switch).await
                })
                .await
            }
            // Never looked up whole, as in the sync walk: what a loop's body returns is keyed
            // by its nodes, one iteration at a time.
            Op::Loop(repeat) => {
                run_decision(place, &repeat.step, None, async {
                    repeat_body(place, repeat).await
                })
                .await
            }
        }
    })
}

/// Drops what a sequence drops after its children `done`, as the sync walk's sequence does.
fn drop_after_each(place: &Place, drop_after: &[Box<[usize]>], done: Range<usize>) {
    if done
        .clone()
        .all(|at| drop_after.get(at).is_none_or(|slots| slots.is_empty()))
    {
        return;
    }
    place.table.with_frame(&place.window, |frame| {
        for at in done {
            for &slot in drop_after.get(at).map_or(&[][..], |slots| &slots[..]) {
                *frame.cell(slot) = None;
            }
        }
    });
}

/// Sync work a piece lends a crew thread.
enum SyncPiece {
    /// A whole op.
    Op(At<Op>),
    /// Steps `range` of a sequence, with what it drops after each.
    Steps {
        steps: At<[Op]>,
        drop_after: At<[Box<[usize]>]>,
        range: Range<usize>,
    },
}

/// Runs `work` on a thread of the program's crew, walked by the sync walk in a copy of this
/// task's context (captured here, on the loop's thread), and waits for it without a thread.
async fn piece(place: &Place, work: SyncPiece) -> Result<(), Halt> {
    let piece = place.limits().and_then(|limits| {
        limits.piece(match &work {
            SyncPiece::Op(op) => slots_of(std::slice::from_ref(op.get(place))),
            SyncPiece::Steps { steps, range, .. } => slots_of(&steps.get(place)[range.clone()]),
        })
    });
    let _permit = match &piece {
        Some(permits) => Some(permits.acquire().await),
        None => None,
    };
    // Where the crew thread leaves the work's outcome for this task.
    let lent: Arc<Delivery<Outcome<()>>> = Arc::new(Delivery::new());
    let executor = place.executor();
    let job = {
        let (place, lent) = (place.clone(), Arc::clone(&lent));
        let captured = executor.host.as_ref().and_then(|host| host.capture());
        move || {
            let mut outcome = None;
            let mut run = || {
                outcome = Some(panic::catch_unwind(AssertUnwindSafe(|| {
                    let executor = place.executor();
                    let input = &place.table.input;
                    place.table.with_frame(&place.window, |frame| {
                        // The sync walk of this piece: the program's crew, this place's branch
                        // (for cancellation and spans), and the thread that must never be
                        // taken for the run's caller (the loop's, where the run began: no
                        // thread of a piece is the caller, so none polls the watch or gives
                        // up); never prefetching.
                        let start = Start {
                            crew: &place.run.program.crew,
                            caller: place.run.caller,
                            detached: Some(&place.run.detached),
                            awaited_by: Some(&place.branch),
                            program: place.table.program(),
                            keys: place.table.keys.as_ref(),
                            prefetching: false,
                            board: executor.run_board().map(|board| &**board),
                        };
                        match &work {
                            SyncPiece::Op(op) => executor.walk_from(
                                &start,
                                std::slice::from_ref(op.get(&place)),
                                &[],
                                0..1,
                                input,
                                frame,
                            ),
                            SyncPiece::Steps {
                                steps,
                                drop_after,
                                range,
                            } => executor.walk_from(
                                &start,
                                steps.get(&place),
                                drop_after.get(&place),
                                range.clone(),
                                input,
                                frame,
                            ),
                        }
                    })
                })));
            };
            match &captured {
                Some(captured) => captured.enter(&mut run),
                None => run(),
            }
            // Every borrow of the table ended with the frame: the task may go on.
            lent.deliver(outcome.expect("the context ran the work"));
        }
    };
    if let Err(refused) = place
        .run
        .program
        .crew
        .lend(vec![job], executor.host.as_ref())
    {
        return Err(Halt::Failed(RunError::NoThread {
            reason: refused.to_string(),
        }));
    }
    // Cancelled first, the task stops waiting: the work then stops at its next node boundary
    // (its lane sees the branch cancelled) or, stuck in a node, finishes in the background: it
    // owns all it uses, and its outcome is dropped, as a run's caller that gives up leaves a
    // node behind.
    match lent.arrival(|| place.branch.is_cancelled()).await {
        Some(outcome) => outcome.unwrap_or_else(|payload| panic::resume_unwind(payload)),
        None => Err(Halt::Cancelled),
    }
}

/// An async node's step: the sync walk's step, its call awaited.
async fn node(place: &Place, step: &Step) -> Result<(), Halt> {
    let _permit = match place.limits() {
        Some(limits) => Some(limits.step(step.slot()).acquire().await),
        None => None,
    };
    place.boundary()?;
    let site = place.site();
    let call = NodeCall::new(place.executor(), step, site);
    site.mark_running(step, true);
    let value = match site.keys {
        None => {
            let input = gathered(place, step);
            called(place, &call, step, &input).await.map_err(Halt::from)
        }
        Some(keys) => cached(place, keys, step, &call).await,
    };
    site.mark_running(step, false);
    let value = value?;
    place.table.with_frame(&place.window, |frame| {
        *frame.cell(step.slot()) = Some(value);
    });
    Ok(())
}

/// What `step` reads, gathered from the table as the sync walk gathers it.
fn gathered(place: &Place, step: &Step) -> Value {
    place.table.with_frame(&place.window, |frame| {
        gather(step, &place.table.input, frame)
    })
}

/// An async node's step in a run with a cache: found there, or called and filed, as the sync
/// walk's call does it.
async fn cached(
    place: &Place,
    keys: &RunKeys,
    step: &Step,
    call: &NodeCall<'_>,
) -> Result<Value, Halt> {
    let looked_up = place.table.with_frame(&place.window, |frame| {
        call.look_up(keys, &place.table.input, frame)
    });
    let key = match looked_up {
        Ok(found) => return Ok(found),
        Err(key) => key,
    };
    let started = Instant::now();
    let input = read_deferred(place, keys, step, gathered(place, step)).await?;
    let calling = keys.calling();
    let value = called(place, call, step, &input).await?;
    drop(calling);
    Ok(call.file(keys, key, value, started.elapsed()))
}

/// Calls an async node's step on `input`: under its policy when it has one, traced when the
/// run is.
async fn called(
    place: &Place,
    call: &NodeCall<'_>,
    step: &Step,
    input: &Value,
) -> Result<Value, RunError> {
    if step.has_policy() {
        return with_policy(place, call, step, input).await;
    }
    let opened = call.begin(0);
    let outcome = attempt(place, None, call, step, input).await;
    call.end(opened, &Ended::of(&outcome));
    outcome
}

/// One call of an async node, within `limit` if it has one, its span recorded when traced.
async fn attempt(
    place: &Place,
    limit: Option<std::time::Duration>,
    call: &NodeCall<'_>,
    step: &Step,
    input: &Value,
) -> Result<Value, RunError> {
    let id = call.id();
    let Some(trace) = place.executor().trace.as_deref() else {
        return within(place, limit, step, id, input).await;
    };
    let start = trace.now();
    let outcome = within(place, limit, step, id, input).await;
    call.record(trace, start, 1, &outcome);
    outcome
}

/// One call of an async node, interrupted at `limit` if it has one: a call that returns past
/// its limit — one that computed without ever waiting, so nothing could interrupt it — fails
/// with the limit all the same, never a late success.
async fn within(
    place: &Place,
    limit: Option<std::time::Duration>,
    step: &Step,
    id: &NodeId,
    input: &Value,
) -> Result<Value, RunError> {
    let executor = place.executor();
    if executor.turn_limit == 0 {
        // As a sync node's: with no turn, it gets no call.
        return Err(RunError::TurnLimit {
            node: id.clone(),
            limit: 0,
        });
    }
    // A time-limited call's context is its own, as the sync walk's is (on a lent thread).
    let ctx = Ctx::new(id, 0, &[])
        .on(step.device)
        .in_own_context(limit.is_some());
    let Some(limit) = limit else {
        return Arc::clone(&step.node)
            .start(input, &ctx)
            .await
            .map_err(|error| place.call_failed(id, error));
    };
    let started = Instant::now();
    let interrupt = place.run.tasks.interrupt_after(limit);
    let outcome = Arc::clone(&step.node).start(input, &ctx).await;
    if interrupt.fired() || started.elapsed() >= limit {
        return Err(RunError::TimeLimit {
            node: id.clone(),
            limit,
        });
    }
    outcome.map_err(|error| place.call_failed(id, error))
}

/// An async node's call under its policy: each attempt within its limit, retried as the policy
/// says ([`next_attempt`]), its pauses awaited on the loop and ended by a boundary's reasons to
/// stop.
async fn with_policy(
    place: &Place,
    call: &NodeCall<'_>,
    step: &Step,
    input: &Value,
) -> Result<Value, RunError> {
    let executor = place.executor();
    let policy = call.policy();
    let mut tried = 0_u32;
    loop {
        let opened = call.begin(tried);
        let outcome = attempt(place, policy.time_limit, call, step, input).await;
        let next = next_attempt(policy, tried, outcome);
        call.end(opened, &next.ended());
        let (pause, error) = match next {
            Next::Done(outcome) => return outcome,
            Next::Pause(pause, error) => (pause, error),
        };
        let mut sleep = place.run.tasks.sleep(pause);
        let stopping = || place.branch.stopped() || executor.stopped();
        let waited = std::future::poll_fn(|cx| {
            if stopping() {
                return Poll::Ready(false);
            }
            sleep.as_mut().poll(cx).map(|()| true)
        })
        .await;
        if !waited {
            return Err(stopped_pausing(place.branch.stopped(), error));
        }
        tried += 1;
    }
}

/// Runs a wave's branches as tasks of their own and settles their outcomes as the sync walk's
/// wave does: the first declared failure, a panic re-raised ahead of it. A failing branch
/// cancels the tasks of the branches declared after it, whose outcomes cannot be reported.
async fn wave(place: &Place, branches: &[Op], bounds: &[usize]) -> Result<(), Halt> {
    if let [only] = branches {
        return walk(place, only).await;
    }
    let state = Arc::new(WaveState::new());
    let join = Join::new(branches.len());
    for (index, (branch, window)) in branches.iter().zip(bounds.windows(2)).enumerate() {
        let child = Place {
            run: Arc::clone(&place.run),
            table: Arc::clone(&place.table),
            window: Arc::new(place.window.branch(bounds[0], window[0]..window[1])),
            branch: Branch::child(&place.branch, &state, index),
            depth: 0,
        };
        let (op, state, join_of_branch) = (At::of(branch), Arc::clone(&state), Arc::clone(&join));
        spawn(place, &join, index, child, move |child| {
            Box::pin(async move {
                let outcome = walk(child, op.get(child)).await;
                if matches!(&outcome, Err(halt) if halt.stops_later_branches()) {
                    state.fail(index);
                    join_of_branch.cancel_after(index);
                }
                outcome
            })
        });
    }
    settle(every(join.joined(&place.branch).await)).map(drop)
}

/// A wave's outcomes, every branch having reported.
fn every(outcomes: Vec<Option<Outcome<()>>>) -> impl Iterator<Item = Option<Outcome<()>>> {
    outcomes
        .into_iter()
        .map(|outcome| Some(outcome.expect("every branch of a wave reports")))
}

/// Starts `child`'s walk — `walking` from it — as task `index` of `join`. A panic is its
/// outcome; the task lets go of its place before it reports, so that whoever waits on the
/// join finds the table held by nobody else.
fn spawn<W>(place: &Place, join: &Arc<Join>, index: usize, child: Place, walking: W)
where
    W: for<'p> FnOnce(&'p Place) -> Walking<'p> + Send + 'static,
{
    let branch = Arc::clone(&child.branch);
    let reported = Arc::clone(join);
    let task = Task::new(branch, async move {
        let outcome: Outcome<()> = CatchUnwind(Box::pin(walking(&child))).await;
        drop(child);
        reported.report(index, outcome);
    });
    match place.run.tasks.spawn(task) {
        Ok(spawned) => join.keep(index, spawned),
        Err(reason) => join.report(index, Ok(Err(Halt::Failed(RunError::NoTask { reason })))),
    }
}

/// A `Map`, `Switch` or `Loop` step: with a cache, looked up as a whole first when it runs
/// `whole` (a `Map`'s body, a `Switch`'s cases; [`Executor::decision_found`], as the sync walk
/// looks it up), its input then left unread and `work` never started; otherwise its `work`
/// awaited, the step marked running meanwhile, its output written and its digest settled (and
/// filed under the key it missed whole under) as the sync walk's `run_decision` does.
async fn run_decision(
    place: &Place,
    step: &Step,
    whole: Option<&[(&str, &Program)]>,
    work: impl Future<Output = Result<(Value, Option<Key>), Halt>>,
) -> Result<(), Halt> {
    let _permit = match place.limits() {
        Some(limits) => Some(limits.step(step.slot()).acquire().await),
        None => None,
    };
    let site = place.site();
    if let Some(programs) = whole {
        let found = place.table.with_frame(&place.window, |frame| {
            place
                .executor()
                .decision_found(step, programs, &place.table.input, frame, site)
        });
        if found {
            return Ok(());
        }
    }
    site.mark_running(step, true);
    let value = work.await;
    site.mark_running(step, false);
    let value = value?;
    place.table.with_frame(&place.window, |frame| {
        decision::write(
            step,
            &site.program.ids[step.slot()],
            value,
            frame,
            site.keys,
        );
    });
    Ok(())
}

/// What a step that decides reads, after the boundary checks, as the sync walk reads it.
async fn decision_input(place: &Place, step: &Step) -> Result<Value, Halt> {
    let gathered = place.table.with_frame(&place.window, |frame| {
        place
            .executor()
            .decision_gathered(step, &place.table.input, frame, place.site())
    })?;
    match place.table.keys.as_ref() {
        Some(keys) => Ok(read_deferred(place, keys, step, gathered).await?),
        None => Ok(gathered),
    }
}

/// `gathered`, what `step` reads, with each output in it found in the cache and left unread
/// read now, in the order the floor reads them ([`Rereading`]): one whose entry is gone is
/// computed again by its node — an async node awaited, under its policy, a sync one called
/// here as a sync reader would call it — and filed again.
async fn read_deferred(
    place: &Place,
    keys: &RunKeys,
    step: &Step,
    gathered: Value,
) -> Result<Value, RunError> {
    let mut rereading = match Rereading::of(step, gathered) {
        Ok(gathered) => return Ok(gathered),
        Err(rereading) => rereading,
    };
    let site = place.site();
    while let Some(again) = rereading.next() {
        let step = again.step(site.program);
        let call = NodeCall::new(place.executor(), step, site);
        let started = Instant::now();
        let calling = keys.calling();
        let value = if step.is_async() {
            called(place, &call, step, &again.input).await?
        } else {
            call.call(&again.input)?
        };
        drop(calling);
        rereading.computed(again.file(keys, site.program, value, started.elapsed()));
    }
    Ok(rereading.read())
}

/// Runs `body` on `input` with a table of its own, as the sync walk's `run_body` does (its
/// input's identity `digested` when taken already): inline in this task, or as a task of its
/// own once [`INLINE_LEVELS`] nest here. With what it returns, its digest when the run took it
/// already ([`RunKeys::result_digest`]).
async fn run_body(
    place: &Place,
    body: &Program,
    input: Value,
    digested: Option<Key>,
) -> Result<(Value, Option<Digested>), Halt> {
    let keys = place
        .table
        .keys
        .as_ref()
        .map(|outer| outer.within(body, digested));
    let inner = Place {
        run: Arc::clone(&place.run),
        table: Arc::new(Table::new(body, input, keys)),
        window: Arc::new(Window::whole(body.len())),
        branch: Arc::clone(&place.branch),
        depth: place.depth + 1,
    };
    let table = Arc::clone(&inner.table);
    if inner.depth < INLINE_LEVELS {
        walk(&inner, &body.root).await?;
        drop(inner);
    } else {
        // Deep: as a task of its own, joined at once, so that this task's poll stays shallow.
        let join = Join::new(1);
        let fresh = Place { depth: 0, ..inner };
        let root = At::of(&body.root);
        spawn(place, &join, 0, fresh, move |fresh| {
            walk(fresh, root.get(fresh))
        });
        settle(every(join.joined(&place.branch).await))?;
    }
    let input = &table.input;
    let whole = Window::whole(body.len());
    let digest = table
        .keys
        .as_ref()
        .and_then(|keys| keys.result_digest(body));
    // Every task and piece of the body has ended: the whole table is this task's now.
    let value = table.with_frame(&whole, |frame| {
        Executor::result(body, frame.own, || input.clone())
    });
    Ok((value, digest))
}

/// An item's result, once its task has one.
type ItemResult = Mutex<Option<Result<Value, Halt>>>;

/// A `Map` step with an async node inside: its items as tasks, at most `in_flight` at once, as
/// the sync walk's items are branches; settled as the sync walk settles them ([`settle`]). A failing item cancels the tasks of the items after it, and
/// those not started never start.
async fn each(place: &Place, op: &MapOp) -> Result<Value, Halt> {
    let read = decision_input(place, &op.step).await?;
    let executor = place.executor();
    let id = &place.table.program().ids[op.step.slot()];
    let items = executor.items_of(id, &read)?;
    drop(read);
    let count = items.len();
    if count == 0 {
        return Ok(executor.reading().collect(Vec::new()));
    }
    let bound = op.in_flight.unwrap_or(count).clamp(1, count);
    // Each item's digest, taken with the list's when nothing ran since.
    let digests = ItemDigests::new(place.table.keys.as_ref(), &op.step, count, bound == count);
    let state = Arc::new(WaveState::new());
    let join = Join::new(count);
    let results: Arc<[ItemResult]> = (0..count).map(|_| Mutex::new(None)).collect();
    let (body, id_at) = (At::of(&op.body), At::of(id));
    let mut items = items.into_iter();
    let start = |index: usize, item: Value| {
        let digested = digests.of(index);
        let child = Place {
            run: Arc::clone(&place.run),
            table: Arc::clone(&place.table),
            window: Arc::clone(&place.window),
            branch: Branch::child(&place.branch, &state, index),
            depth: 0,
        };
        let (results, state) = (Arc::clone(&results), Arc::clone(&state));
        let join_of_item = Arc::clone(&join);
        spawn(place, &join, index, child, move |child| {
            Box::pin(async move {
                let (executor, id) = (child.executor(), id_at.get(child));
                let under_way = executor.part_begins(id, Part::Item(index), || child.branch.path());
                let outcome = run_body(child, body.get(child), item, digested)
                    .await
                    .map(|(value, _)| value);
                executor.part_ends(id, under_way, || child.branch.path(), &outcome);
                if matches!(&outcome, Err(halt) if halt.stops_later_branches()) {
                    state.fail(index);
                    join_of_item.cancel_after(index);
                }
                *results[index]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(outcome);
                Ok(())
            })
        });
    };
    let mut started = 0;
    while started < count {
        if started >= bound {
            // Bounded: an item that ends makes room for the next.
            join.more_than(&place.branch, started - bound).await;
        }
        if state.any_failed() || place.branch.stopped() {
            break;
        }
        start(started, items.next().expect("an item for each index"));
        started += 1;
    }
    drop(items);
    for _ in started..count {
        join.skip();
    }
    let outcomes = join.joined(&place.branch).await;
    // An item's task reports nothing of its own but a panic, or that it never got a task.
    let ended = outcomes
        .into_iter()
        .zip(results.iter())
        .map(|(joined, result)| {
            let result = result.lock().unwrap_or_else(PoisonError::into_inner).take();
            match joined {
                Some(Ok(Ok(()))) | None => result.map(Ok),
                Some(Ok(Err(halt))) => Some(Ok(Err(halt))),
                Some(Err(payload)) => Some(Err(payload)),
            }
        });
    let values: Vec<Value> = settle::<Value>(ended)?;
    Ok(executor.reading().collect(values))
}

/// A `Switch` step with an async node inside: its selector called (awaited when async), the
/// case it names run inline, keyed on the step's input's digest when nothing ran since it was
/// taken; its result, with its digest when the case took it (as the sync walk's switch).
async fn choose(place: &Place, op: &SwitchOp) -> Result<(Value, Option<Key>), Halt> {
    let read = decision_input(place, &op.step).await?;
    let executor = place.executor();
    let id = &place.table.program().ids[op.step.slot()];
    let chosen = ask(place, &op.step, &read, Asked::Input).await?;
    let (at, key) = executor.case_of(op, id, &chosen)?;
    let keys = place.table.keys.as_ref();
    let given = keys.and_then(|keys| keys.read_digest(&op.step));
    let under_way = executor.part_begins(id, Part::Case(&key), || place.branch.path());
    let (outcome, digest) = parted(run_body(place, &op.cases[at], read, given).await);
    executor.part_ends(id, under_way, || place.branch.path(), &outcome);
    Ok((outcome?, keys.and_then(|keys| keys.still(digest))))
}

/// What `run_body` returned, and its digest apart.
fn parted(
    outcome: Result<(Value, Option<Digested>), Halt>,
) -> (Result<Value, Halt>, Option<Digested>) {
    match outcome {
        Ok((value, digest)) => (Ok(value), digest),
        Err(halt) => (Err(halt), None),
    }
}

/// A `Loop` step with an async node inside: its body inline, iteration after iteration, until
/// its predicate (awaited when async) says done; each iteration's input's digest, its output's
/// for the predicate and the step's output's taken once where nothing ran between (as the sync
/// walk's loop).
async fn repeat_body(place: &Place, op: &LoopOp) -> Result<(Value, Option<Key>), Halt> {
    let mut current = decision_input(place, &op.step).await?;
    let executor = place.executor();
    let id = &place.table.program().ids[op.step.slot()];
    let keys = place.table.keys.as_ref();
    let still = |digest| keys.and_then(|keys: &RunKeys| keys.still(digest));
    let mut given = keys.and_then(|keys| keys.read_digest(&op.step));
    for iteration in 0..op.max_iterations {
        let under_way =
            executor.part_begins(id, Part::Iteration(iteration), || place.branch.path());
        let (outcome, digest) = parted(run_body(place, &op.body, current, given).await);
        executor.part_ends(id, under_way, || place.branch.path(), &outcome);
        let output = outcome?;
        let verdict = ask(place, &op.step, &output, Asked::Output(still(digest))).await?;
        if executor.reading().done(&verdict) {
            return Ok((output, still(digest)));
        }
        given = still(digest);
        current = output;
    }
    Err(executor.loop_limit(op, id, &current).into())
}

/// What a selector or predicate is keyed on: the step's input (a switch), or the value it is
/// asked about (a loop's body output), with its digest when the body took it already.
#[derive(Clone, Copy)]
enum Asked {
    Input,
    Output(Option<Key>),
}

/// Calls a step's own node — a switch's selector, a loop's predicate — on `value`, through the
/// cache as the sync walk's `decision_call` does: a sync one inline on the loop's thread (it
/// only decides, as quick as the callable it wraps), an async one awaited.
async fn ask(place: &Place, step: &Step, value: &Value, asked: Asked) -> Result<Value, Halt> {
    let executor = place.executor();
    let site = place.site();
    let input = &place.table.input;
    let key = |keys: &RunKeys, id: &NodeId, fingerprint: &Key| match asked {
        Asked::Input => keys.key_of(id, fingerprint, step, input),
        Asked::Output(digested) => keys.key_on(id, fingerprint, step, (value, digested)),
    };
    if !step.node.is_async() {
        return Ok(executor.decision_call(step, value, site, key)?);
    }
    let call = NodeCall::new(executor, step, site);
    let id = call.id();
    let keyed = site.keys.and_then(|keys| {
        let fingerprint = keys.cache.fingerprint(id, &*step.node)?;
        Some((keys, key(keys, id, &fingerprint)?))
    });
    if let Some((keys, key)) = &keyed {
        if let Some(entry) = keys.cache.get(id, key) {
            call.mark_cached();
            return Ok(entry.value);
        }
    }
    let started = Instant::now();
    let calling = site.keys.map(RunKeys::calling);
    let value = called(place, &call, step, value).await?;
    drop(calling);
    Ok(match keyed {
        Some((keys, key)) => decision::file_answer(keys, id, &key, value, started.elapsed()),
        None => value,
    })
}

/// The walk of a whole run: its root op from `place`, the run's own table whole.
pub(crate) async fn walk_root(place: &Place) -> Result<(), Halt> {
    let root = &place.table.program().root;
    walk(place, root).await
}
