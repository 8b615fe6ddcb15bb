//! One node's call, as both walks make it: gather what its step reads, ask the run's cache,
//! tell the observer and the trace, call the node (under its policy: each attempt within its
//! time limit, retried as its retry says), and file what it computed.
//!
//! Written once, below both walks: the sync walk makes a whole call here ([`NodeCall::make`]);
//! the async walk, whose node is awaited, makes the same call from the same pieces — the
//! lookup ([`NodeCall::look_up`]), the observer's begin and end ([`NodeCall::begin`]), the
//! span ([`NodeCall::record`]), the retry's decision ([`next_attempt`]), the filing
//! ([`NodeCall::file`]) — and only awaits where the sync walk blocks. A call takes what it
//! needs of the walk that makes it — the program its step is in, the run's keys, the crew a
//! time-limited call is lent to, and its branch, to stop and to name in spans — as a
//! [`Site`], and names neither walk. A new hook into "a node's call" (a run's journal saying
//! a node finished under its key, say) plugs in here, once, for every kind of run.
//!
//! A time-limited call runs on a thread lent by the program's crew while the branch's thread
//! waits with the limit as its deadline, the host's hold (the GIL) given up meanwhile, as
//! `forward(timeout=)` runs a whole plan ([`crate::Executor::run_detachable`]). What the call
//! reads is owned by it — the node, its input and its id are reference-counted, the context it
//! runs in is a copy captured for it — so a call left to finish borrows nothing that can go
//! away under it. What such a call sets in that context is its own: the nodes after it do not
//! see it.

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::attempt::{next_attempt, stopped_pausing, Next};
use super::board::{Board, Record};
use super::branch::{Halt, Standing};
use super::cache::{Entry, Found};
use super::crew::Crew;
use super::detach::Detached;
use super::error::RunError;
use super::executor::Executor;
use super::hooks::Watch;
use super::keys::RunKeys;
use super::latch::{wait_watching, Delivery, Waited};
use super::observer::{Begun, Ended, Opened};
use super::policy::Policy;
use super::program::{Program, Read, Reads, Step};
use super::table::Frame;
use super::trace::{thread_number, Span, Trace};
use crate::model::device::Device;
use crate::model::id::NodeId;
use crate::model::key::Key;
use crate::model::node::{Ctx, Node, NodeError, Transition};
use crate::model::value::Value;

/// Where a node's call is made, as much of the walk that makes it as a call needs: the
/// program its step is in (its ids and policies) with that program's cache keys, the crew a
/// time-limited call is lent to, the run's bookkeeping for a caller that may leave, and the
/// branch the call is made in.
#[derive(Clone, Copy)]
pub(super) struct Site<'s> {
    pub(super) program: &'s Program,
    pub(super) keys: Option<&'s RunKeys>,
    pub(super) crew: &'s Crew,
    pub(super) detached: Option<&'s Detached>,
    /// The board the run keeps its nodes' states on, if it keeps one.
    pub(super) board: Option<&'s Board>,
    pub(super) branch: &'s dyn Standing,
}

impl Site<'_> {
    /// Marks `step` running, or no longer, in a run that keeps which nodes run (one its caller
    /// may leave names them when it gives up).
    pub(super) fn mark_running(&self, step: &Step, running: bool) {
        if let Some(run) = self.detached {
            run.set_running(
                self.program,
                step.slot(),
                &self.program.ids[step.slot()],
                running,
            );
        }
    }
}

/// One node's call: its step, its id, the executor whose hooks it tells, and its [`Site`].
pub(super) struct NodeCall<'c> {
    executor: &'c Executor,
    step: &'c Step,
    id: &'c NodeId,
    site: Site<'c>,
}

impl<'c> NodeCall<'c> {
    /// The call of `step`'s node made by `executor` at `site`.
    #[inline]
    pub(super) fn new(executor: &'c Executor, step: &'c Step, site: Site<'c>) -> Self {
        NodeCall {
            executor,
            step,
            id: &site.program.ids[step.slot()],
            site,
        }
    }

