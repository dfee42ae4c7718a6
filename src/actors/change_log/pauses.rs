//! Test only (debug builds, which is what `cargo test` builds; a release build has none of this):
//! holds one of this server's commits at a named point until the test lets it go, so that a test
//! stages an order of commits for certain (a group held after planning, another written ahead of
//! it, a third process taking the lock in between) instead of watching the database for signs of
//! it. Nothing is held unless a test arms a point.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

/// Where a commit can be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// A group committed the usual way has planned: it holds the change-log lock, its change_ids
    /// are decided and a group may be written ahead of it; nothing of it is written yet.
    Planned,
    /// A group written ahead has written its rows and results (uncommitted) and is about to wait
    /// for the commit before it.
    WroteAhead,
    /// A group written ahead has heard how the commit before it ended, and is about to try the
    /// lock (or to give up, if that commit failed).
    Told,
    /// A group written ahead gave up (and the group ahead of it, if any, has been told) and is
    /// about to be committed the usual way: it will wait for the lock.
    Redo,
}

/// The points armed by tests, each catching the next commit that reaches it.
#[derive(Clone, Default)]
pub struct Pauses(Arc<Mutex<Vec<Armed>>>);

/// An armed point, and where to tell the test that a commit is held there.
type Armed = (Point, oneshot::Sender<Held>);

/// An armed point: [`Gate::reached`] waits for the commit it catches.
pub struct Gate(oneshot::Receiver<Held>);

/// A commit held at a point, until [`Held::release`] (or until this is dropped).
#[derive(Debug)]
pub struct Held(oneshot::Sender<()>);

impl Pauses {
    /// The next commit to reach `point` stops there.
    pub fn arm(&self, point: Point) -> Gate {
        let (reached, gate) = oneshot::channel();
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push((point, reached));
        Gate(gate)
    }

    /// Holds the caller here if a test armed `point`.
    pub(super) async fn pass(&self, point: Point) {
        let armed = {
            let mut armed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            let at = armed.iter().position(|(p, _)| *p == point);
            at.map(|at| armed.remove(at).1)
        };
        let Some(reached) = armed else { return };
        let (release, released) = oneshot::channel();
        if reached.send(Held(release)).is_ok() {
            let _ = released.await;
        }
    }
}

impl Gate {
    /// Waits until a commit is held at the point; `None` if the server stopped first.
    pub async fn reached(self) -> Option<Held> {
        self.0.await.ok()
    }
}

impl Held {
    /// Lets the commit go on.
    pub fn release(self) {
        let _ = self.0.send(());
    }
}
