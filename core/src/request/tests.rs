//! Every numbered transition of the module's diagram on the real fixed-capacity backends: what each one
//! does to the KV pool and the adapter cache; the always-on activation checks; the drop bomb.

use super::*;
use crate::adapter::TaskRef;
use crate::adapter_pool::AdapterPool;
use crate::ids::TaskId;
use crate::page_pool::KvPool;
use crate::testing::{place, Small};

fn request(slot: u16, id: u64, task: Option<TaskRef>) -> Request<Waiting> {
    Request::new(
        Place {
            slot,
            task: crate::ids::TaskSlot::NONE,
            version: 0,
        },
        RequestId(id),
        task,
    )
}

fn task_state(desk: &AdapterDesk<AdapterPool<4>, 4>, t: TaskRef) -> (u32, u32, u32) {
    let e = desk.backend().tasks()[t.slot.index()];
    (desk.leases(t.slot), e.active, e.paused)
}

#[test]
fn every_transition_moves_exactly_what_it_owns() {
    let mut mem = Small::new();
    let mut kv = mem.pool(16, 4);
    let mut pool: AdapterPool<4> = AdapterPool::new(8, 8).unwrap();
    let t = pool.register(TaskId(7), 2).unwrap();
    let mut desk: AdapterDesk<AdapterPool<4>, 4> = AdapterDesk::new(pool);
    let w = request(0, 1, Some(t));
    let r = w.kv_ref();

    // (1) admit: the pass gave the first chunk its pages; the desk mints the lease for this request.
    place(&mut kv, r, 8);
    let active = w.admit(&mut kv, &mut desk).unwrap();
    assert_eq!(task_state(&desk, t), (1, 1, 0));
    assert_eq!(active.lease().unwrap().task_slot(), t.slot);
    assert_eq!(active.lease().unwrap().holder(), RequestId(1));

    // (2) suspend: pages move to the host tier, lease returned with pause.
    let paused = active.suspend(&mut kv, &mut desk);
    assert_eq!(task_state(&desk, t), (0, 0, 1));
    assert!(!kv.cache(r).is_active() && kv.cache(r).exists());
    assert_eq!(kv.gpu_free(), 16, "two pages moved down");
    assert_eq!(kv.take_moves().len(), 2);
    assert!(paused.paused_on().is_some());

    // (3) resume: KV back AND a fresh lease, consuming the paused registration.
    assert!(kv.try_allocate_generation(r, 1));
    let resumed = paused
        .resume(&mut kv, &mut desk, KvReturn::Generation)
        .unwrap();
    assert_eq!(task_state(&desk, t), (1, 1, 0));
    assert!(resumed.lease().is_some());
    // (5) settle, with the proof that the moves were taken.
    let active = resumed.settle(&MovesTaken::mint());

    // (4) recompute pause from Active: KV freed, lease returned with pause.
    let rc = active.recompute(&mut kv, &mut desk);
    assert_eq!(task_state(&desk, t), (0, 0, 1));
    assert!(!kv.cache(r).exists());
    assert_eq!(kv.gpu_free(), 16);

    // (6) replay: the replay's first chunk gets pages, then a new lease.
    place(&mut kv, r, 4);
    let active = rc.replay(&mut kv, &mut desk).unwrap();
    assert_eq!(task_state(&desk, t), (1, 1, 0));

    // (7) preempt: pages given up, lease returned with pause; (8) finish drops the paused registration.
    let rc = active.preempt(&mut kv, &mut desk);
    assert_eq!(task_state(&desk, t), (0, 0, 1));
    rc.finish(&mut kv, &mut desk);
    assert_eq!(task_state(&desk, t), (0, 0, 0));
    assert!(kv.check() && desk.backend().check());

    // (4) from Suspended<Paused>, and (8) finish of Active and of a Resumed.
    place(&mut kv, r, 8);
    let a = request(0, 1, Some(t)).admit(&mut kv, &mut desk).unwrap();
    let p = a.suspend(&mut kv, &mut desk);
    let rc = p.recompute(&mut kv);
    assert_eq!(task_state(&desk, t), (0, 0, 1), "paused for the replay");
    assert_eq!(kv.host_free(), 16, "host pages freed");
    rc.finish(&mut kv, &mut desk);
    place(&mut kv, r, 8);
    let a = request(0, 1, Some(t)).admit(&mut kv, &mut desk).unwrap();
    a.finish(&mut kv, &mut desk);
    assert_eq!(task_state(&desk, t), (0, 0, 0));
    assert_eq!(kv.gpu_free(), 16);
    assert!(kv.check() && desk.backend().check());
}