    /// The node's id.
    pub(super) fn id(&self) -> &'c NodeId {
        self.id
    }

    /// The node's policy; only for a step marked as having one.
    pub(super) fn policy(&self) -> &'c Policy {
        self.site.program.policies[self.step.slot()]
            .as_deref()
            .expect("a step marked as having a policy has one")
    }

    /// The whole call, as the sync walk makes it: through the cache when the run has one,
    /// otherwise its inputs gathered from `frame` and its node called on them.
    // Inlined into the walk, with what it calls on the way of a plain run: a call of its own
    // stores the whole `NodeCall` and its `Site` on the stack for every node.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(super) fn make(&self, input: &Value, frame: &mut Frame<'_>) -> Result<Value, Halt> {
        match self.site.keys {
            None => self.gather_and_call(input, frame),
            Some(keys) => self.through_cache(keys, input, frame),
        }
    }

    /// Gathers the step's inputs from the table and calls its node on them.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn gather_and_call(&self, input: &Value, frame: &mut Frame<'_>) -> Result<Value, Halt> {
        // Each arm drops what it gathered as soon as the node is done with it.
        let value = match &self.step.from {
            Reads::Input => self.call(input)?,
            Reads::One(one) => {
                let mut read = frame.gather(*one);
                self.call_taking(&mut read)?
            }
            Reads::Many(many) => {
                let pairs = many
                    .reads
                    .iter()
                    .map(|(source, read)| (source.shared(), frame.gather(*read)))
                    .collect::<Vec<_>>();
                self.call(&Value::Map(pairs.into()))?
            }
        };
        Ok(value)
    }

    /// The call in a run with a cache: its output from the cache when its key is there (the
    /// values it would have taken are dropped unread), otherwise from its node, filed under
    /// its key with its digest. Either way the identity of its output — its digest, or its key
    /// where it has none — is recorded for the steps that read it.
    // Kept out of line: a run without a cache should not carry its code through every step.
    #[cold]
    #[inline(never)]
    fn through_cache(
        &self,
        keys: &RunKeys,
        input: &Value,
        frame: &mut Frame<'_>,
    ) -> Result<Value, Halt> {
        let key = match self.look_up(keys, input, frame) {
            Ok(found) => return Ok(found),
            Err(key) => key,
        };
        let started = Instant::now();
        let gathered = gather(self.step, input, frame);
        let gathered = self
            .executor
            .read_deferred(keys, self.step, gathered, self.site)?;
        let calling = keys.calling();
        let value = self.call(&gathered)?;
        drop(calling);
        drop(gathered);
        Ok(self.file(keys, key, value, started.elapsed()))
    }

    /// Looks the call up in the run's cache: `Ok` with its output when its key is there (the
    /// values it would have taken dropped unread, its span marked cached, its identity
    /// settled) — left unread where only nodes read it ([`RunKeys::deferrable`]) and it read
    /// nothing this run computed, with what it would have taken kept instead — `Err` with its
    /// key (if it has one) when it must run.
    pub(super) fn look_up(
        &self,
        keys: &RunKeys,
        input: &Value,
        frame: &mut Frame<'_>,
    ) -> Result<Value, Option<Key>> {
        let (step, id) = (self.step, self.id);
        let key = keys
            .cache
            .fingerprint(id, &*step.node)
            .and_then(|fingerprint| keys.key_of(id, &fingerprint, step, input));
        let Some(key) = key else {
            return Err(None);
        };
        if keys.deferrable(step.slot()) && Executor::reads_nothing_computed(step, frame) {
            // Only nodes read it: its output is read when one of them runs, if one does.
            match keys.cache.find(id, &key) {
                Some(Found::Unread(found)) => {
                    keys.settle(step.slot(), Some(found.digest.unwrap_or(key)));
                    let deferred = Executor::defer(step, key, found, input, frame);
                    self.mark_cached();
                    return Ok(deferred);
                }
                Some(Found::Read(entry)) => {
                    self.skip(frame);
                    keys.settle(step.slot(), Some(entry.digest.unwrap_or(key)));
                    return Ok(entry.value);
                }
                None => {}
            }
        } else if let Some(entry) = keys.cache.get(id, &key) {
            self.skip(frame);
            keys.settle(step.slot(), Some(entry.digest.unwrap_or(key)));
            return Ok(entry.value);
        }
        Err(Some(key))
    }

    /// Files what the node computed, `value` in `took`, under its `key` if it has one, and
    /// settles the identity readers key on: its digest, so that an output computed again the
    /// same leaves them hitting; its key where it has no digest.
    pub(super) fn file(
        &self,
        keys: &RunKeys,
        key: Option<Key>,
        value: Value,
        took: Duration,
    ) -> Value {
        let digest = keys.digest_output(self.step.slot(), &value);
        if let Some(key) = key {
            let entry = Entry { value, digest };
            keys.cache.put(self.id, &key, &entry, took);
            keys.settle(self.step.slot(), digest.or(Some(key)));
            return entry.value;
        }
        keys.settle(self.step.slot(), digest);
        value
    }

    /// What a call found in the cache leaves undone: it drops the values it would have taken
    /// (their last reader in the branch, it would have dropped them after its call) and marks
    /// its span cached in the trace.
    fn skip(&self, frame: &mut Frame<'_>) {
        let mut drop_taken = |read: &Read| {
            if read.take {
                drop(frame.take(read.slot()));
            }
        };
        match &self.step.from {
            Reads::Input => {}
            Reads::One(one) => drop_taken(one),
            Reads::Many(many) => many.reads.iter().for_each(|(_, read)| drop_taken(read)),
        }
        self.mark_cached();
    }

    /// Records, when the run is traced, that the node was found in the cache: a span marked
    /// cached, of no length; and tells the observer, when there is one.
    pub(super) fn mark_cached(&self) {
        if let Some(trace) = self.executor.trace.as_deref() {
            let now = trace.now();
            trace.record(Span {
                node: self.id.clone(),
                start: now,
                end: now,
                thread: thread_number(),
                branch: self.site.branch.path(),
                turns: 0,
                error: None,
                device: self.step.device,
                host: None,
                cached: true,
                part_of: None,
            });
        }
        if let Some(board) = self.site.board {
            board.cached(self.site.program, self.step.slot());
        } else if let Some(observer) = self.executor.observer.as_deref() {
            let opened = observer.begin(&Begun::Cached {
                node: self.id,
                device: self.step.device,
                branch: &self.site.branch.path(),
            });
            observer.end(opened, &Ended::Returned);
        }
    }

    /// Tells the observer, when there is one, that attempt `attempt` of the call begins: what
    /// it opened, for [`Executor::end_work`].
    pub(super) fn begin(&self, attempt: u32) -> Option<Opened> {
        if let Some(board) = self.board() {
            board.began(self.site.program, self.step.slot(), attempt);
            return None;
        }
        self.tell_begun(attempt, None)
    }

    /// The board the call's states go to: the run's, for a node that is not awaited (an async
    /// node's call is told the observer, which names the task it runs in).
    #[inline]
    fn board(&self) -> Option<&'c Board> {
        let board = self.site.board?;
        (!self.step.is_async()).then_some(board)
    }

    /// Tells the observer, when there is one, that attempt `attempt` of the call begins, or,
    /// told only as it failed, began `began` seconds after its run's board was made.
    fn tell_begun(&self, attempt: u32, began: Option<f64>) -> Option<Opened> {
        let observer = self.executor.observer.as_deref()?;
        Some(observer.begin(&Begun::Call {
            node: self.id,
            attempt,
            device: self.step.device,
            branch: &self.site.branch.path(),
            awaited: self.step.is_async(),
            described: self.step.node.described(),
            began,
        }))
    }

    /// Ends the attempt [`NodeCall::begin`] began (`opened`, what it returned) as `ended`: on
    /// the run's board when it has one, where a failure is told the observer too, begun and
    /// ended at once, for what only the observer has of it (its traceback).
    pub(super) fn end(&self, opened: Option<Opened>, ended: &Ended<'_>) {
        let Some(board) = self.board() else {
            return self.executor.end_work(opened, ended);
        };
        let (attempt, began) = board.ended(self.site.program, self.step.slot(), ended.state());
        if let Ended::Failed { .. } = ended {
            self.tell_failed(attempt, began, ended);
        }
    }

    /// Tells the observer of a failed attempt the board keeps, begun `began` seconds after
    /// the board was made: begun and ended at once, for what only the observer has of it.
    #[cold]
    #[inline(never)]
    fn tell_failed(&self, attempt: u32, began: f64, ended: &Ended<'_>) {
        let opened = self.tell_begun(attempt, Some(began));
        self.executor.end_work(opened, ended);
    }

    /// Begins the first attempt of a call `board` keeps: the board and the call's record.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn begin_on_board<'b>(&self, board: &'b Board) -> Option<(&'b Board, &'b Record)> {
        let record = board.record(self.site.program, self.step.slot())?;
        Board::begin(record, 0);
        Some((board, record))
    }

    /// Ends the attempt of a call its run's board keeps (`on`, the board and the call's
    /// record), which `outcome` ended: the observer is told of it only if it failed.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn end_on_board(on: (&Board, &Record), outcome: &Result<Value, RunError>, call: &Self) {
        let (board, record) = on;
        match outcome {
            Ok(_) => Board::first_returned(record),
            Err(error) => call.failed_on_board(board, record, error),
        }
    }

    /// The attempt of a call its run's board keeps (`record` on `board`) failed with `error`:
    /// on the board, and told the observer, for what only it has of the failure.
    #[cold]
    #[inline(never)]
    fn failed_on_board(&self, board: &Board, record: &Record, error: &RunError) {
        let ended = Ended::failed_with(Some(error));
        let (attempt, began) = board.end(record, ended.state());
        self.tell_failed(attempt, began, &ended);
    }

    /// Records the span of one attempt of the call, from `start` to now, on this thread, in
    /// its branch, with its turns and its error if it failed.
    pub(super) fn record(
        &self,
        trace: &Trace,
        start: Duration,
        turns: u32,
        outcome: &Result<Value, RunError>,
    ) {
        trace.record(Span {
            node: self.id.clone(),
            start,
            end: trace.now(),
            thread: thread_number(),
            branch: self.site.branch.path(),
            turns,
            error: outcome.as_ref().err().map(ToString::to_string),
            device: self.step.device,
            host: None,
            cached: false,
            part_of: None,
        });
    }

    /// Calls the node on `input` (the sync walk's call), traced when a trace was asked for,
    /// observed when an observer was given, under its policy when it has one.
    // Inlined into the walk: the plain call (no policy, no trace, no observer) is the one every
    // step of a plain run makes, and costs no call of its own; the others are out of line.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(super) fn call(&self, input: &Value) -> Result<Value, RunError> {
        self.call_with(Input::Read(input))
    }

    /// [`NodeCall::call`] on an input dropped once the call is done (taken from the table, or
    /// a copy of it): the plain call hands it to the node to take from
    /// ([`Node::forward_taking`]).
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn call_taking(&self, input: &mut Value) -> Result<Value, RunError> {
        self.call_with(Input::Taken(input))
    }

    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn call_with(&self, input: Input<'_>) -> Result<Value, RunError> {
        let executor = self.executor;
        if self.step.has_policy()
            || executor.trace.is_some()
            || (executor.observer.is_some() && self.site.board.is_none())
        {
            return self.observed(input.read());
        }
        // A run that keeps a board writes the call's record around it: two small calls on
        // the plain call's way, which a run without one passes with a test each.
        let on_board = match self.site.board {
            Some(board) => self.begin_on_board(board),
            None => None,
        };
        let outcome = execute(
            executor,
            &*self.step.node,
            self.step.device,
            self.id,
            input,
            &mut 0,
        );
        if let Some(on) = on_board {
            Self::end_on_board(on, &outcome, self);
        }
        outcome
    }

    /// The call of a node with a policy, or in a run traced or observed.
    // Kept out of line: a plain run should not carry its code through every step.
    #[cold]
    #[inline(never)]
    fn observed(&self, input: &Value) -> Result<Value, RunError> {
        if self.step.has_policy() {
            return self.with_policy(input);
        }
        let opened = self.begin(0);
        let outcome = match self.executor.trace.as_deref() {
            Some(trace) => self.spanned(trace, |turns| {
                execute(
                    self.executor,
                    &*self.step.node,
                    self.step.device,
                    self.id,
                    Input::Read(input),
                    turns,
                )
            }),
            None => execute(
                self.executor,
                &*self.step.node,
                self.step.device,
                self.id,
                Input::Read(input),
                &mut 0,
            ),
        };
        self.end(opened, &Ended::of(&outcome));
        outcome
    }

    /// Makes `call` — one call of the node, which counts its turns — and records its span in
    /// `trace`: from the call to its return, on this thread, in its branch.
    fn spanned(
        &self,
        trace: &Trace,
        call: impl FnOnce(&mut u32) -> Result<Value, RunError>,
    ) -> Result<Value, RunError> {
        let start = trace.now();
        let mut turns = 0;
        let outcome = call(&mut turns);
        self.record(trace, start, turns, &outcome);
        outcome
    }

    /// Calls the node under its policy: each attempt traced as a span of its own, retried as
    /// the policy says, each attempt within the time limit.
    fn with_policy(&self, input: &Value) -> Result<Value, RunError> {
        let executor = self.executor;
        let policy = self.policy();
        let mut attempt = 0_u32;
        loop {
            let opened = self.begin(attempt);
            let outcome = self.attempt(policy.time_limit, input);
            let next = next_attempt(policy, attempt, outcome);
            self.end(opened, &next.ended());
            let (pause, error) = match next {
                Next::Done(outcome) => return outcome,
                Next::Pause(pause, error) => (pause, error),
            };
            let retry = policy.retry.as_ref().expect("only a retry pauses");
            let branch = self.site.branch;
            let stopping = || branch.stopped() || executor.stopped();
            let mut waited = true;
            executor.blocking(&mut || waited = retry.clock.pause(pause, &stopping));
            if !waited {
                return Err(stopped_pausing(branch.stopped(), error));
            }
            attempt += 1;
        }
    }

    /// One attempt, traced when a trace was asked for.
    fn attempt(&self, limit: Option<Duration>, input: &Value) -> Result<Value, RunError> {
        let Some(trace) = self.executor.trace.as_deref() else {
            let mut turns = 0;
            return self.within(limit, input, &mut turns);
        };
        self.spanned(trace, |turns| self.within(limit, input, turns))
    }

    /// One call, on a lent thread and within `limit` when there is one.
    fn within(
        &self,
        limit: Option<Duration>,
        input: &Value,
        turns: &mut u32,
    ) -> Result<Value, RunError> {
        let (step, id, executor) = (self.step, self.id, self.executor);
        // A limit too far off to be a point in time is no limit worth counting.
        let Some((limit, deadline)) =
            limit.and_then(|limit| Some((limit, Instant::now().checked_add(limit)?)))
        else {
            return execute(
                executor,
                &*step.node,
                step.device,
                id,
                Input::Read(input),
                turns,
            );
        };
        // Where the call leaves its outcome for the branch that waits for it.
        let outcome = Arc::new(Delivery::new());
        let task = {
            let (executor, node, device) = (executor.clone(), Arc::clone(&step.node), step.device);
            let (id, input, outcome) = (id.clone(), input.clone(), Arc::clone(&outcome));
            let captured = executor.host.as_ref().and_then(|host| host.capture());
            move || {
                let mut result = None;
                let mut call = || {
                    let mut turns = 0;
                    result = Some(panic::catch_unwind(AssertUnwindSafe(|| {
                        execute(
                            &executor,
                            &*node,
                            device,
                            &id,
                            Input::Read(&input),
                            &mut turns,
                        )
                    })));
                };
                match &captured {
                    Some(captured) => captured.enter(&mut call),
                    None => call(),
                }
                outcome.deliver(result.expect("the context ran the call"));
            }
        };
        *turns = 1;
        if let Err(refused) = self.site.crew.lend(vec![task], executor.host.as_ref()) {
            return Err(RunError::NoThread {
                reason: refused.to_string(),
            });
        }
        // A run its caller may leave (`forward(timeout=)`) names the nodes still running when
        // it gives up: this one waits on as if it ran the call itself, so that it is named, and
        // leaves the watch to that caller. A run whose caller is this thread's stops here, at
        // Ctrl-C.
        let watch = match self.site.detached {
            Some(_) => None,
            None => executor.watch.as_deref(),
        };
        let branch = self.site.branch;
        let mut waited = Waited::Done;
        executor.blocking(&mut || {
            // An earlier sibling failed: its error is the wave's, and this call's result could
            // not be used, so the branch stops waiting for it (as it would stop at its next node
            // boundary) instead of holding the wave up to the limit.
            let mut stopping = || watch.is_some_and(Watch::interrupted) || branch.stopped();
            waited = wait_watching(
                &mut |timeout| outcome.wait(timeout),
                watch,
                Some(&mut stopping),
                Some(deadline),
            );
        });
        match waited {
            Waited::Done => match outcome.take().expect("a delivered call left its outcome") {
                Ok(result) => result,
                Err(payload) => panic::resume_unwind(payload),
            },
            Waited::Stopped => Err(RunError::Interrupted),
            Waited::PastDeadline => Err(RunError::TimeLimit {
                node: id.clone(),
                limit,
            }),
        }
    }
}

