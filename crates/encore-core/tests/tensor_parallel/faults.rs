//! A rank that fails or panics mid-step, or fails to start: an error naming it, never a
//! hang.

use super::*;

/// How a rank fails, once armed.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    Error,
    Panic,
}

/// Generate over 2 eager CPU ranks, rank `faulty` failing (`fault`) once armed after
/// start-up: within 30 s the leader's generate returns the error naming the failed rank
/// (or, when the leader panics, its thread ends), and a later step fails at once with
/// the same cause. `None` from the thread means it never answered (a hang).
fn fail_a_rank(faulty: usize, fault: Fault) -> Option<std::thread::Result<(String, String)>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let result = std::panic::catch_unwind(|| {
            let mut ranks: Vec<Arc<Hooked<FailArmed>>> = CpuBackend::group(2)
                .into_iter()
                .map(|inner| {
                    let hooks = FailArmed {
                        panic: fault == Fault::Panic,
                        ..Default::default()
                    };
                    Arc::new(Hooked { inner, hooks })
                })
                .collect();
            let target = ranks[faulty].clone();
            let refs: Vec<BackendRef> = ranks.drain(..).map(|r| r as BackendRef).collect();
            let be = refs[0].clone();
            let cfg = EngineConfig {
                tp: TpBackends(refs),
                ..config(false)
            };
            let files = open_model("dummy:tiny").unwrap();
            let Engine { mut runner, .. } =
                Engine::new(be.as_ref(), files, &cfg, &NoProgress).unwrap();
            target
                .hooks
                .armed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            let opts = GenerateOptions {
                max_tokens: 4,
                sampling: SamplingParams::default(),
                ignore_eos: true,
            };
            let run = |runner: &mut encore_core::runner::Runner<'_>| {
                generate(runner, &prompts(), &[], &opts, &NoProgress, |_, _| {
                    std::ops::ControlFlow::Continue(())
                })
                .map(|_| ())
                .unwrap_err()
                .to_string()
            };
            let first = run(&mut runner);
            let again = run(&mut runner);
            let broken = runner.group_broken().expect("the group is broken");
            assert!(again.ends_with(broken), "{again} / {broken}");
            (first, again)
        });
        let _ = tx.send(result);
    });
    rx.recv_timeout(std::time::Duration::from_secs(30)).ok()
}

#[test]
fn a_rank_that_fails_or_panics_mid_step_ends_the_step_with_its_error() {
    // A follower's error: the leader's step fails naming the rank and the cause, and
    // every later step fails at once with that cause.
    let (first, again) = fail_a_rank(1, Fault::Error)
        .expect("a follower's error left the leader waiting")
        .expect("no panic");
    assert!(
        first.contains("rank 1 (") && first.contains("the injected fault"),
        "{first}"
    );
    assert!(
        again.contains("rank 1 (") && again.contains("the injected fault"),
        "{again}"
    );
    // A follower's panic: the same, the panic's message the cause.
    let (first, _) = fail_a_rank(1, Fault::Panic)
        .expect("a follower's panic left the leader waiting")
        .expect("no panic on the leader");
    assert!(
        first.contains("rank 1 (") && first.contains("the injected panic"),
        "{first}"
    );
    // The leader's error: returned as it is, the group broken by it.
    let (first, again) = fail_a_rank(0, Fault::Error)
        .expect("the leader's error left a follower waiting")
        .expect("no panic");
    assert!(first.contains("the injected fault"), "{first}");
    assert!(
        again.contains("rank 0 (") && again.contains("the injected fault"),
        "{again}"
    );
    // The leader's panic: it unwinds, its followers are released and joined.
    let panicked = fail_a_rank(0, Fault::Panic).expect("the leader's panic hung its drop");
    assert!(panicked.is_err());
}

#[test]
fn a_rank_that_fails_to_start_is_an_error_naming_it() {
    // Rank 1 cannot allocate: the engine's start-up fails naming the rank, its device and
    // the cause, and rank 0 (which met it at a start-up meeting) is released, not left
    // waiting.
    struct NoMemory;
    impl common::hooked::Hooks for NoMemory {
        fn alloc(
            &self,
            _: &CpuBackend,
            _: DType,
            _: &[usize],
        ) -> Option<encore_core::Result<encore_core::Tensor>> {
            Some(Err(encore_core::Error::invalid(
                "alloc",
                "the injected shortage",
            )))
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut ranks = CpuBackend::group(2).into_iter();
        let leader: BackendRef = Arc::new(ranks.next().unwrap());
        let hooks = NoMemory;
        let failing: BackendRef = Arc::new(Hooked {
            inner: ranks.next().unwrap(),
            hooks,
        });
        let cfg = EngineConfig {
            tp: TpBackends(vec![leader.clone(), failing]),
            ..config(true)
        };
        let files = open_model("dummy:tiny").unwrap();
        let e = Engine::new(leader.as_ref(), files, &cfg, &NoProgress)
            .err()
            .map(|e| e.to_string());
        let _ = tx.send(e);
    });
    let e = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("rank 0 was left waiting for the rank that failed")
        .expect("the engine started");
    assert!(
        e.contains("rank 1 (cpu")
            && e.contains("failed to start")
            && e.contains("the injected shortage"),
        "{e}"
    );
}
