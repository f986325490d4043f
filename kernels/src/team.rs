//! A small team of threads for the generation step's many short parallel
//! regions.
//!
//! A one-sequence decode step of a small model is ~120 parallel regions of
//! a few tens of microseconds each (four matrix products a layer, attention,
//! the output projection). On rayon's pool the helper threads go to sleep in
//! the gaps between regions and each region starts with a futex wake-up: a
//! perf profile put 15% of a SmolLM2 decode in the kernel's scheduler. A
//! team's workers instead spin (`spin_loop`, then `yield_now`) while jobs
//! come back to back, so a region starts in well under a microsecond, and
//! park on a condition variable only after [`IDLE_SPIN`] without work (as
//! llama.cpp's thread pool keeps its threads at a spinning barrier).
//!
//! [`Team::run`] runs one closure for every member index at once and
//! returns when all have finished; a panic in any member is raised again in
//! the caller. Jobs do not nest.
//!
//! A member index is a share of the work, not a thread: threads claim
//! indices from one atomic word (the job's epoch and the next unclaimed
//! index, so a thread late from the last job cannot claim in this one), the
//! caller taking index 0 and then, like any worker, whatever is left. On a
//! machine with more runnable threads than cores a worker may not be
//! scheduled for milliseconds; its share is then run by whoever is free
//! instead of being waited for, and a step never waits on a thread that has
//! not started its part.

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins for the next job before it parks.
pub const IDLE_SPIN: Duration = Duration::from_millis(2);

/// Spins before a waiting thread starts yielding its CPU (a peer that is
/// descheduled gets the core back sooner).
const SPINS_BEFORE_YIELD: u32 = 1 << 12;

/// A job as workers see it: the caller's closure with its lifetime erased.
/// Sound because [`Team::run`] does not return (or unwind) before every
/// worker has finished with it.
type Job = *const (dyn Fn(usize) + Sync);

/// Bits of [`Shared::claims`] that hold the next unclaimed member index;
/// the bits above hold the job's epoch.
const INDEX_BITS: u32 = 16;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

fn epoch_of(claims: u64) -> u64 {
    claims >> INDEX_BITS
}

struct Shared {
    size: usize,
    /// The current job's epoch (bumped once per job) and its next unclaimed
    /// member index, in one word: a claim is a compare-and-swap that names
    /// the epoch, so it can only succeed for the job it was meant for.
    claims: AtomicU64,
    /// Written by the caller only while no worker reads it (before the
    /// epoch moves, after `pending` reaches 0).
    job: UnsafeCell<Option<Job>>,
    /// Member indices of the current job not yet finished, index 0 (the
    /// caller's) excluded.
    pending: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// Workers parked on `wake`.
    sleeping: AtomicUsize,
    park: Mutex<()>,
    wake: Condvar,
    /// Tests hold workers here, as a busy machine's scheduler might.
    #[cfg(test)]
    stalled: AtomicBool,
}

// SAFETY: `job` is the only field that is not Sync; see its comment and
// `Job`'s: writes and reads of it are ordered by `claims` and `pending`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// `size - 1` worker threads plus the caller of [`Team::run`].
pub struct Team {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// One job at a time.
    running: Mutex<()>,
}

impl Team {
    /// A team of `size` members (at least 1): `size - 1` threads are
    /// spawned, named `sluice-team-N`.
    pub fn new(size: usize) -> std::io::Result<Team> {
        let size = size.clamp(1, INDEX_MASK as usize);
        let shared = Arc::new(Shared {
            size,
            claims: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            park: Mutex::new(()),
            wake: Condvar::new(),
            #[cfg(test)]
            stalled: AtomicBool::new(false),
        });
        let mut workers = Vec::with_capacity(size - 1);
        for thread in 1..size {
            let shared = Arc::clone(&shared);
            workers.push(
                std::thread::Builder::new()
                    .name(format!("sluice-team-{thread}"))
                    .spawn(move || work(&shared))?,
            );
        }
        Ok(Team {
            shared,
            workers,
            running: Mutex::new(()),
        })
    }