/// What `step` reads, gathered from the table: the run's input, one predecessor's value, or
/// several keyed by id; each taken when the step is its last reader, cloned otherwise.
pub(super) fn gather(step: &Step, input: &Value, frame: &mut Frame<'_>) -> Value {
    match &step.from {
        Reads::Input => input.clone(),
        Reads::One(one) => frame.gather(*one),
        Reads::Many(many) => Value::Map(
            many.reads
                .iter()
                .map(|(source, read)| (source.shared(), frame.gather(*read)))
                .collect::<Vec<_>>()
                .into(),
        ),
    }
}

/// What a call reads: an input others read too, or one dropped once the call is done, which the
/// node may take from ([`Node::forward_taking`]) on its first turn.
enum Input<'i> {
    Read(&'i Value),
    Taken(&'i mut Value),
}

impl Input<'_> {
    fn read(&self) -> &Value {
        match self {
            Input::Read(input) => input,
            Input::Taken(input) => input,
        }
    }
}

/// Calls one node, `implementation` run as `node` placed on `device`, turn after turn until it
/// is done, with `executor`'s driver and turn limit; `turns` counts the calls.
// Inlined into every caller, so that the policies' callers do not make the plain step's call
// an out-of-line one: measured on a shared machine, not isolated from the step's own change,
// the chain row ran a few percent slower with the choice left open. Only the first turn is
// here: a node that asks its driver goes on out of line.
#[allow(clippy::inline_always)]
#[inline(always)]
fn execute(
    executor: &Executor,
    implementation: &dyn Node,
    device: Option<Device>,
    node: &NodeId,
    mut input: Input<'_>,
    turns: &mut u32,
) -> Result<Value, RunError> {
    if executor.turn_limit == 0 {
        // The node gets no call at all.
        return Err(RunError::TurnLimit {
            node: node.clone(),
            limit: executor.turn_limit,
        });
    }
    *turns = 1;
    let ctx = Ctx::new(node, 0, &[]).on(device);
    let first = match &mut input {
        Input::Read(input) => implementation.forward(input, &ctx),
        Input::Taken(input) => implementation.forward_taking(input, &ctx),
    };
    let requests = match first.map_err(|error| failed(node, error))? {
        Transition::Done(value) => return Ok(value),
        Transition::Await(requests) => requests,
    };
    driven(
        executor,
        implementation,
        device,
        node,
        input.read(),
        turns,
        requests,
    )
}

