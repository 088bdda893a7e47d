//! Work shared among workers, one thread each (one per GPU with `--devices`;
//! docs/DESIGN.md "Several GPUs").
//!
//! - Items wait in one queue, the costliest first (longest-processing-time first, as
//!   flashinfer's test sharding does with recorded durations; here the cost is predicted):
//!   a worker that is free takes the next, so a long item is never left for last.
//! - An item runs whole on the worker that took it.
//! - Results come back in the items' own order, whichever worker ran them, so files merged
//!   from several workers read as one worker's would.
//! - The first error stops the workers from taking more items; it is returned once the
//!   running items have finished.
//! - Workers report progress through `emit`; the caller's thread receives each report, with
//!   the index of the worker that sent it, while the work runs.
//! - With several workers, each runs its items inside a rayon pool of its own, an equal share
//!   of the host's threads: one worker's long host work (a problem's references on every core)
//!   never queues another's short tasks in a shared pool. Alone, a worker uses the global pool.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

/// The host threads each of `workers` workers computes with: the global pool's, alone; an
/// equal share of them, at least 2, each in a pool of its own ([`run`]), when several.
pub fn threads_per_worker(workers: usize) -> usize {
    let all = rayon::current_num_threads();
    if workers > 1 {
        (all / workers).max(2)
    } else {
        all
    }
}

/// The order in which items are taken: by falling `cost`, ties in the items' own order.
pub fn queue_order(costs: &[u128]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by(|&a, &b| costs[b].cmp(&costs[a]).then(a.cmp(&b)));
    order
}

/// Runs `work(worker, item, emit)` for every item on `workers.len()` threads and returns the
/// results in the order of `items`; `on_report(worker index, report)` runs on the calling
/// thread for each `emit` as it arrives. One worker runs on the calling thread itself, in the
/// items' own order.
pub fn run<W, T, R, E, P>(
    workers: &mut [W],
    items: &[T],
    costs: &[u128],
    work: impl Fn(&mut W, &T, &dyn Fn(P)) -> Result<R, E> + Sync,
    mut on_report: impl FnMut(usize, P),
) -> Result<Vec<R>, E>
where
    W: Send,
    T: Sync,
    R: Send,
    E: Send,
    P: Send,
{
    assert_eq!(items.len(), costs.len(), "one cost per item");
    if let [worker] = workers {
        // Alone, a worker keeps the items' own order: nothing to balance, and rows print in
        // the order asked for.
        let on_report = std::cell::RefCell::new(&mut on_report);
        let emit = |p: P| (on_report.borrow_mut())(0, p);
        return items.iter().map(|item| work(worker, item, &emit)).collect();
    }
    assert!(!workers.is_empty(), "at least one worker");
    let queue = Mutex::new(queue_order(costs).into_iter());
    let stop = AtomicBool::new(false);
    let done: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    let first_error: Mutex<Option<E>> = Mutex::new(None);
    let (reports, received) = mpsc::channel::<(usize, P)>();
    let share = threads_per_worker(workers.len());
    std::thread::scope(|scope| {
        for (index, worker) in workers.iter_mut().enumerate() {
            let reports = reports.clone();
            let (queue, stop, done, first_error, work) =
                (&queue, &stop, &done, &first_error, &work);
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(share)
                .thread_name(move |i| format!("worker-{index}-host-{i}"))
                .build();
            scope.spawn(move || {
                let _stop_on_panic = StopOnPanic(stop);
                let mut body = move || {
                    let emit = |p: P| {
                        // The receiver lives until every worker has ended.
                        let _ = reports.send((index, p));
                    };
                    let mut taken = 0usize;
                    while !stop.load(Ordering::SeqCst) {
                        let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                        let Some(item) = next else { break };
                        taken += 1;
                        match work(worker, &items[item], &emit) {
                            Ok(r) => done.lock().unwrap_or_else(|e| e.into_inner())[item] = Some(r),
                            Err(e) => {
                                stop.store(true, Ordering::SeqCst);
                                first_error
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .get_or_insert(e);
                            }
                        }
                    }
                    crate::trace::mark(|| format!("worker {index}: idle after {taken} items"));
                };
                // A pool that cannot be made (no threads left) leaves the global one.
                match pool {
                    Ok(pool) => pool.install(body),
                    Err(_) => body(),
                }
            });
        }
        drop(reports);
        let _stop_on_panic = StopOnPanic(&stop);
        // Ends when the last worker has dropped its sender.
        for (worker, report) in received {
            on_report(worker, report);
        }
    });
    if let Some(e) = first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    Ok(done
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.expect("every item ran, or an error was returned"))
        .collect())
}