#[test]
fn activation_checks_refuse_without_active_kv_and_change_nothing() {
    let mut mem = Small::new();
    let mut kv = mem.pool(16, 4);
    let mut pool: AdapterPool<4> = AdapterPool::new(8, 8).unwrap();
    let t = pool.register(TaskId(7), 2).unwrap();
    let mut desk: AdapterDesk<AdapterPool<4>, 4> = AdapterDesk::new(pool);
    // (1) admit with no KV at all.
    let w = request(1, 5, Some(t));
    let refused = w.admit(&mut kv, &mut desk).unwrap_err();
    assert_eq!(refused.error, Error::NotOnGpu(RequestId(5)));
    assert_eq!(task_state(&desk, t), (0, 0, 0), "no adapter call");
    let w = refused.request;
    // (3) resume while the KV is still suspended.
    let r = w.kv_ref();
    place(&mut kv, r, 4);
    let p = w
        .admit(&mut kv, &mut desk)
        .unwrap()
        .suspend(&mut kv, &mut desk);
    let before = (kv.fingerprint(), task_state(&desk, t));
    let refused = p
        .resume(&mut kv, &mut desk, KvReturn::Generation)
        .unwrap_err();
    assert_eq!(refused.error, Error::NotOnGpu(RequestId(5)));
    assert_eq!((kv.fingerprint(), task_state(&desk, t)), before);
    // (6) replay before the replay's first chunk got pages.
    let rc = refused.request.recompute(&mut kv);
    let refused = rc.replay(&mut kv, &mut desk).unwrap_err();
    assert_eq!(refused.error, Error::NotOnGpu(RequestId(5)));
    refused.request.finish(&mut kv, &mut desk);
    assert_eq!(task_state(&desk, t), (0, 0, 0));
}

#[test]
fn a_refused_lease_changes_nothing_and_a_paused_host_copy_survives_pressure() {
    // Host adapter cache of 4 pages: tasks a and b (2 pages each) are pinned by paused requests, so c
    // cannot be stored on the host and its admission is refused, changing nothing.
    let mut mem = Small::new();
    let mut kv = mem.pool(16, 4);
    let mut pool: AdapterPool<4> = AdapterPool::new(4, 4).unwrap();
    let a = pool.register(TaskId(1), 2).unwrap();
    let b = pool.register(TaskId(2), 2).unwrap();
    let c = pool.register(TaskId(3), 2).unwrap();
    let mut desk: AdapterDesk<AdapterPool<4>, 4> = AdapterDesk::new(pool);
    let mut paused = heapless::Vec::<_, 2>::new();
    for (slot, t) in [(0u16, a), (1, b)] {
        let w = request(slot, u64::from(slot), Some(t));
        place(&mut kv, w.kv_ref(), 4);
        let act = w.admit(&mut kv, &mut desk).unwrap();
        assert!(paused.push(act.suspend(&mut kv, &mut desk)).is_ok());
    }
    let w = request(2, 2, Some(c));
    place(&mut kv, w.kv_ref(), 4);
    let before = desk.backend().clone();
    let refused = w.admit(&mut kv, &mut desk).unwrap_err();
    assert_eq!(
        refused.error,
        Error::Peft(crate::PeftError::HostCacheFull(TaskId(3)))
    );
    assert_eq!(
        *desk.backend(),
        before,
        "a refused admission changes nothing"
    );
    assert_eq!(desk.leases(c.slot), 0);
    refused.request.finish(&mut kv);
    // The paused requests' host copies were pinned, so both resumes succeed.
    for p in paused {
        let r = p.kv_ref();
        assert!(kv.try_allocate_generation(r, 1));
        let back = p.resume(&mut kv, &mut desk, KvReturn::Generation).unwrap();
        back.finish(&mut kv, &mut desk);
    }
    assert_eq!(kv.gpu_free(), 16);
    assert!(kv.check() && desk.backend().check());
}

fn admitted(kv: &mut KvPool<'_>, desk: &mut AdapterDesk<AdapterPool<4>, 4>) -> Request<Active> {
    let w = request(0, 3, None);
    place(kv, w.kv_ref(), 4);
    w.admit(kv, desk).unwrap()
}

#[test]
#[cfg(all(feature = "std", debug_assertions))]
#[should_panic(expected = "dropped while it still owns resources")]
fn dropping_an_active_request_is_caught() {
    let mut mem = Small::new();
    let mut kv = mem.pool(0, 4);
    let mut desk = AdapterDesk::new(AdapterPool::new(4, 4).unwrap());
    drop(admitted(&mut kv, &mut desk));
}

#[test]
#[cfg(feature = "std")]
fn the_drop_bomb_stays_quiet_while_unwinding() {
    extern crate std;
    // A panic while a request is held must unwind normally (a second panic would abort the process).
    let caught = std::panic::catch_unwind(|| {
        let mut mem = Small::new();
        let mut kv = mem.pool(0, 4);
        let mut desk = AdapterDesk::new(AdapterPool::new(4, 4).unwrap());
        let _active = admitted(&mut kv, &mut desk);
        panic!("engine failure");
    });
    assert!(caught.is_err());
}
