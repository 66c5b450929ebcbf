//! The gate every snapshot writer of a store passes: it counts the writers in flight, and once
//! sealed it lets no new one in and waits for those in flight to end, so that the owner of the
//! directory can hand it on (to a later open, or another process) knowing that no file in it is
//! still being written, renamed or retired.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::{Error, Result};

/// The writers in flight of one snapshot store, and whether it is sealed.
#[derive(Debug, Default)]
pub(crate) struct WriterGate {
    state: Mutex<GateState>,
    ended: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    sealed: bool,
    writers: usize,
}

/// One writer's passage through the gate; it ends when dropped.
#[derive(Debug)]
pub(crate) struct Passage {
    gate: Arc<WriterGate>,
}

impl WriterGate {
    /// Lets one more writer in, or fails with [`Error::Closed`] once the gate is sealed.
    pub(crate) fn enter(gate: &Arc<WriterGate>) -> Result<Passage> {
        let mut state = gate.state.lock();
        if state.sealed {
            return Err(Error::Closed);
        }
        state.writers += 1;
        Ok(Passage { gate: gate.clone() })
    }

    /// Seals the gate and waits until every writer in flight has ended. Blocking.
    pub(crate) fn seal(&self) {
        let mut state = self.state.lock();
        state.sealed = true;
        while state.writers > 0 {
            self.ended.wait(&mut state);
        }
    }

    /// Whether the gate is sealed (its seal may still be waiting for writers).
    #[cfg(test)]
    pub(crate) fn is_sealed(&self) -> bool {
        self.state.lock().sealed
    }
}

impl Drop for Passage {
    fn drop(&mut self) {
        let mut state = self.gate.state.lock();
        state.writers -= 1;
        if state.writers == 0 {
            self.gate.ended.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_gate_lets_no_writer_in_and_waits_for_those_inside() {
        let gate = Arc::new(WriterGate::default());
        let first = WriterGate::enter(&gate).unwrap();
        let second = WriterGate::enter(&gate).unwrap();
        let (sealed, seal_returned) = std::sync::mpsc::channel();
        let sealer = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                gate.seal();
                sealed.send(()).unwrap();
            })
        };
        // Polls a state the sealer sets before it waits: bounded, no sleep.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !gate.is_sealed() {
            assert!(std::time::Instant::now() < deadline, "the seal never began");
            std::thread::yield_now();
        }
        assert!(matches!(WriterGate::enter(&gate), Err(Error::Closed)));
        drop(first);
        assert!(
            seal_returned.try_recv().is_err(),
            "the seal returned with a writer still inside"
        );
        drop(second);
        seal_returned
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the seal returns once the last writer has ended");
        sealer.join().unwrap();
    }
}