/// Stops every worker from taking another item when the thread holding it panics (the
/// panic then surfaces once the running items have finished, not after the whole queue).
struct StopOnPanic<'a>(&'a AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[test]
    fn a_lone_worker_has_every_thread_and_several_share_them_at_least_two_each() {
        let all = rayon::current_num_threads();
        assert_eq!(threads_per_worker(1), all);
        assert_eq!(threads_per_worker(2), (all / 2).max(2));
        assert_eq!(threads_per_worker(10 * all), 2);
    }

    #[test]
    fn the_queue_takes_the_costliest_first_and_ties_in_their_own_order() {
        assert_eq!(queue_order(&[1, 9, 4, 9, 0]), vec![1, 3, 2, 0, 4]);
        assert_eq!(queue_order(&[]), Vec::<usize>::new());
    }

    #[test]
    fn results_come_back_in_the_items_order_whichever_worker_ran_them() {
        let items: Vec<u64> = (0..40).collect();
        let costs: Vec<u128> = items.iter().map(|&i| (i * 7 % 13) as u128).collect();
        let mut workers = vec![0usize; 3];
        let mut reports = vec![0usize; 3];
        let out = run(
            &mut workers,
            &items,
            &costs,
            |ran: &mut usize, &i, emit| {
                *ran += 1;
                emit(i);
                std::thread::sleep(Duration::from_millis(i % 3));
                Ok::<_, ()>(i * i)
            },
            |w, _| reports[w] += 1,
        )
        .unwrap();
        assert_eq!(out, items.iter().map(|i| i * i).collect::<Vec<_>>());
        assert_eq!(workers.iter().sum::<usize>(), 40);
        assert_eq!(
            reports, workers,
            "each report names the worker that sent it"
        );
    }

    #[test]
    fn each_of_several_workers_runs_its_items_in_a_rayon_pool_of_its_own() {
        let items: Vec<u64> = (0..8).collect();
        let costs = vec![1u128; items.len()];
        // Each worker records the pool thread names its items and their parallel tasks saw.
        // Each worker's first item waits for the other's, so both take items.
        let both = std::sync::Barrier::new(2);
        let mut workers: Vec<Vec<String>> = vec![Vec::new(); 2];
        run(
            &mut workers,
            &items,
            &costs,
            |seen: &mut Vec<String>, _, _| {
                use rayon::prelude::*;
                if seen.is_empty() {
                    both.wait();
                }
                let names: Vec<String> = (0..64)
                    .into_par_iter()
                    .map(|_| std::thread::current().name().unwrap_or("").to_string())
                    .collect();
                seen.extend(names);
                seen.push(std::thread::current().name().unwrap_or("").to_string());
                Ok::<_, ()>(())
            },
            |_, _: ()| {},
        )
        .unwrap();
        for (index, seen) in workers.iter().enumerate() {
            let own = format!("worker-{index}-host-");
            assert!(!seen.is_empty());
            assert!(
                seen.iter().all(|name| name.starts_with(&own)),
                "worker {index} ran on threads {seen:?}"
            );
        }
    }

    #[test]
    fn every_worker_takes_items_while_others_are_busy() {
        // Four items that each wait until a second item is running: one worker alone would
        // never see two at once.
        let running = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let mut workers = vec![(); 2];
        run(
            &mut workers,
            &[0, 1, 2, 3],
            &[1, 1, 1, 1],
            |_, _, _: &dyn Fn(())| {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(30));
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, ()>(())
            },
            |_, _| {},
        )
        .unwrap();
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn several_workers_start_the_costliest_items_first_and_one_keeps_their_order() {
        // Each worker's first item is dequeued before any other: with two workers, the two
        // costliest start first, whichever thread logs first.
        let started = Mutex::new(Vec::new());
        let log = |_: &mut (), name: &&'static str, _: &dyn Fn(())| {
            started.lock().unwrap().push(*name);
            std::thread::sleep(Duration::from_millis(20));
            Ok::<_, ()>(())
        };
        let (items, costs) = (["short", "long", "middle", "tiny"], [5, 100, 10, 1]);
        run(&mut [(), ()], &items, &costs, log, |_, _| {}).unwrap();
        let mut first_two = started.lock().unwrap()[..2].to_vec();
        first_two.sort();
        assert_eq!(first_two, ["long", "middle"]);
        started.lock().unwrap().clear();
        run(&mut [()], &items, &costs, log, |_, _| {}).unwrap();
        assert_eq!(*started.lock().unwrap(), items);
    }

    #[test]
    fn an_error_stops_further_items_and_is_returned() {
        for workers in [1, 2] {
            let ran = AtomicUsize::new(0);
            let mut pool = vec![(); workers];
            let out = run(
                &mut pool,
                &[0, 1, 2, 3, 4, 5, 6, 7],
                &[8, 7, 6, 5, 4, 3, 2, 1],
                |_, &i, _: &dyn Fn(())| {
                    ran.fetch_add(1, Ordering::SeqCst);
                    if i == 1 {
                        Err(format!("item {i} faulted"))
                    } else {
                        std::thread::sleep(Duration::from_millis(20));
                        Ok(i)
                    }
                },
                |_, _| {},
            );
            assert_eq!(out, Err("item 1 faulted".to_string()));
            // One worker stops at once; with two, the other finishes the item it holds and
            // takes at most one more that it had already dequeued.
            assert!(
                ran.load(Ordering::SeqCst) <= 2 * workers,
                "{workers} workers ran {} items",
                ran.load(Ordering::SeqCst)
            );
        }
    }

    #[test]
    fn a_panic_in_a_worker_stops_the_others_and_surfaces() {
        let ran = AtomicUsize::new(0);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut pool = vec![(); 2];
            // 200 items of 5 ms: a drained queue takes a second on the other worker; the
            // panic hook (a backtrace) may take a fraction of that before the stop is set.
            let items: Vec<usize> = (0..200).collect();
            let _ = run(
                &mut pool,
                &items,
                &vec![1; 200],
                |_, &i, _: &dyn Fn(())| {
                    ran.fetch_add(1, Ordering::SeqCst);
                    if i == 0 {
                        panic!("planted");
                    }
                    std::thread::sleep(Duration::from_millis(5));
                    Ok::<_, ()>(())
                },
                |_, _| {},
            );
        }));
        assert!(caught.is_err(), "the panic surfaces");
        assert!(
            ran.load(Ordering::SeqCst) < 150,
            "the queue was drained: {} items ran",
            ran.load(Ordering::SeqCst)
        );
    }

    #[test]
    fn one_worker_runs_on_the_calling_thread() {
        let caller = std::thread::current().id();
        let mut one = vec![()];
        let threads = run(
            &mut one,
            &[0, 1],
            &[1, 1],
            |_, _, emit| {
                emit(());
                Ok::<_, ()>(std::thread::current().id())
            },
            |_, _| assert_eq!(std::thread::current().id(), caller),
        )
        .unwrap();
        assert_eq!(threads, [caller, caller]);
    }
}
