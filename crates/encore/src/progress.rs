//! Progress bars on stderr for core's long work (weights, prefill, graph capture): an
//! implementation of `encore_core::progress::Progress` with indicatif.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use encore_core::progress::{Progress, Unit};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long work runs before its bar appears (short work shows nothing).
pub const SHOW_AFTER: Duration = Duration::from_secs(2);

/// One bar at a time on stderr, revealed once the work has run for [`SHOW_AFTER`] (also
/// while one long step is still running: a watcher thread reveals it, not the work's
/// loop), or never when hidden (`--json`).
pub struct Bars {
    visible: bool,
    current: Mutex<Option<Delayed>>,
}

impl Bars {
    pub fn new(visible: bool) -> Self {
        Bars {
            visible,
            current: Mutex::new(None),
        }
    }
}

impl Progress for Bars {
    fn start(&self, what: &str, total: u64, unit: Unit) {
        if !self.visible {
            return;
        }
        let delayed = Delayed::start(what, total, unit);
        if let Ok(mut c) = self.current.lock() {
            *c = Some(delayed); // drops (ends) any previous bar
        }
    }

    fn set(&self, done: u64) {
        if let Ok(c) = self.current.lock() {
            if let Some(d) = c.as_ref() {
                d.bar.set_position(done);
            }
        }
    }

    fn finish(&self) {
        if let Ok(mut c) = self.current.lock() {
            c.take();
        }
    }
}

/// A hidden bar and the watcher that reveals it after [`SHOW_AFTER`].
struct Delayed {
    bar: ProgressBar,
    /// Set (and signalled) when the work ends, so the watcher stops waiting.
    done: Arc<(Mutex<bool>, Condvar)>,
    watcher: Option<JoinHandle<()>>,
}

impl Delayed {
    fn start(what: &str, total: u64, unit: Unit) -> Delayed {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        let template = match unit {
            Unit::Bytes => {
                "{msg} [{bar:40}] {bytes}/{total_bytes} ({binary_bytes_per_sec}, eta {eta})"
            }
            Unit::Tokens => "{msg} [{bar:40}] {pos}/{len} tokens, {elapsed}",
            Unit::Graphs => "{msg} [{bar:40}] {pos}/{len}, {elapsed}",
        };
        let style = ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_message(what.to_string());
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let watcher = {
            let (bar, done) = (bar.clone(), Arc::clone(&done));
            std::thread::Builder::new()
                .name("progress".into())
                .spawn(move || {
                    let (lock, cvar) = &*done;
                    let Ok(guard) = lock.lock() else { return };
                    let Ok((guard, _)) = cvar.wait_timeout_while(guard, SHOW_AFTER, |d| !*d) else {
                        return;
                    };
                    if !*guard {
                        bar.set_draw_target(ProgressDrawTarget::stderr());
                        bar.enable_steady_tick(Duration::from_millis(200));
                    }
                })
                .ok()
        };
        Delayed { bar, done, watcher }
    }
}

/// Ends the bar however the work ends: the watcher is told to stop and joined, and a bar
/// it revealed is cleared.
impl Drop for Delayed {
    fn drop(&mut self) {
        let (lock, cvar) = &*self.done;
        if let Ok(mut done) = lock.lock() {
            *done = true;
        }
        cvar.notify_all();
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
        self.bar.finish_and_clear();
    }
}
