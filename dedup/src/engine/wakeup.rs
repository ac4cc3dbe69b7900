//! The scanner thread: one wake-up after another, each a plan, the I/O
//! hints, a batch of the scan, the KSM assist's turn, and a sleep.

use super::*;

/// Shortest sleep after a wake-up that found nothing to visit.
const IDLE_FLOOR: Duration = Duration::from_millis(20);

/// Longest the scanner defers its next batch to callers waiting for the
/// core (a waiter normally gets it within microseconds of the release).
const LET_IN_MAX: Duration = Duration::from_millis(50);

/// The longest a wake-up's scan, hints or unmerge step runs before it ends
/// at its next step boundary (`Core::set_deadline`); the rest waits for the
/// next wake-up, after the sleep. Far below [`WAKEUP_GRACE`], so that a
/// healthy engine on a slow host is never reported stalled, and short
/// enough that a mode or knob change waits at most about this long. On a
/// fast host a full boosted wake-up (65,536 pages at the defaults) fits.
const WAKEUP_TIME: Duration = Duration::from_secs(1);

/// Most unmerge steps before unmerge mode gives up and turns itself off.
const UNMERGE_TRIES: u32 = 100;

/// The next wake-up's factor of `pages_to_scan` in mode `on` (see
/// [`EngineConfig::boost_max`]): doubled after a wake-up in which merges
/// and first-time hashes together were at least 1/8 of the pages it could
/// visit, halved otherwise. A few merges among thousands of visits (a
/// running guest's churn) do not count as paying off: the rate stays.
fn next_boost(boost: u64, max: u64, rep: &BatchReport, pages_to_visit: u64) -> u64 {
    if (rep.merges + rep.fresh).saturating_mul(8) >= pages_to_visit.max(1) {
        boost.saturating_mul(2).min(max)
    } else {
        (boost / 2).max(1)
    }
}

