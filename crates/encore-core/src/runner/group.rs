//! Tensor parallelism in the runner: the leader (rank 0, which the scheduler drives) and
//! its followers (ranks 1.., one thread each, each with its own backend, model shard, KV
//! cache, arena and graphs) run the same steps in lockstep.
//!
//! The rule: before the leader runs anything that issues collectives (a step, a capture,
//! a change of graph mode), it sends the same command to every follower, then does it
//! itself, then waits for every follower's verdict. A step's command carries the bytes
//! of the leader's packed step inputs (one host table, the same upload on every rank)
//! and how the step runs (eagerly, or the replay of a key), so a follower needs none of
//! the scheduler's state. Only the leader samples: followers run the forward and the LM
//! head (whose all-gather every rank joins) and skip sampling, so penalties, masks and
//! the sampled tokens exist on rank 0 alone.
//!
//! A rank that fails aborts the group's collectives (no rank waits forever in one) and
//! the leader's step returns the error, naming the rank; the group is then broken and
//! every later step fails with the same error.

use std::sync::mpsc::{Receiver, RecvError, Sender, TryRecvError};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::graph::Key;

use super::policy::GraphConfig;
use super::step::StepShape;
use super::Runner;

/// How a step runs on every rank.
#[derive(Clone, Copy, Debug)]
pub(super) enum Exec {
    Eager(StepShape),
    Replay {
        key: Key,
        real: usize,
        shape: StepShape,
    },
}

/// What the leader tells its followers to do.
#[derive(Clone, Debug)]
pub enum Cmd {
    /// Load the leader's packed step inputs for the layout of `tokens` x `seqs` rows and
    /// run the step.
    #[allow(private_interfaces)]
    Run {
        bytes: Arc<[u8]>,
        tokens: usize,
        seqs: usize,
        exec: Exec,
        /// Under a routing table: the leader's window for this step (its first row and
        /// the step's rows, [`crate::model::llama::Model::follow_routing`]).
        routing: Option<(usize, usize)>,
    },
    Capture {
        key: Key,
        ahead: bool,
        /// The routing window of the step the capture is for (as in `Run`), so that the
        /// capture's eager run fills each rank's expert cache with the leader's experts.
        routing: Option<(usize, usize)>,
    },
    CaptureAll,
    SetGraphs(Option<GraphConfig>),
    SetForceEager(bool),
    SetVerify(bool),
}

/// Ends every rank's collectives, once, when the group fails, and keeps the first cause:
/// once one rank's communicator is aborted its peers' collectives fail too, and their
/// errors are consequences, not the cause.
pub struct GroupAbort {
    cause: OnceLock<String>,
    abort_all: Box<dyn Fn(&str) + Send + Sync>,
}

impl GroupAbort {
    /// `abort_all` ends the collectives of every rank (given the cause).
    pub fn new(abort_all: impl Fn(&str) + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(GroupAbort {
            cause: OnceLock::new(),
            abort_all: Box::new(abort_all),
        })
    }

    /// The group failed because of `why` (which names the rank): the first call aborts
    /// every rank's collectives, later ones only return.
    pub fn abort(&self, why: &str) {
        if self.cause.set(why.to_string()).is_ok() {
            tracing::error!("tensor-parallel group aborted: {why}");
            (self.abort_all)(why);
        }
    }

    /// The first cause given to [`GroupAbort::abort`].
    pub fn cause(&self) -> Option<&str> {
        self.cause.get().map(String::as_str)
    }
}

/// The group's abort, shared by every rank.
pub type AbortFn = Arc<GroupAbort>;

/// A panic's message (its payload, when a string).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// The next message of `rx`, polled for up to `spin` (yielding the core between polls)
/// before a blocking receive. A follower's step starts when its command arrives, and the
/// leader's first collective waits for it: a sleeping thread's wake-up (tens of
/// microseconds) would be on every step's path, while the next command of a busy engine
/// comes within a step.
fn recv_spinning<T>(rx: &Receiver<T>, spin: Duration) -> std::result::Result<T, RecvError> {
    if !spin.is_zero() {
        let start = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(t) => return Ok(t),
                Err(TryRecvError::Disconnected) => return Err(RecvError),
                Err(TryRecvError::Empty) if start.elapsed() < spin => std::thread::yield_now(),
                Err(TryRecvError::Empty) => break,
            }
        }
    }
    rx.recv()
}

/// One follower as the leader sees it.
pub struct FollowerRank {
    pub rank: usize,
    pub device: String,
    pub tx: Sender<Cmd>,
    pub done: Receiver<Result<()>>,
    pub thread: Option<JoinHandle<()>>,
}

