//! The CPU twin of CUDA's copy stream: a worker thread copies (`memcpy`) while the calling
//! thread computes. Copies are numbered as they are queued; an event is the number of the
//! copies queued before its record, and waiting for it blocks until the worker has
//! finished that many. Compute ops run synchronously on the calling thread, so a fork
//! needs nothing: by the time a later copy is queued every earlier op has finished.
//! Every method goes through the backend's recorder, so inside a capture it is recorded
//! on the tape and happens at replay, as a CUDA graph's copy nodes and event edges do.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{check_device, ptr_of, Recorder};
use crate::backend::{check_host_copy, CopyQueue, HostMemory};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

enum Job {
    Copy {
        src: Arc<HostMemory>,
        offset: usize,
        dst: Tensor,
    },
    /// The queue is gone: stop, even though captured tapes still hold senders.
    Stop,
}

#[derive(Default)]
struct Counts {
    /// Copies queued so far.
    queued: u64,
    /// Copies the worker has finished.
    done: u64,
    /// Per event: `queued` at its last record.
    events: Vec<u64>,
}

#[derive(Default)]
struct Shared {
    counts: Mutex<Counts>,
    finished: Condvar,
}

impl Shared {
    fn wait_for(&self, n: u64) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        while c.done < n {
            c = self.finished.wait(c).unwrap_or_else(|e| e.into_inner());
        }
    }
}

pub(crate) struct CpuCopyQueue {
    rec: Arc<Recorder>,
    shared: Arc<Shared>,
    tx: Mutex<Option<Sender<Job>>>,
    worker: Option<JoinHandle<()>>,
    events: usize,
}

impl CpuCopyQueue {
    pub(crate) fn new(rec: Arc<Recorder>, events: usize, delay: Duration) -> Result<Self> {
        let shared = Arc::new(Shared::default());
        shared.counts.lock().unwrap().events = vec![0; events];
        let (tx, rx) = channel::<Job>();
        let s = shared.clone();
        let worker = std::thread::Builder::new()
            .name("encore-copy".into())
            .spawn(move || {
                for job in rx {
                    let Job::Copy { src, offset, dst } = job else {
                        break;
                    };
                    if !delay.is_zero() {
                        std::thread::sleep(delay);
                    }
                    let n = dst.size_bytes();
                    // SAFETY: the range was checked when queued; `job` keeps both the
                    // host memory and the destination buffer alive; the offload plan
                    // orders this write after every read of the destination bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src.as_ptr().add(offset), ptr_of(&dst), n)
                    };
                    let mut c = s.counts.lock().unwrap_or_else(|e| e.into_inner());
                    c.done += 1;
                    s.finished.notify_all();
                }
            })
            .map_err(|e| Error::invalid("copy_queue", format!("spawning the copy thread: {e}")))?;
        Ok(CpuCopyQueue {
            rec,
            shared,
            tx: Mutex::new(Some(tx)),
            worker: Some(worker),
            events,
        })
    }

    fn check_event(&self, event: usize) -> Result<()> {
        if event >= self.events {
            return Err(Error::invalid(
                "copy_queue",
                format!("event {event} of {}", self.events),
            ));
        }
        Ok(())
    }

    fn sender(&self) -> Result<Sender<Job>> {
        self.tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| Error::invalid("copy_queue", "the copy thread has stopped"))
    }
}

impl CopyQueue for CpuCopyQueue {
    fn fork(&self) -> Result<()> {
        Ok(())
    }

    fn copy(&self, src: &Arc<HostMemory>, offset: usize, dst: &Tensor) -> Result<()> {
        check_device("copy_queue.copy", &[("dst", dst)])?;
        check_host_copy(src, offset, dst)?;
        if dst.size_bytes() == 0 {
            return Ok(());
        }
        let tx = self.sender()?;
        let (src, dst, shared) = (src.clone(), dst.clone(), self.shared.clone());
        self.rec.submit(move || {
            shared
                .counts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .queued += 1;
            // The worker lives as long as the queue, which outlives its graphs' replays.
            let _ = tx.send(Job::Copy {
                src: src.clone(),
                offset,
                dst: dst.clone(),
            });
        });
        Ok(())
    }

    fn record(&self, event: usize) -> Result<()> {
        self.check_event(event)?;
        let shared = self.shared.clone();
        self.rec.submit(move || {
            let mut c = shared.counts.lock().unwrap_or_else(|e| e.into_inner());
            c.events[event] = c.queued;
        });
        Ok(())
    }

    fn wait(&self, event: usize) -> Result<()> {
        self.check_event(event)?;
        let shared = self.shared.clone();
        self.rec.submit(move || {
            let n = shared
                .counts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .events[event];
            shared.wait_for(n);
        });
        Ok(())
    }

    fn join(&self) -> Result<()> {
        let shared = self.shared.clone();
        self.rec.submit(move || {
            let n = shared
                .counts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .queued;
            shared.wait_for(n);
        });
        Ok(())
    }
}

impl Drop for CpuCopyQueue {
    fn drop(&mut self) {
        // Graphs captured with this queue hold senders too, so closing ours is not enough.
        if let Some(tx) = self.tx.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = tx.send(Job::Stop);
        }
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}