    /// Members, the caller of [`Team::run`] included.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// Runs `job(member)` for every member `0..size` at once and returns
    /// when all have returned; each index runs exactly once, on whichever
    /// thread claims it (the caller runs index 0 first). A panic in any
    /// member panics here, after the others have finished. `job` must not
    /// call `run` on the same team, and its members must not wait on one
    /// another (one thread may run several of them in turn).
    pub fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        let shared = &*self.shared;
        if shared.size == 1 {
            job(0);
            return;
        }
        let _one_at_a_time = self.running.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: no worker reads `job` now (the last job's `pending`
        // reached 0 before its `run` returned, and no claim of that job can
        // succeed any more), and this `run` waits for every claimed member
        // before returning, so the erased lifetime outlives every use.
        unsafe {
            let erased: Job = std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(job);
            *shared.job.get() = Some(erased);
        }
        shared.pending.store(shared.size - 1, Ordering::SeqCst);
        let epoch = epoch_of(shared.claims.load(Ordering::Relaxed)) + 1;
        // Index 0 is the caller's, claimed with the publication.
        shared
            .claims
            .store((epoch << INDEX_BITS) | 1, Ordering::SeqCst);
        if shared.sleeping.load(Ordering::SeqCst) > 0 {
            let _guard = shared.park.lock().unwrap_or_else(|e| e.into_inner());
            shared.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| job(0)));
        // What no worker has started yet, the caller runs itself.
        run_claimed(shared, epoch, job);
        wait_until(|| shared.pending.load(Ordering::Acquire) == 0);
        // SAFETY: every worker has finished with the job.
        unsafe { *shared.job.get() = None };
        if let Err(panic) = mine {
            shared.panicked.store(false, Ordering::SeqCst);
            resume_unwind(panic);
        }
        if shared.panicked.swap(false, Ordering::SeqCst) {
            panic!("a member of the kernels' thread team panicked");
        }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.park.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// Spins on `done`, yielding the CPU after a while.
fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        if spins < SPINS_BEFORE_YIELD {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Claims the job `epoch`'s unclaimed member indices one at a time and
/// runs each, until none is left (or the job is no longer `epoch`).
fn run_claimed(shared: &Shared, epoch: u64, job: &(dyn Fn(usize) + Sync)) {
    while let Some(member) = claim(shared, epoch) {
        if catch_unwind(AssertUnwindSafe(|| job(member))).is_err() {
            shared.panicked.store(true, Ordering::SeqCst);
        }
        shared.pending.fetch_sub(1, Ordering::Release);
    }
}

/// The next unclaimed member index of job `epoch`, now this thread's.
fn claim(shared: &Shared, epoch: u64) -> Option<usize> {
    let mut claims = shared.claims.load(Ordering::Acquire);
    loop {
        let next = (claims & INDEX_MASK) as usize;
        if epoch_of(claims) != epoch || next >= shared.size {
            return None;
        }
        match shared.claims.compare_exchange_weak(
            claims,
            claims + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Some(next),
            Err(now) => claims = now,
        }
    }
}

fn work(shared: &Shared) {
    let mut seen = 0u64;
    loop {
        let mut idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            if shared.shutdown.load(Ordering::Acquire) {
                return;
            }
            let epoch = epoch_of(shared.claims.load(Ordering::Acquire));
            if epoch != seen {
                seen = epoch;
                break;
            }
            spins += 1;
            if spins < SPINS_BEFORE_YIELD {
                std::hint::spin_loop();
                continue;
            }
            if idle_since.elapsed() < IDLE_SPIN {
                std::thread::yield_now();
                continue;
            }
            let mut guard = shared.park.lock().unwrap_or_else(|e| e.into_inner());
            shared.sleeping.fetch_add(1, Ordering::SeqCst);
            while epoch_of(shared.claims.load(Ordering::SeqCst)) == seen
                && !shared.shutdown.load(Ordering::SeqCst)
            {
                guard = shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            shared.sleeping.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
            idle_since = Instant::now();
            spins = 0;
        }
        #[cfg(test)]
        while shared.stalled.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Claim before reading the job: a claim of epoch `seen` succeeds
        // only while that job is published and unfinished (its `pending`
        // cannot reach 0 before this claimed member is done).
        while let Some(member) = claim(shared, seen) {
            // SAFETY: the claim (Acquire) saw the caller's publication, which
            // the job's store precedes, and the caller will not clear the job
            // until `pending` is 0, which waits for this member.
            let job = unsafe { (*shared.job.get()).map(|j| &*j) };
            if let Some(job) = job
                && catch_unwind(AssertUnwindSafe(|| job(member))).is_err()
            {
                shared.panicked.store(true, Ordering::SeqCst);
            }
            shared.pending.fetch_sub(1, Ordering::Release);
        }
    }
}

/// A member's part, locked (a panic in another member's job does not
/// poison it for this one).
pub fn take<T>(part: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    part.lock().unwrap_or_else(|e| e.into_inner())
}

/// `buf` cut into consecutive parts of the given lengths, each behind its
/// own (uncontended) lock, for a job's members to take one each.
pub fn parts_mut<T>(
    mut buf: &mut [T],
    lens: impl IntoIterator<Item = usize>,
) -> Vec<Mutex<&mut [T]>> {
    lens.into_iter()
        .map(|len| {
            let (part, tail) = std::mem::take(&mut buf).split_at_mut(len);
            buf = tail;
            Mutex::new(part)
        })
        .collect()
}

/// One share of the columns of a row-major matrix, writable from its own
/// thread while other threads write the other shares ([`Columns::split`]):
/// how the members of a product write its `[tokens, rows]` output in place,
/// each its own rows of the weight matrix.
pub struct Columns<'a> {
    ptr: *mut f32,
    rows: usize,
    ld: usize,
    cols: std::ops::Range<usize>,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: a `Columns` writes only inside its own column range, and `split`
// hands out disjoint ranges of a matrix it borrows mutably for their life.
unsafe impl Send for Columns<'_> {}

impl<'a> Columns<'a> {
    /// `out` (`[rows, ld]`) cut into the column ranges `shares`, which must
    /// be in order, disjoint and inside `0..ld`.
    pub fn split(
        out: &'a mut [f32],
        ld: usize,
        shares: &[std::ops::Range<usize>],
    ) -> Vec<Columns<'a>> {
        assert!(ld > 0 && out.len().is_multiple_of(ld));
        let mut end = 0;
        for cols in shares {
            assert!(cols.start >= end && cols.start <= cols.end && cols.end <= ld);
            end = cols.end;
        }
        let rows = out.len() / ld;
        let ptr = out.as_mut_ptr();
        shares
            .iter()
            .map(|cols| Columns {
                ptr,
                rows,
                ld,
                cols: cols.clone(),
                _out: std::marker::PhantomData,
            })
            .collect()
    }

    /// `out[row][col] = v`; panics outside this share.
    #[inline(always)]
    pub fn set(&mut self, row: usize, col: usize, v: f32) {
        assert!(row < self.rows && col >= self.cols.start && col < self.cols.end);
        // SAFETY: in bounds (checked), and no other `Columns` of the same
        // split writes this column.
        unsafe { *self.ptr.add(row * self.ld + col) = v }
    }
}

/// The part of `0..len` that member `member` of `members` takes: contiguous
/// shares whose sizes differ by at most `align` and whose starts are
/// multiples of `align`.
pub fn share(len: usize, members: usize, member: usize, align: usize) -> std::ops::Range<usize> {
    let units = len.div_ceil(align);
    let (per, extra) = (units / members, units % members);
    let start = member * per + member.min(extra);
    let end = start + per + usize::from(member < extra);
    (start * align).min(len)..(end * align).min(len)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_member_runs_each_job_once() {
        for size in 1..=4 {
            let team = Team::new(size).unwrap();
            for _ in 0..1000 {
                let counts: Vec<AtomicUsize> = (0..size).map(|_| AtomicUsize::new(0)).collect();
                team.run(&|m| {
                    counts[m].fetch_add(1, Ordering::Relaxed);
                });
                assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn a_job_does_not_wait_for_workers_that_are_not_running() {
        let team = Arc::new(Team::new(4).unwrap());
        team.shared.stalled.store(true, Ordering::SeqCst);
        let (done, finished) = std::sync::mpsc::channel();
        let caller = {
            let team = Arc::clone(&team);
            std::thread::spawn(move || {
                let me = std::thread::current().id();
                let ran: Vec<Mutex<Option<std::thread::ThreadId>>> =
                    (0..4).map(|_| Mutex::new(None)).collect();
                for _ in 0..100 {
                    team.run(&|m| *take(&ran[m]) = Some(std::thread::current().id()));
                }
                let by_caller = ran.iter().filter(|r| *take(r) == Some(me)).count();
                let _ = done.send(by_caller);
            })
        };
        // Workers stalled until the jobs are done: the caller ran every share.
        let by_caller = finished.recv_timeout(Duration::from_secs(30));
        team.shared.stalled.store(false, Ordering::SeqCst);
        assert_eq!(by_caller, Ok(4), "the caller waited on stalled workers");
        caller.join().unwrap();
        // Released, the workers take their shares again.
        let ran = AtomicUsize::new(0);
        team.run(&|_| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_parked_team_wakes_for_the_next_job() {
        let team = Team::new(3).unwrap();
        std::thread::sleep(IDLE_SPIN * 3);
        let sum = AtomicUsize::new(0);
        team.run(&|m| {
            sum.fetch_add(m + 1, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn a_panic_in_a_worker_reaches_the_caller_and_the_team_goes_on() {
        let team = Team::new(2).unwrap();
        let caught = catch_unwind(AssertUnwindSafe(|| {
            team.run(&|m| assert_ne!(m, 1, "member 1 fails"));
        }));
        assert!(caught.is_err());
        let ran = AtomicUsize::new(0);
        team.run(&|_| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn column_shares_write_their_own_columns_only() {
        let mut out = vec![0f32; 3 * 5];
        let mut shares = Columns::split(&mut out, 5, &[0..2, 2..5]);
        shares[0].set(2, 1, 1.0);
        shares[1].set(0, 4, 2.0);
        assert!(catch_unwind(AssertUnwindSafe(|| shares[0].set(0, 2, 3.0))).is_err());
        assert!(catch_unwind(AssertUnwindSafe(|| shares[1].set(3, 2, 3.0))).is_err());
        drop(shares);
        assert_eq!((out[2 * 5 + 1], out[4]), (1.0, 2.0));
        assert_eq!(out.iter().filter(|v| **v != 0.0).count(), 2);
        assert!(
            catch_unwind(AssertUnwindSafe(|| Columns::split(
                &mut out,
                5,
                &[0..3, 2..5]
            )
            .len()))
            .is_err()
        );
    }

    #[test]
    fn shares_cover_the_range_in_aligned_parts() {
        for len in [0, 1, 5, 70, 576, 1000] {
            for members in 1..=5 {
                let parts: Vec<_> = (0..members).map(|m| share(len, members, m, 4)).collect();
                assert_eq!(parts[0].start, 0);
                assert_eq!(parts[members - 1].end, len);
                for w in parts.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[1].start % 4 == 0 || w[1].start == len);
                }
            }
        }
    }
}