/// Before a batch: lets threads waiting for the core take it first. A
/// mutex does not hand itself over in order, and at `sleep_millisecs` 0
/// the scanner would take the core straight back.
fn let_waiters_in(sh: &Shared) {
    let t = Instant::now();
    while sh.core_waiters.load(Ordering::Acquire) > 0 && t.elapsed() < LET_IN_MAX {
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// The sleep after a wake-up: `sleep_millisecs`, doubled per idle pass in
/// mode on with the adaptive back-off (up to its cap).
fn effective_sleep(sh: &Shared, knobs: &Knobs, mode: Mode, idle: u32) -> Duration {
    let base = knobs.sleep_millisecs;
    if !sh.adaptive || mode != Mode::On || idle == 0 {
        return Duration::from_millis(base);
    }
    let cap = sh.max_backoff.max(base);
    let ms = base.max(1).saturating_mul(1u64 << idle.min(20)).min(cap);
    Duration::from_millis(ms)
}

/// What a wake-up starts from: the control state as it found it.
struct Wakeup {
    mode: Mode,
    knobs: Knobs,
    /// The pause budget (`DedupSettings::max_guest_pause_us`).
    max_guest_pause_us: u64,
    /// Settle the scan (`DedupSettings::settle`).
    settle: bool,
    /// The control generation: a change wakes the scanner from its sleep.
    generation: u64,
}

/// What the scanner carries from one wake-up to the next.
struct Pace {
    /// Mode on's factor of `pages_to_scan` (see `EngineConfig::boost_max`).
    boost: u64,
    /// Unmerge steps so far in this unmerge.
    unmerge_tries: u32,
}

/// The scanner thread's body, until the engine stops.
pub(super) fn scanner_loop(sh: &Arc<Shared>) {
    lock(&sh.clocks).enter();
    let mut pace = Pace {
        boost: 1,
        unmerge_tries: 0,
    };
    while let Some(w) = next_wakeup(sh) {
        let sleep = match w.mode {
            Mode::Off => continue,
            Mode::Unmerge => match unmerge_step(sh, &w, &mut pace.unmerge_tries) {
                Some(sleep) => sleep,
                None => continue,
            },
            Mode::On | Mode::Auto => merge_wakeup(sh, &w, &mut pace.boost),
        };
        sleep_until_next(sh, sleep, w.generation);
    }
    lock(&sh.clocks).leave();
}

/// Waits while the mode is off (KSM, if it assists, stops merging too);
/// then starts a wake-up. None once the engine stops.
fn next_wakeup(sh: &Shared) -> Option<Wakeup> {
    let (w, reset) = {
        let mut c = lock(&sh.ctl);
        if !c.stop && c.mode == Mode::Off {
            // Lock order is core -> ctl, so ctl is released first.
            drop(c);
            {
                let mut core = lock(&sh.core);
                core.drive_assist(false, 0, 0);
                // Mode off runs no wake-up: slots a hardened group's
                // discard left go now, and later ones at the next mode
                // change.
                core.release_deferred();
                sh.publish(&core);
            }
            c = lock(&sh.ctl);
        }
        while !c.stop && c.mode == Mode::Off {
            c = sh.cv.wait(c).unwrap_or_else(|e| e.into_inner());
        }
        if c.stop {
            return None;
        }
        c.last_wakeup = Some(Instant::now());
        let reset = std::mem::take(&mut c.reset_backoff);
        let w = Wakeup {
            mode: c.mode,
            knobs: c.knobs,
            max_guest_pause_us: c.max_guest_pause_us,
            settle: c.settle,
            generation: c.generation,
        };
        (w, reset)
    };
    // Lock order is core -> ctl (publish), so the core is taken only after
    // ctl is released.
    if reset {
        lock(&sh.core).reset_idle_passes();
    }
    Some(w)
}

/// One step of unmerge mode; the sleep before the next, or None to go on
/// at once (a VM waits for the core, or the unmerge ended).
fn unmerge_step(sh: &Shared, w: &Wakeup, tries: &mut u32) -> Option<Duration> {
    let left = {
        let mut core = lock(&sh.core);
        core.set_max_guest_pause_us(w.max_guest_pause_us);
        core.set_deadline(Some(Instant::now() + WAKEUP_TIME));
        // Logs itself when slow (SLOW_UNMERGE_STEP).
        let left = core.unmerge_all();
        // Slots hardened groups' discards left since the last step.
        core.release_deferred();
        core.set_deadline(None);
        sh.publish(&core);
        unlock_core(core);
        left
    };
    let Some(left) = left else {
        // A VM is being created or deleted (it goes first), or the step's
        // time is up (the control state is read again).
        let_waiters_in(sh);
        return None;
    };
    *tries += 1;
    if left == 0 || *tries >= UNMERGE_TRIES {
        if left > 0 {
            log::error!("unmerge left {left} pages merged");
        }
        *tries = 0;
        let mut c = lock(&sh.ctl);
        if c.mode == Mode::Unmerge {
            c.mode = Mode::Off;
        }
        sh.cv.notify_all();
        return None;
    }
    Some(Duration::from_millis(10))
}

/// A wake-up of mode on or auto: the plan, the hints, the batch, the KSM
/// assist's turn; returns the sleep before the next one.
fn merge_wakeup(sh: &Shared, w: &Wakeup, boost: &mut u64) -> Duration {
    let plan = plan_round(sh, w, *boost);
    let mut queued = take_hints(sh);
    let_waiters_in(sh);
    let (rep, idle) = run_wakeup(sh, w, &plan, &mut queued);
    if !queued.queue.is_empty() {
        // Not reached this time: first in line next wake-up.
        let mut h = lock(&sh.hints);
        queued.queue.append(&mut h.queue);
        h.queue = queued.queue;
    }
    lock(&sh.ctl).last_round_merges = rep.merges;
    *boost = match w.mode {
        // Cut short for a waiter or by its time: says nothing of the pace
        // (on a host too slow for the boosted batch, the time bounds it).
        Mode::On if rep.yielded => *boost,
        Mode::On => next_boost(*boost, sh.boost_max, &rep, plan.pages_to_visit),
        _ => 1,
    };
    let sleep = effective_sleep(sh, &w.knobs, w.mode, idle);
    if rep.census_pending {
        // The rest of a census pass, soon (see CENSUS_SLICE).
        sleep.min(IDLE_FLOOR)
    } else if rep.spent == 0 && !rep.yielded {
        // Nothing of the engine's to visit (every region is KSM's between
        // censuses): no spinning at sleep 0.
        sleep.max(IDLE_FLOOR)
    } else {
        sleep
    }
}

/// The wake-up's pages and whether it merges: auto mode's round policy
/// says, mode on scans `pages_to_scan` times its boost.
fn plan_round(sh: &Shared, w: &Wakeup, boost: u64) -> RoundPlan {
    if w.mode != Mode::Auto {
        return RoundPlan {
            pages_to_visit: w.knobs.pages_to_scan.saturating_mul(boost),
            merge: true,
        };
    }
    // The policy runs outside the control lock (it may read /proc).
    let (policy, last) = {
        let mut c = lock(&sh.ctl);
        (c.policy.take(), c.last_round_merges)
    };
    let Some(mut p) = policy else {
        return RoundPlan {
            pages_to_visit: w.knobs.pages_to_scan,
            merge: true,
        };
    };
    let plan = p.plan(last, w.knobs.pages_to_scan);
    let mut c = lock(&sh.ctl);
    if c.policy.is_none() {
        c.policy = Some(p);
    }
    plan
}

/// The device-written ranges queued since the last wake-up.
fn take_hints(sh: &Shared) -> Hints {
    let mut h = lock(&sh.hints);
    Hints {
        queue: std::mem::take(&mut h.queue),
        written: std::mem::take(&mut h.written),
        lost: std::mem::take(&mut h.lost),
        ..Hints::default()
    }
}

/// The wake-up's work under the core: the write logs' device writes, the
/// hinted ranges (`queued.queue` keeps what the visit did not reach), the
/// scan's batch and the KSM assist's turn. Returns the batch's report
/// (hinted merges included) and the core's idle passes.
fn run_wakeup(sh: &Shared, w: &Wakeup, plan: &RoundPlan, queued: &mut Hints) -> (BatchReport, u32) {
    let mut core = lock(&sh.core);
    let t0 = Instant::now();
    core.set_deadline(Some(t0 + WAKEUP_TIME));
    core.set_knobs(w.knobs);
    core.set_max_guest_pause_us(w.max_guest_pause_us);
    core.set_settle(w.settle);
    core.release_deferred();
    if queued.lost {
        // Device writes whose ranges are lost: every logged page gets a
        // full look.
        core.mark_all_written();
    }
    core.mark_written(&queued.written);
    let mut hinted = BatchReport::default();
    if plan.merge && !queued.queue.is_empty() {
        // Device-filled pages first, with their own budget.
        let budget = plan.pages_to_visit.max(HINT_PAGES_PER_WAKEUP);
        hinted = core.run_hints(&mut queued.queue, budget);
    } else {
        core.mark_written(&queued.queue);
        queued.queue.clear();
    }
    let t1 = Instant::now();
    let mut rep = core.run_batch(plan.pages_to_visit.max(1), plan.merge);
    let t2 = Instant::now();
    // Merges the hints brought pay off like the scan's: left out, the scan
    // behind them found little and slowed down.
    rep.merges += hinted.merges;
    rep.fresh += hinted.fresh;
    core.drive_assist(plan.merge, plan.pages_to_visit, w.knobs.sleep_millisecs);
    core.set_deadline(None);
    let t3 = Instant::now();
    sh.publish(&core);
    if t0.elapsed() >= SLOW_HOLD {
        // Registrations and VM deletions wait meanwhile.
        log::info!(
            "a wake-up held the engine for {:?} (hints {:?}: {} merges; scan {:?}: {} merges, {} visit units, pass end {}, yielded {}; KSM assist {:?}; stats {:?})",
            t0.elapsed(),
            t1 - t0,
            hinted.merges,
            t2 - t1,
            rep.merges,
            rep.spent,
            rep.pass_completed,
            rep.yielded,
            t3 - t2,
            t3.elapsed()
        );
    }
    let idle = core.idle_passes();
    unlock_core(core);
    (rep, idle)
}

/// Sleeps `sleep`, or until the control state changes (a new generation)
/// or the engine stops.
fn sleep_until_next(sh: &Shared, sleep: Duration, generation: u64) {
    let mut c = lock(&sh.ctl);
    c.planned_sleep = sleep;
    let _ = sh
        .cv
        .wait_timeout_while(c, sleep, |c| !c.stop && c.generation == generation)
        .unwrap_or_else(|e| e.into_inner());
}

#[cfg(test)]
mod tests {
    use super::{next_boost, BatchReport};

    fn rep(merges: u64, fresh: u64) -> BatchReport {
        BatchReport {
            merges,
            fresh,
            ..BatchReport::default()
        }
    }

    #[test]
    fn doubles_while_merging_pays_off_and_caps() {
        assert_eq!(next_boost(1, 16, &rep(4096, 0), 4096), 2);
        assert_eq!(next_boost(2, 16, &rep(0, 1024), 8192), 4);
        assert_eq!(next_boost(16, 16, &rep(65536, 0), 65536), 16);
    }

    #[test]
    fn a_trickle_of_merges_does_not_boost() {
        // 10 merges in 4096 visits: a running guest's churn, not a new VM.
        assert_eq!(next_boost(1, 16, &rep(10, 0), 4096), 1);
        assert_eq!(next_boost(8, 16, &rep(10, 5), 32768), 4);
        assert_eq!(next_boost(1, 16, &rep(0, 0), 4096), 1);
    }

    #[test]
    fn max_one_is_a_fixed_rate() {
        assert_eq!(next_boost(1, 1, &rep(4096, 4096), 4096), 1);
    }
}
