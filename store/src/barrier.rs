//! Barrier bookkeeping for group commit, as plain code without threads or IO: who is waiting for
//! which LSN, whether a barrier is running, what the last completed barrier made durable, and
//! whether a failed barrier poisoned the log. The log drives it under one mutex.
//!
//! The rule it serves: a barrier reads how far the log was written BEFORE its fdatasync and
//! publishes that value as durable only AFTER the fdatasync returned ([`BarrierBook::finish`]
//! takes the target read before the sync). One barrier runs at a time.

use std::collections::{BTreeMap, VecDeque};

use crate::wal::Lsn;

/// Whether a caller waiting for an LSN has to wait.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Status {
    /// Already covered by a completed barrier.
    Durable,
    /// A barrier failed earlier; the message says how.
    Poisoned(String),
    /// Not durable yet.
    Pending,
}

/// The barrier the book asks the caller to run next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Job<W> {
    /// A shared barrier for every waiter it covers.
    Shared,
    /// A barrier of its own for this waiter (the naive mode); it also covers shared waiters.
    Own(W),
}

/// What the barrier thread does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step<W> {
    /// Run this barrier.
    Run(Job<W>),
    /// Sleep until woken: nothing to run yet, or a barrier runs on another thread.
    Wait,
    /// Exit: shut down, no barrier running, nobody left waiting for one.
    Exit,
}

/// What a finished barrier settled.
#[derive(Debug)]
pub(crate) struct Finished<W> {
    /// Waiters to complete, with their outcome.
    pub done: Vec<(W, Result<(), String>)>,
    /// How many LSNs this barrier newly made durable (0 if it failed).
    pub covered: u64,
    /// What the barrier amounts to: a sync that succeeded after the book was poisoned (by a
    /// failed sync elsewhere) still fails.
    pub outcome: Result<(), String>,
}

/// The state of barriers and their waiters. `W` is whatever completes a waiter.
#[derive(Debug)]
pub(crate) struct BarrierBook<W> {
    durable: Lsn,
    running: bool,
    poison: Option<String>,
    shared: BTreeMap<Lsn, Vec<W>>,
    own: VecDeque<W>,
    shutdown: bool,
}

impl<W> BarrierBook<W> {
    /// A book where everything up to `durable` is already durable.
    pub fn new(durable: Lsn) -> Self {
        BarrierBook {
            durable,
            running: false,
            poison: None,
            shared: BTreeMap::new(),
            own: VecDeque::new(),
            shutdown: false,
        }
    }

    /// The LSN published by the last completed barrier.
    pub fn durable(&self) -> Lsn {
        self.durable
    }

    /// Whether a barrier is running now.
    pub fn running(&self) -> bool {
        self.running
    }

    /// The poison message, if a barrier failed.
    pub fn poison(&self) -> Option<&str> {
        self.poison.as_deref()
    }

    /// Whether `lsn` must still wait. `own` callers always wait for a barrier of their own.
    pub fn status(&self, lsn: Lsn, own: bool) -> Status {
        match &self.poison {
            Some(msg) => Status::Poisoned(msg.clone()),
            None if !own && lsn <= self.durable => Status::Durable,
            None => Status::Pending,
        }
    }

    /// Claims the right to run a barrier now if none is running (and the log is not poisoned).
    pub fn try_begin(&mut self) -> bool {
        if self.running || self.poison.is_some() {
            return false;
        }
        self.running = true;
        true
    }

    /// Registers a waiter that any barrier covering `lsn` completes.
    pub fn wait_shared(&mut self, lsn: Lsn, waiter: W) {
        debug_assert!(lsn > self.durable);
        self.shared.entry(lsn).or_default().push(waiter);
    }

    /// Registers a waiter that needs a barrier of its own.
    pub fn wait_own(&mut self, waiter: W) {
        self.own.push_back(waiter);
    }

    /// Whether a waiter needs a barrier that nobody is running yet.
    pub fn has_work(&self) -> bool {
        !self.running && self.poison.is_none() && (!self.own.is_empty() || !self.shared.is_empty())
    }

