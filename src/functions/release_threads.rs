//! The threads a grouped call's releases are drawn on: up to a thread per core, started for the
//! call, the caller's thread working too. How many releases are drawn at once depends only on how
//! many groups there are (declared or selected: public) and on the machine.
//!
//! The kernel sometimes leaves a thread started this way on the busy core that started it while
//! the other core is idle (`docs/performance.md`, "The releases' threads": 2 of 12 unit queries
//! drew their 100 releases on one core). One long-lived pool of threads avoided that but was not
//! kept: a pool queues one call's releases behind another's (a session with many groups would
//! hold up every other session's grouped releases until its own are drawn), where threads of
//! each call share the cores with everyone else's.

use std::sync::Mutex;

use datafusion::common::Result;

/// Threads [`in_parallel`] uses for `items` items, at least `per_thread` each.
pub(crate) fn threads_for(items: usize, per_thread: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.min(items / per_thread.max(1)).max(1)
}

/// `work` over consecutive parts of `items` (at least `per_thread` each) on up to
/// [`threads_for`] threads, results concatenated in order. The calling thread works too, taking
/// parts from the same queue, so a thread that cannot be started makes the work slower, never
/// fail. The first part's error (in order) is the result; a panic in a part panics the caller.
pub(crate) fn in_parallel<T: Send, R: Send>(
    items: &mut [T],
    per_thread: usize,
    work: impl Fn(&mut [T]) -> Result<Vec<R>> + Sync,
) -> Result<Vec<R>> {
    let threads = threads_for(items.len(), per_thread);
    if threads == 1 {
        return work(items);
    }
    let parts: Vec<_> = items.chunks_mut(items.len().div_ceil(threads)).enumerate().collect();
    let done: Mutex<Vec<Option<Result<Vec<R>>>>> = Mutex::new(parts.iter().map(|_| None).collect());
    let queue = Mutex::new(parts);
    let run = || {
        loop {
            // (A statement of its own: the queue is unlocked while the part is worked on.)
            let next = queue.lock().expect("release queue").pop();
            let Some((i, part)) = next else { break };
            let results = work(part);
            done.lock().expect("release results")[i] = Some(results);
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            // Not started (a thread limit): the others take its parts.
            let _ = std::thread::Builder::new().name("dpcurve-release".into()).spawn_scoped(scope, run);
        }
        run();
    });
    let mut out = Vec::new();
    for results in done.into_inner().expect("release results") {
        out.extend(results.expect("every part ran")?);
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