/// The leader's handle on its followers.
pub struct Followers {
    /// The leader as errors name it: `rank 0 (device)`.
    leader: String,
    ranks: Vec<FollowerRank>,
    /// The group's abort; its first cause, once set, is why the group is broken.
    abort: AbortFn,
}

impl Followers {
    /// The followers of the leader on `leader_device`.
    pub fn new(leader_device: &str, ranks: Vec<FollowerRank>, abort: AbortFn) -> Self {
        Followers {
            leader: format!("rank 0 ({leader_device})"),
            ranks,
            abort,
        }
    }

    /// Why the group can run nothing more (a rank failed), if it failed.
    pub fn broken(&self) -> Option<&str> {
        self.abort.cause()
    }

    fn check(&self) -> Result<()> {
        match self.broken() {
            Some(why) => Err(Error::invalid("tensor parallel", why)),
            None => Ok(()),
        }
    }

    fn send(&mut self, cmd: Cmd) -> Result<()> {
        self.check()?;
        for r in &self.ranks {
            if r.tx.send(cmd.clone()).is_err() {
                let why = format!("rank {} ({}) has stopped", r.rank, r.device);
                self.abort.abort(&why);
                return self.check();
            }
        }
        Ok(())
    }

    /// After the leader's own part of a command (`local`): abort the group if it failed,
    /// then every follower's verdict. The group's first failure is the cause the error
    /// names (the others may follow from its abort); the leader's own error is returned
    /// as it is. The group stays broken after (its abort keeps the cause).
    fn finish<T>(&mut self, local: Result<T>) -> Result<T> {
        let own = local
            .as_ref()
            .err()
            .map(|e| format!("{}: {e}", self.leader));
        if let Some(own) = &own {
            self.abort.abort(own);
        }
        let mut first: Option<String> = None;
        for r in &self.ranks {
            let verdict = match r.done.recv() {
                Ok(v) => v.map_err(|e| e.to_string()),
                Err(_) => Err("stopped".into()),
            };
            if let Err(e) = verdict {
                first.get_or_insert(format!("rank {} ({}): {e}", r.rank, r.device));
            }
        }
        if let Some(why) = &first {
            self.abort.abort(why);
        }
        match (local, self.broken()) {
            (Ok(t), None) => Ok(t),
            // The leader's own failure, returned as it is (its kind intact).
            (Err(e), None) => Err(e),
            (Err(e), cause) if cause == own.as_deref() => Err(e),
            // A peer's failure (the leader's error, if any, followed from its aborted
            // collective): the step's error names that cause.
            (_, Some(cause)) => Err(Error::invalid("tensor parallel", cause)),
        }
    }
}

impl Drop for Followers {
    fn drop(&mut self) {
        // The leader unwinding from a panic may have left its followers inside a
        // collective it never reached: end them, or the joins below would wait forever.
        if std::thread::panicking() {
            self.abort.abort(&format!("{} panicked", self.leader));
        }
        for r in &mut self.ranks {
            // Closing the channel ends the follower's loop.
            let (tx, _) = std::sync::mpsc::channel();
            drop(std::mem::replace(&mut r.tx, tx));
        }
        for r in &mut self.ranks {
            if let Some(t) = r.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Runner<'_> {
    /// Make this runner the leader of `followers` (after every rank has booted: boot runs
    /// the same steps on every rank by itself).
    pub fn set_followers(&mut self, followers: Followers) {
        // A follower does not sample: no step takes ids from the step before.
        if self.parts.overlap {
            self.exec.clear();
            self.parts.overlap = false;
        }
        self.group = Some(followers);
    }

    /// Why this runner's tensor-parallel group can run nothing more (a rank failed and
    /// the group's collectives were aborted); `None` while it can (and alone).
    pub fn group_broken(&self) -> Option<&str> {
        self.group.as_ref().and_then(Followers::broken)
    }

    /// Ranks in this runner's tensor-parallel group.
    pub fn tp_size(&self) -> usize {
        1 + self.group.as_ref().map_or(0, |g| g.ranks.len())
    }

    /// Run `local` on the leader, with `cmd` sent to every follower first and their
    /// verdicts collected after (just `local` without followers).
    pub(super) fn mirrored<T>(
        &mut self,
        cmd: impl FnOnce() -> Cmd,
        local: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        if self.group.is_none() {
            return local(self);
        }
        self.group.as_mut().expect("checked").send(cmd())?;
        let out = local(self);
        self.group.as_mut().expect("checked").finish(out)
    }

    /// The command that runs the step just packed for `layout` (`read` sequence rows
    /// uploaded) as `exec` on a follower: the packed bytes; `None` without followers.
    pub(super) fn run_cmd(
        &mut self,
        layout: &crate::graph::Layout,
        read: usize,
        exec: Exec,
    ) -> Result<Option<Cmd>> {
        if self.group.is_none() {
            return Ok(None);
        }
        let bytes: Arc<[u8]> = self
            .parts
            .inputs
            .table
            .staged(layout, layout.tokens, read)?
            .into();
        Ok(Some(Cmd::Run {
            bytes,
            tokens: layout.tokens,
            seqs: layout.seqs,
            exec,
            routing: self.routed.take(),
        }))
    }

    /// A follower's loop (`who`: `rank N (device)`): obey each command and report, until
    /// the leader goes away. A failed command aborts the group's collectives; a panic
    /// too, reported as the command's error, and ends the loop (the rank's state is
    /// unknown after it). After each command it polls for the next for up to `spin`
    /// before it sleeps.
    pub fn follow(
        &mut self,
        who: &str,
        rx: Receiver<Cmd>,
        done: Sender<Result<()>>,
        abort: AbortFn,
        spin: Duration,
    ) {
        self.parts.sample = false;
        while let Ok(cmd) = recv_spinning(&rx, spin) {
            let obeyed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.obey(cmd)));
            let (r, panicked) = match obeyed {
                Ok(r) => (r, false),
                Err(p) => {
                    let why = format!("panicked: {}", panic_message(&*p));
                    (Err(Error::invalid("step", why)), true)
                }
            };
            if let Err(e) = &r {
                abort.abort(&format!("{who}: {e}"));
            }
            if done.send(r).is_err() || panicked {
                break;
            }
        }
    }