    /// Claims and returns the next barrier to run, if one is needed and none is running.
    pub fn next_job(&mut self) -> Option<Job<W>> {
        if !self.has_work() {
            return None;
        }
        self.running = true;
        Some(match self.own.pop_front() {
            Some(w) => Job::Own(w),
            None => Job::Shared,
        })
    }

    /// The barrier thread's next step. After shutdown it still runs what waiters need, and it
    /// waits for a barrier running on another thread (a lone caller's), which may leave waiters
    /// behind (own ones always need a barrier of their own): exiting then would strand them.
    pub fn next_step(&mut self) -> Step<W> {
        match self.next_job() {
            Some(job) => Step::Run(job),
            None if self.shutdown && !self.running => Step::Exit,
            None => Step::Wait,
        }
    }

    /// Whether the barrier thread should be woken after a barrier finished: there is work, or
    /// the log is shut down and the thread may be waiting only to exit.
    pub fn wake_thread(&self) -> bool {
        self.has_work() || self.shutdown
    }

    /// Ends the running barrier, which read `target` as written before its sync, with `outcome`.
    /// On success publishes `target` as durable and completes the covered waiters (and `owner`).
    /// On failure, or if the book was poisoned while the barrier ran, poisons the book and fails
    /// every waiter: nothing is reported durable once any sync failed.
    pub fn finish(
        &mut self,
        target: Lsn,
        outcome: Result<(), String>,
        owner: Option<W>,
    ) -> Finished<W> {
        debug_assert!(self.running);
        self.running = false;
        let outcome = match (outcome, &self.poison) {
            (Ok(()), Some(msg)) => Err(msg.clone()),
            (outcome, _) => outcome,
        };
        match outcome {
            Ok(()) => {
                let covered = target.saturating_sub(self.durable);
                self.durable = self.durable.max(target);
                let later = self.shared.split_off(&(self.durable + 1));
                let ready = std::mem::replace(&mut self.shared, later);
                let mut done: Vec<_> = ready.into_values().flatten().map(|w| (w, Ok(()))).collect();
                done.extend(owner.map(|w| (w, Ok(()))));
                Finished {
                    done,
                    covered,
                    outcome: Ok(()),
                }
            }
            Err(msg) => {
                let mut done = self.fail_all(msg);
                let msg = self.poison.clone().unwrap_or_default();
                if let Some(w) = owner {
                    done.push((w, Err(msg.clone())));
                }
                Finished {
                    done,
                    covered: 0,
                    outcome: Err(msg),
                }
            }
        }
    }

    /// Poisons the book (keeping the first message) and returns every waiter with the error.
    pub fn fail_all(&mut self, msg: String) -> Vec<(W, Result<(), String>)> {
        let msg = self.poison.get_or_insert(msg).clone();
        let shared = std::mem::take(&mut self.shared).into_values().flatten();
        let own = std::mem::take(&mut self.own);
        shared.chain(own).map(|w| (w, Err(msg.clone()))).collect()
    }

    /// Marks the book shut down: no new waiters are accepted.
    pub fn shut_down(&mut self) {
        self.shutdown = true;
    }

