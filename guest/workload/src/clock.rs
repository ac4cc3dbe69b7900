//! The guest's clock: the TSC at `params.tsc_khz`, or the host's clock (a VM
//! exit per reading) when the VMM gives no TSC rate.

use crate::host;

pub fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no memory effects; CPL3 may use it (CR4.TSD clear).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Microseconds since the clock was made.
pub struct Clock {
    tsc_khz: u64,
    start: u64,
}

impl Clock {
    pub fn start(tsc_khz: u64) -> Self {
        let start = if tsc_khz > 0 {
            rdtsc()
        } else {
            host::clock_ns()
        };
        Self { tsc_khz, start }
    }

    pub fn elapsed_us(&self) -> u64 {
        if self.tsc_khz > 0 {
            let ticks = rdtsc().wrapping_sub(self.start);
            ((ticks as u128) * 1000 / self.tsc_khz as u128) as u64
        } else {
            host::clock_ns().saturating_sub(self.start) / 1000
        }
    }
}
