//! The threads a grouped call's releases are drawn on: one long-lived pool, a thread per core,
//! started on first use.
//!
//! Threads started for each call were sometimes placed by the kernel on the core that started
//! them while the other was idle (on this project's 2-core VM, 100 Gaussian releases then took
//! 42–44 ms on one core instead of 23–27 ms on two: `docs/performance.md`, "The releases'
//! threads"); a pool's threads are woken, and a woken thread goes to an idle core. How many releases are
//! drawn at once depends only on how many groups there are (declared or selected: public) and
//! on the machine.

use std::sync::OnceLock;

use datafusion::common::Result;
use rayon::prelude::*;

/// Threads [`in_parallel`] uses for `items` items, at least `per_thread` each.
pub(crate) fn threads_for(items: usize, per_thread: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.min(items / per_thread.max(1)).max(1)
}

/// The pool, a thread per core; None where it could not be started (a thread limit): the
/// caller's thread then does the work, slower, never failing.
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads_for(usize::MAX, 1))
            .thread_name(|i| format!("dpcurve-release-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// `work` over consecutive parts of `items` (at least `per_thread` each) on up to
/// [`threads_for`] of the pool's threads, results concatenated in order; on the caller's thread
/// when there is one part or no pool. The first part's error (in order) is the result; a panic
/// in a part panics the caller.
pub(crate) fn in_parallel<T: Send, R: Send>(
    items: &mut [T],
    per_thread: usize,
    work: impl Fn(&mut [T]) -> Result<Vec<R>> + Sync,
) -> Result<Vec<R>> {
    let threads = threads_for(items.len(), per_thread);
    let pool = match pool() {
        Some(pool) if threads > 1 => pool,
        _ => return work(items),
    };
    let part = items.len().div_ceil(threads);
    let results: Vec<Result<Vec<R>>> = pool.install(|| items.par_chunks_mut(part).map(&work).collect());
    let mut out = Vec::with_capacity(items.len());
    for result in results {
        out.extend(result?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_parts_run_on_several_threads_and_come_back_in_order() {
        // Each part sleeps a while, so a second thread has time to take the other part; the
        // results keep the items' order, whichever thread computed them.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut items: Vec<u32> = (0..100).collect();
        let out = in_parallel(&mut items, 8, |part| {
            std::thread::sleep(std::time::Duration::from_millis(part.len() as u64));
            let me = std::thread::current().id();
            Ok(part.iter().map(|&i| (i * 2, me)).collect())
        })
        .unwrap();
        assert_eq!(out.iter().map(|o| o.0).collect::<Vec<_>>(), (0..100).map(|i| i * 2).collect::<Vec<_>>());
        let threads: std::collections::HashSet<_> = out.iter().map(|o| o.1).collect();
        assert_eq!(threads.len(), cores.min(100 / 8), "the parts ran on {} threads", threads.len());
        if cores > 1 {
            // The pool's threads, not the caller's; and the same threads the next time.
            assert!(!threads.contains(&std::thread::current().id()));
            let again = in_parallel(&mut items, 8, |part| {
                std::thread::sleep(std::time::Duration::from_millis(part.len() as u64));
                Ok(part.iter().map(|_| std::thread::current().id()).collect())
            })
            .unwrap();
            let again: std::collections::HashSet<_> = again.into_iter().collect();
            assert_eq!(again, threads, "a new call reuses the pool's threads");
        }
        // Too few items for a second thread: all on the caller's.
        let mut few = [1u32; 9];
        let out =
            in_parallel(&mut few, 8, |part| Ok(part.iter().map(|_| std::thread::current().id()).collect())).unwrap();
        assert!(out.iter().all(|&t| t == std::thread::current().id()));
        // An error in a part is the result.
        let e = in_parallel(&mut items, 8, |part| {
            if part.contains(&99) { Err(datafusion::common::DataFusionError::Plan("no".into())) } else { Ok(vec![()]) }
        });
        assert!(e.is_err());
    }
}
