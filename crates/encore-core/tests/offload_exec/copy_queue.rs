//! The copy queue itself: copy, record, wait and join order, eagerly and captured.

use super::*;

fn f32s(be: &dyn Backend, t: &encore_core::Tensor) -> Vec<f32> {
    be.download::<f32>(t).unwrap()
}

/// Copy, record, wait and join on `be`'s copy queue, eagerly and inside a capture. The
/// host memory holds three arrays `a`, `b`, `c` of `n` f32 each. `delay` is the least
/// time a copy takes (the CPU twin's knob; zero elsewhere).
pub(super) fn check_copy_queue(be: &dyn Backend, delay: Duration) {
    let n = 4096;
    let arr = |k: usize| -> Vec<f32> { (0..n).map(|i| (k * n + i) as f32 + 0.5).collect() };
    let (a, b, c) = (arr(0), arr(1), arr(2));
    let mut host = be.alloc_host(3 * n * 4).unwrap();
    let bytes = host.bytes_mut().expect("allocated host memory is writable");
    for (k, v) in [&a, &b, &c].into_iter().enumerate() {
        bytes[k * n * 4..(k + 1) * n * 4].copy_from_slice(bytemuck::cast_slice(v));
    }
    let host = Arc::new(host);
    let zeros = vec![0f32; n];
    let dst = be.upload(&zeros, &[n]).unwrap();
    let dst2 = be.upload(&zeros, &[n]).unwrap();
    let q = be.copy_queue(2).unwrap();

    // Wait sees the copy recorded before it, not necessarily the ones after.
    let t0 = Instant::now();
    q.fork().unwrap();
    q.copy(&host, 0, &dst).unwrap();
    q.record(0).unwrap();
    q.copy(&host, n * 4, &dst2).unwrap();
    q.wait(0).unwrap();
    assert_eq!(f32s(be, &dst), a, "the copy recorded before the wait");
    assert!(
        t0.elapsed() >= delay,
        "the wait returned before the copy ran"
    );
    q.join().unwrap();
    assert_eq!(f32s(be, &dst2), b, "join waits for every copy");

    // Copies run in queue order: the last one into a tensor wins.
    q.fork().unwrap();
    q.copy(&host, 0, &dst).unwrap();
    q.copy(&host, 2 * n * 4, &dst).unwrap();
    q.join().unwrap();
    assert_eq!(f32s(be, &dst), c, "copies in queue order");

    // Captured: the copy, its event and the compute op waiting on it replay together.
    be.write(&dst, &zeros).unwrap();
    be.write(&dst2, &zeros).unwrap();
    be.begin_capture().unwrap();
    q.fork().unwrap();
    q.copy(&host, n * 4, &dst).unwrap();
    q.record(1).unwrap();
    q.wait(1).unwrap();
    be.copy(&dst, &dst2).unwrap();
    q.join().unwrap();
    let graph = be.end_capture().unwrap();
    be.synchronize().unwrap();
    assert_eq!(f32s(be, &dst), zeros, "a capture runs nothing");
    for replay in 0..2 {
        graph.replay().unwrap();
        be.synchronize().unwrap();
        assert_eq!(f32s(be, &dst), b, "replay {replay}: the copy");
        assert_eq!(f32s(be, &dst2), b, "replay {replay}: the op after the wait");
        be.write(&dst, &zeros).unwrap();
        be.write(&dst2, &zeros).unwrap();
    }

    // Misuse is an error naming it.
    let msg = q.record(2).unwrap_err().to_string();
    assert!(msg.contains("event 2"), "{msg}");
    let msg = q.copy(&host, 3 * n * 4 - 4, &dst).unwrap_err().to_string();
    assert!(msg.contains("outside"), "{msg}");
}

#[test]
fn the_cpu_copy_queue_orders_copies_waits_and_joins_eagerly_and_captured() {
    let delay = Duration::from_millis(20);
    let cpu = CpuBackend::with_copy_delay(delay);
    check_copy_queue(&cpu, delay);
    // A queue is made before a capture, not inside one.
    cpu.begin_capture().unwrap();
    let refused = cpu.copy_queue(1).err();
    cpu.end_capture().unwrap();
    assert!(
        matches!(refused, Some(Error::CaptureViolation { .. })),
        "{refused:?}"
    );
}
