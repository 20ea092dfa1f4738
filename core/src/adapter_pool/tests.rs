//! Tests of the adapter cache: host changes, refusals and evictions.

use super::*;

fn r(i: u64) -> RequestId {
    RequestId(i)
}

fn host_changes<const T: usize>(p: &mut AdapterPool<T>) -> heapless::Vec<(u64, HostChange), T> {
    let mut out = heapless::Vec::new();
    p.take_host_changes(&mut |t, c| out.push((t.id.0, c)).unwrap());
    out
}

#[test]
fn host_changes_tell_the_binding_what_to_write_and_free() {
    // Host room for two 2-page adapters.
    let mut p: AdapterPool<4> = AdapterPool::new(4, 4).unwrap();
    let a = p.register(TaskId(1), 2).unwrap();
    let b = p.register(TaskId(2), 2).unwrap();
    let c = p.register(TaskId(3), 2).unwrap();
    assert!(
        host_changes(&mut p).is_empty(),
        "registration loads nothing"
    );
    p.add_request(r(0), a, false).unwrap();
    p.add_request(r(1), b, false).unwrap();
    assert_eq!(
        host_changes(&mut p),
        [(1, HostChange::Filled), (2, HostChange::Filled)]
    );
    assert!(host_changes(&mut p).is_empty(), "the log is drained");
    // a finishes; c's lease evicts a's host copy (least recently used, nobody holds it).
    p.mark_request_done(r(0), a, false, AdapterHold::Lease);
    p.add_request(r(2), c, false).unwrap();
    assert_eq!(
        host_changes(&mut p),
        [(1, HostChange::Dropped), (3, HostChange::Filled)]
    );
    // Evicted and loaded again before the binding looks: free the old copy, write a new one.
    p.mark_request_done(r(1), b, false, AdapterHold::Lease);
    p.add_request(r(3), a, false).unwrap(); // evicts b
    p.mark_request_done(r(3), a, false, AdapterHold::Lease);
    p.mark_request_done(r(2), c, false, AdapterHold::Lease);
    p.add_request(r(4), b, false).unwrap(); // evicts a (last used before c), b comes back
    assert!(!p.tasks()[0].on_host && p.tasks()[1].on_host && p.tasks()[2].on_host);
    assert_eq!(
        host_changes(&mut p),
        [(2, HostChange::Replaced)],
        "a was loaded and evicted again unseen: nothing to write, nothing to free"
    );
    // A reload drops the host copy of a task nobody uses.
    p.mark_request_done(r(4), b, false, AdapterHold::Lease);
    p.reload(TaskId(2), 1).unwrap();
    assert_eq!(host_changes(&mut p), [(2, HostChange::Dropped)]);
    assert!(p.check());
}

#[test]
fn adapter_larger_than_cache_is_refused() {
    let mut p: AdapterPool<4> = AdapterPool::new(4, 8).unwrap();
    assert!(matches!(
        p.register(TaskId(1), 5),
        Err(PeftError::AdapterTooLarge { .. })
    ));
    assert!(p.tasks().is_empty(), "refusal changes nothing");
    p.register(TaskId(1), 4).unwrap();
    assert_eq!(
        p.register(TaskId(1), 1),
        Err(PeftError::DuplicateTask(TaskId(1)))
    );
}

#[test]
fn device_eviction_checks_sufficiency_first() {
    let mut p: AdapterPool<4> = AdapterPool::new(4, 16).unwrap();
    let a = p.register(TaskId(1), 2).unwrap();
    let b = p.register(TaskId(2), 2).unwrap();
    let c = p.register(TaskId(3), 3).unwrap();
    p.add_request(r(0), a, false).unwrap();
    p.add_request(r(1), b, false).unwrap();
    p.ensure_batch(&[a, b], &mut |_| {}).unwrap();
    assert_eq!(p.device_used(), 4);
    // a is done, b still active: only 2 pages obtainable, c needs 3 → refused, nothing evicted.
    p.mark_request_done(r(0), a, false, AdapterHold::Lease);
    p.add_request(r(2), c, false).unwrap();
    let err = p.ensure_batch(&[c], &mut |_| {}).unwrap_err();
    assert!(matches!(
        err,
        PeftError::DeviceCacheFull {
            needed: 3,
            obtainable: 2,
            ..
        }
    ));
    assert!(
        p.tasks()[0].on_device,
        "nothing was evicted by the refused claim"
    );
    // b pauses: now both are evictable and c fits.
    p.mark_request_done(r(1), b, true, AdapterHold::Lease);
    let mut loaded = 0;
    p.ensure_batch(&[c], &mut |_| loaded += 1).unwrap();
    assert_eq!(loaded, 1);
    let mut evicted = heapless::Vec::<u64, 4>::new();
    p.take_device_evictions(&mut |t| evicted.push(t.id.0).unwrap());
    assert_eq!(evicted, [1, 2]);
    let mut again = 0;
    p.take_device_evictions(&mut |_| again += 1);
    assert_eq!(again, 0, "the log is drained");
    assert!(p.check());
    // b is paused: its host copy stays.
    assert!(p.tasks()[1].on_host);
}

#[test]
fn host_copy_of_a_paused_task_is_not_evicted() {
    let mut p: AdapterPool<4> = AdapterPool::new(4, 4).unwrap();
    let a = p.register(TaskId(1), 4).unwrap();
    let b = p.register(TaskId(2), 4).unwrap();
    p.add_request(r(0), a, false).unwrap();
    p.mark_request_done(r(0), a, true, AdapterHold::Lease);
    assert_eq!(
        p.add_request(r(1), b, false),
        Err(PeftError::HostCacheFull(TaskId(2)))
    );
    p.mark_request_done(r(0), a, false, AdapterHold::Paused);
    p.add_request(r(1), b, false).unwrap();
    assert!(p.check());
}

/// A retired task drops its copies, is found no more, and gives its slot to the next registration
/// under a new version; a held one is refused.
#[test]
fn a_retired_task_gives_its_slot_to_the_next() {
    let mut p: AdapterPool<2> = AdapterPool::new(4, 4).unwrap();
    let a = p.register(TaskId(1), 2).unwrap();
    p.register(TaskId(2), 2).unwrap();
    assert_eq!(p.register(TaskId(3), 2), Err(PeftError::TaskTableFull));
    p.add_request(r(0), a, false).unwrap();
    assert_eq!(p.retire(TaskId(1)), Err(PeftError::TaskBusy(TaskId(1))));
    let _ = host_changes(&mut p);
    p.mark_request_done(r(0), a, false, AdapterHold::Lease);
    assert_eq!(p.retire(TaskId(1)), Ok(a));
    assert_eq!(host_changes(&mut p), [(1, HostChange::Dropped)]);
    assert_eq!(p.lookup(TaskId(1)), None);
    assert_eq!(p.retire(TaskId(1)), Err(PeftError::UnknownTask(TaskId(1))));
    let c = p.register(TaskId(3), 1).unwrap();
    assert_eq!(c.slot, a.slot, "the retired slot");
    assert_eq!(p.lookup(TaskId(3)), Some(c));
    assert_eq!((p.tasks()[0].version, p.tasks()[0].pages), (1, 1));
    assert!(p.check());
}