    /// Whether [`Self::shut_down`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.shutdown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(done: &[(u32, Result<(), String>)]) -> Vec<u32> {
        let mut v: Vec<u32> = done.iter().map(|(w, _)| *w).collect();
        v.sort();
        v
    }

    #[test]
    fn one_barrier_covers_everyone_written_before_it() {
        let mut book = BarrierBook::new(0);
        assert_eq!(book.status(1, false), Status::Pending);
        assert!(book.try_begin());
        assert!(!book.try_begin(), "one barrier at a time");
        // The first barrier read written = 1; waiters 2..=4 arrive while it runs.
        for lsn in 2..=4 {
            book.wait_shared(lsn, lsn as u32);
        }
        let f = book.finish(1, Ok(()), None);
        assert!(f.done.is_empty());
        assert_eq!(f.covered, 1);
        assert_eq!(book.durable(), 1);
        // The next barrier read written = 4 and covers all three.
        assert_eq!(book.next_job(), Some(Job::Shared));
        assert_eq!(book.next_job(), None);
        let f = book.finish(4, Ok(()), None);
        assert_eq!(ids(&f.done), vec![2, 3, 4]);
        assert_eq!(f.covered, 3);
        assert_eq!(book.status(4, false), Status::Durable);
        assert!(!book.has_work());
    }

    #[test]
    fn durable_is_published_only_by_finish() {
        let mut book: BarrierBook<u32> = BarrierBook::new(0);
        assert!(book.try_begin());
        // While the sync runs nothing is durable yet.
        assert_eq!(book.status(1, false), Status::Pending);
        book.finish(1, Ok(()), None);
        assert_eq!(book.status(1, false), Status::Durable);
    }

    #[test]
    fn waiters_beyond_the_target_keep_waiting() {
        let mut book = BarrierBook::new(0);
        book.wait_shared(3, 3u32);
        book.wait_shared(5, 5u32);
        assert_eq!(book.next_job(), Some(Job::Shared));
        let f = book.finish(4, Ok(()), None);
        assert_eq!(ids(&f.done), vec![3]);
        assert!(book.has_work());
    }

    #[test]
    fn own_waiters_each_get_a_barrier() {
        let mut book = BarrierBook::new(10);
        assert_eq!(book.status(5, true), Status::Pending, "own never shares");
        book.wait_own(1u32);
        book.wait_own(2u32);
        assert_eq!(book.next_job(), Some(Job::Own(1)));
        let f = book.finish(12, Ok(()), Some(1));
        assert_eq!(ids(&f.done), vec![1]);
        assert_eq!(book.next_job(), Some(Job::Own(2)));
        let f = book.finish(12, Ok(()), Some(2));
        assert_eq!((ids(&f.done), f.covered), (vec![2], 0));
    }

    #[test]
    fn a_failed_barrier_poisons_forever() {
        let mut book = BarrierBook::new(0);
        book.wait_shared(1, 1u32);
        book.wait_own(2u32);
        assert_eq!(book.next_job(), Some(Job::Own(2)));
        book.wait_shared(2, 3u32);
        let f = book.finish(1, Err("EIO".into()), Some(2));
        assert_eq!(ids(&f.done), vec![1, 2, 3]);
        assert!(f.done.iter().all(|(_, r)| r.is_err()));
        assert_eq!(book.durable(), 0);
        assert_eq!(book.status(0, false), Status::Poisoned("EIO".into()));
        assert!(!book.try_begin(), "never retried");
        assert_eq!(book.next_job(), None);
        // A later failure keeps the first message.
        book.fail_all("other".into());
        assert_eq!(book.poison(), Some("EIO"));
    }

    #[test]
    fn the_thread_outlives_a_barrier_running_elsewhere_after_shutdown() {
        let mut book = BarrierBook::new(0);
        // A lone caller runs a barrier; an own waiter queues behind it; the log shuts down.
        assert!(book.try_begin());
        book.wait_own(1u32);
        book.shut_down();
        assert_eq!(
            book.next_step(),
            Step::Wait,
            "the own waiter still needs a barrier"
        );
        let f = book.finish(3, Ok(()), None);
        assert!(f.done.is_empty());
        assert!(book.wake_thread());
        assert_eq!(book.next_step(), Step::Run(Job::Own(1)));
        book.finish(3, Ok(()), Some(1));
        assert!(book.wake_thread(), "woken to exit");
        assert_eq!(book.next_step(), Step::Exit);
    }

    #[test]
    fn a_barrier_that_succeeds_after_a_poisoning_fails() {
        let mut book = BarrierBook::new(0);
        book.wait_own(1u32);
        assert_eq!(book.next_job(), Some(Job::Own(1)));
        // Another sync of the file failed while this barrier's sync ran.
        book.fail_all("EIO".into());
        let f = book.finish(5, Ok(()), Some(1));
        assert_eq!(f.outcome, Err("EIO".into()));
        assert_eq!(f.done, vec![(1, Err("EIO".into()))]);
        assert_eq!((f.covered, book.durable()), (0, 0));
    }
}