/// A node's failure, attributed to it.
fn failed(node: &NodeId, error: NodeError) -> RunError {
    RunError::NodeFailed {
        node: node.clone(),
        error,
    }
}

/// The turns after a node's first asked its driver for `requests`: each answered by the driver
/// and the node called again on the answers, until it is done or past the turn limit.
#[inline(never)]
fn driven(
    executor: &Executor,
    implementation: &dyn Node,
    device: Option<Device>,
    node: &NodeId,
    input: &Value,
    turns: &mut u32,
    mut requests: Vec<Value>,
) -> Result<Value, RunError> {
    let mut turn = 0;
    loop {
        turn += 1;
        if turn >= executor.turn_limit {
            return Err(RunError::TurnLimit {
                node: node.clone(),
                limit: executor.turn_limit,
            });
        }
        let driver = executor
            .driver
            .as_deref()
            .ok_or_else(|| RunError::NoDriver { node: node.clone() })?;
        let mut answered = None;
        executor.blocking(&mut || answered = Some(driver.perform(&requests)));
        let results = answered
            .expect("the host ran the driver")
            .map_err(|error| RunError::DriverFailed {
                node: node.clone(),
                error,
            })?;
        if results.len() != requests.len() {
            return Err(RunError::WrongResultCount {
                node: node.clone(),
                asked: requests.len(),
                got: results.len(),
            });
        }
        let ctx = Ctx::new(node, turn, &results).on(device);
        *turns = turn + 1;
        let called = implementation.forward(input, &ctx);
        requests = match called.map_err(|error| failed(node, error))? {
            Transition::Done(value) => return Ok(value),
            Transition::Await(requests) => requests,
        };
    }
}
