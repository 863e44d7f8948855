//! Connection slots: at most so many connections are served at once, and at the limit the
//! oldest connection that has sent no request head makes room for a new one.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::Response,
};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::error_response;

/// The slots of one server: a permit per connection served, and the connections that may be
/// closed to make room.
#[derive(Debug)]
pub(super) struct Slots {
    free: Arc<Semaphore>,
    waiting: Arc<Waiting>,
    next_id: u64,
}

impl Slots {
    /// `max` slots, all free.
    pub(super) fn new(max: usize) -> Self {
        Self {
            free: Arc::new(Semaphore::new(max)),
            waiting: Arc::default(),
            next_id: 0,
        }
    }

    /// A free slot's permit, if there is one.
    pub(super) fn try_reserve(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.free).try_acquire_owned().ok()
    }

    /// A permit for a connection accepted at the limit. Room is made by closing the oldest
    /// connection that was read and holds no request head, now or as soon as there is one
    /// (one connection closed per call); else the next connection to end frees a slot.
    pub(super) async fn make_room(&self) -> OwnedSemaphorePermit {
        let mut evicted = self.waiting.evict_oldest();
        loop {
            tokio::select! {
                permit = Arc::clone(&self.free).acquire_owned() => {
                    return permit.expect("the slots are never closed");
                }
                () = self.waiting.joined.notified(), if !evicted => {
                    evicted = self.waiting.evict_oldest();
                }
            }
        }
    }

    /// The slot of a connection about to be served, holding `permit`.
    pub(super) fn slot(&mut self, permit: OwnedSemaphorePermit) -> Slot {
        self.next_id += 1;
        Slot {
            id: self.next_id,
            waiting: Arc::clone(&self.waiting),
            evict: CancellationToken::new(),
            admitted: AtomicBool::new(false),
            _permit: permit,
        }
    }
}

/// The connections that were read and hold no request head yet, by accept order, with the
/// token that closes each: the ones that may be closed to make room.
#[derive(Debug, Default)]
struct Waiting {
    conns: Mutex<BTreeMap<u64, CancellationToken>>,
    /// Told when a connection joins.
    joined: Notify,
}

impl Waiting {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, CancellationToken>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the oldest connection still waiting for its head; false when there is none.
    fn evict_oldest(&self) -> bool {
        match self.lock().pop_first() {
            Some((_, evict)) => {
                evict.cancel();
                true
            }
            None => false,
        }
    }
}

/// One connection's slot: its permit, and its place among the [`Waiting`] from the moment it
/// is found without a request head until the head arrives. Dropping it frees the slot.
#[derive(Debug)]
pub(super) struct Slot {
    id: u64,
    waiting: Arc<Waiting>,
    evict: CancellationToken,
    admitted: AtomicBool,
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    /// The connection was read and holds no complete request head: from now on it may be
    /// closed to make room (unless its head came meanwhile).
    pub(super) fn wait_for_head(&self) {
        let mut waiting = self.waiting.lock();
        if !self.admitted.load(Ordering::SeqCst) {
            waiting.insert(self.id, self.evict.clone());
            self.waiting.joined.notify_one();
        }
    }

    /// The request head is in: the connection can no longer be evicted. False when it was
    /// evicted first.
    pub(super) fn admit(&self) -> bool {
        let mut waiting = self.waiting.lock();
        self.admitted.store(true, Ordering::SeqCst);
        waiting.remove(&self.id);
        !self.evict.is_cancelled()
    }
}

impl Slot {
    /// Completes when the connection is chosen to make room.
    pub(super) async fn evicted(&self) {
        self.evict.cancelled().await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.waiting.lock().remove(&self.id);
    }
}

/// The answer to a request whose connection was chosen to make room just before its head came.
pub(super) fn evicted() -> Response {
    let mut response = error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "the agent is serving as many connections as it can; try again".into(),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_connections_found_without_a_head_make_room_oldest_first() {
        let mut slots = Slots::new(3);
        let admitted = slots.slot(slots.try_reserve().unwrap());
        let old = slots.slot(slots.try_reserve().unwrap());
        let young = slots.slot(slots.try_reserve().unwrap());
        assert!(slots.try_reserve().is_none());
        // Its head came at the first read: never a candidate.
        assert!(admitted.admit());
        admitted.wait_for_head();
        young.wait_for_head();
        old.wait_for_head();

        // Accept order decides, not the order they were found waiting.
        let room = tokio::spawn(async move { slots.make_room().await });
        old.evicted().await;
        assert!(!young.evict.is_cancelled() && !admitted.evict.is_cancelled());
        // Its head comes too late: the request is answered "try again".
        assert!(!old.admit());
        drop(old);
        let permit = room.await.unwrap();
        drop(permit);
        assert!(young.admit(), "the younger one was left alone");
    }

    #[tokio::test]
    async fn at_the_limit_room_is_made_once_a_connection_waits() {
        let mut slots = Slots::new(1);
        let fresh = slots.slot(slots.try_reserve().unwrap());
        let slots = Arc::new(slots);
        let room = {
            let slots = Arc::clone(&slots);
            tokio::spawn(async move { slots.make_room().await })
        };
        // Not read yet: not evicted. Once read and found without a head, it is.
        tokio::task::yield_now().await;
        assert!(!fresh.evict.is_cancelled());
        fresh.wait_for_head();
        fresh.evicted().await;
        drop(fresh);
        let _permit = room.await.unwrap();
    }
}
