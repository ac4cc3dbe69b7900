//! Host CPU affinity for a VM's vCPU threads (`vcpu_affinity` in a VM's
//! config): keeps guests on some CPUs and off others, e.g. off the CPU
//! that runs the dedup engine, as `taskset` would for the whole process.

/// Errors about CPU affinity.
#[derive(Debug, thiserror::Error)]
pub enum AffinityError {
    #[error("vcpu_affinity is empty: give at least one host CPU")]
    Empty,
    #[error("host CPU {cpu} is not available to this process (allowed: {allowed})")]
    NotAllowed { cpu: usize, allowed: String },
    #[error("sched_getaffinity: {0}")]
    Get(std::io::Error),
    #[error("sched_setaffinity: {0}")]
    Set(std::io::Error),
}

/// The host CPUs this process may run on.
pub fn allowed_cpus() -> Result<Vec<usize>, AffinityError> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size given.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(AffinityError::Get(std::io::Error::last_os_error()));
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Checks that every CPU in `cpus` is one this process may use.
pub fn check(cpus: &[usize]) -> Result<(), AffinityError> {
    if cpus.is_empty() {
        return Err(AffinityError::Empty);
    }
    let allowed = allowed_cpus()?;
    match cpus.iter().find(|c| !allowed.contains(c)) {
        Some(&cpu) => Err(AffinityError::NotAllowed {
            cpu,
            allowed: allowed
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(","),
        }),
        None => Ok(()),
    }
}

/// Restricts the calling thread to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> Result<(), AffinityError> {
    check(cpus)?;
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: `check` accepted `c`, so it is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size given; 0 = this thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(AffinityError::Set(std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_pinned_to_the_cpus_given_and_bad_sets_are_refused() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        let first = allowed[0];
        std::thread::spawn(move || {
            pin_current_thread(&[first]).unwrap();
            assert_eq!(allowed_cpus().unwrap(), vec![first]);
        })
        .join()
        .unwrap();
        assert!(matches!(check(&[]), Err(AffinityError::Empty)));
        let e = check(&[libc::CPU_SETSIZE as usize - 1]).unwrap_err();
        assert!(e.to_string().contains("not available"), "{e}");
    }
}
