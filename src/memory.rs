//! Giving memory back to the system after a burst, without paying for it on every request.
//!
//! mimalloc keeps freed pages for its purge delay (1 s) so that the next request reuses them, and
//! only purges (returns to the system) from its allocation slow path: a server that goes idle
//! after a burst of big pushes kept the burst's peak (docs/benchmarks-history.md,
//! "Memory under big pushes"). Purging at once instead (a delay of 0, as before) made every pull
//! page and export batch fault its buffers in again: a third of the server's CPU in an initial
//! sync went to page faults (docs/benchmarks-history.md, "The allocator's purge delay"). So the
//! delay stays, and this tick takes the slow path once a second: freeing a block too big for
//! mimalloc's shared pages frees its page, which purges whatever has waited longer than the
//! delay, from every thread.

use std::time::Duration;

const TICK: Duration = Duration::from_secs(1);
/// Above mimalloc's largest size class (512 KiB): a block of its own page.
const HUGE_BLOCK: usize = 1 << 20;

pub fn spawn_purge_tick(tasks: &crate::shutdown::Tasks) {
    tasks.spawn(async {
        let mut tick = tokio::time::interval(TICK);
        loop {
            tick.tick().await;
            // black_box keeps the allocation from being optimised away.
            drop(std::hint::black_box(Vec::<u8>::with_capacity(HUGE_BLOCK)));
        }
    });
}