    fn obey(&mut self, cmd: Cmd) -> Result<()> {
        let be = self.parts.be;
        match cmd {
            Cmd::Run {
                bytes,
                tokens,
                seqs,
                exec,
                routing,
            } => {
                self.parts.model.follow_routing(be, routing)?;
                let layout = self.parts.inputs.layout(tokens, seqs);
                self.parts.inputs.table.load(be, &layout, &bytes)?;
                match exec {
                    Exec::Eager(shape) => {
                        let step = self.parts.forward(&layout, shape)?;
                        self.exec.eager(be, &step)?;
                    }
                    Exec::Replay { key, real, shape } => {
                        let step = self.parts.forward(&layout, shape)?;
                        self.exec.replay(be, key, real, &step)?;
                    }
                }
                Ok(())
            }
            Cmd::Capture {
                key,
                ahead,
                routing,
            } => {
                self.parts.model.follow_routing(be, routing)?;
                self.capture_key_from_padding(key, ahead)
            }
            Cmd::CaptureAll => self.capture_all_local(&mut |_, _| {}),
            Cmd::SetGraphs(g) => {
                self.set_graphs_local(g);
                Ok(())
            }
            Cmd::SetForceEager(on) => {
                self.policy.force_eager = on;
                Ok(())
            }
            Cmd::SetVerify(on) => {
                self.policy.verify = on;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::recv_spinning;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    #[test]
    fn recv_spinning_takes_messages_while_polling_and_after() {
        let (tx, rx) = mpsc::channel();
        tx.send(1).unwrap();
        assert_eq!(recv_spinning(&rx, Duration::from_millis(50)), Ok(1));
        // Sent while the receiver polls.
        let t = std::thread::spawn({
            let tx = tx.clone();
            move || {
                std::thread::sleep(Duration::from_millis(5));
                tx.send(2).unwrap();
            }
        });
        assert_eq!(recv_spinning(&rx, Duration::from_secs(5)), Ok(2));
        t.join().unwrap();
        // Sent after the poll gave up: the blocking receive takes it.
        let t = std::thread::spawn({
            let tx = tx.clone();
            move || {
                std::thread::sleep(Duration::from_millis(30));
                tx.send(3).unwrap();
            }
        });
        let start = Instant::now();
        assert_eq!(recv_spinning(&rx, Duration::from_millis(1)), Ok(3));
        assert!(start.elapsed() >= Duration::from_millis(20));
        t.join().unwrap();
        // No poll: a plain blocking receive.
        tx.send(4).unwrap();
        assert_eq!(recv_spinning(&rx, Duration::ZERO), Ok(4));
        // A closed channel ends the poll at once.
        drop(tx);
        let start = Instant::now();
        assert!(recv_spinning(&rx, Duration::from_secs(5)).is_err());
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
