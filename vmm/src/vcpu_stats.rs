//! Whether a vCPU is halted inside KVM, from KVM's binary statistics.
//!
//! A Linux guest with nothing to do executes HLT, and with the in-kernel
//! LAPIC KVM handles that without leaving KVM_RUN: the thread sleeps in
//! the kernel until an interrupt is due. The VMM cannot see this from
//! KVM_RUN's exits, but the vCPU's binary statistics (`KVM_GET_STATS_FD`,
//! Linux 5.14+) carry a `blocking` flag that KVM sets while the vCPU
//! sleeps so. A sleeping vCPU's thread runs on no CPU, so a merge's TLB
//! flush sends it no IPI: parking it for a merge batch
//! ([`crate::quiesce`]) buys nothing, and kicking it out of KVM_RUN would
//! only delay the guest's next interrupt until the batch ends.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

use kvm_bindings::kvm_stats_header;
use kvm_ioctls::VcpuFd;

/// `_IO(KVMIO, 0xce)`: a vCPU's (or VM's) binary statistics fd.
const KVM_GET_STATS_FD: libc::c_ulong = 0xae << 8 | 0xce;

/// The statistic: 1 while the vCPU sleeps in `kvm_vcpu_block`.
const BLOCKING: &str = "blocking";

/// Size of a descriptor before its name (`struct kvm_stats_desc`: flags
/// u32, exponent s16, size u16, offset u32, bucket_size u32).
const DESC_FIXED: usize = 16;

/// Errors opening a vCPU's statistics.
#[derive(Debug, thiserror::Error)]
pub enum VcpuStatsError {
    /// The kernel has no binary statistics (before 5.14), or refused.
    #[error("KVM_GET_STATS_FD: {0}")]
    StatsFd(#[source] std::io::Error),
    /// Reading the header or the descriptors failed.
    #[error("reading the vCPU's statistics: {0}")]
    Read(#[source] std::io::Error),
    /// The statistics are not laid out as the header says.
    #[error("malformed vCPU statistics: {0}")]
    Malformed(&'static str),
    /// This kernel's vCPUs have no `blocking` statistic.
    #[error("this kernel's vCPU statistics have no \"blocking\"")]
    NoBlocking,
}

/// A vCPU's `blocking` statistic, open for reading.
#[derive(Debug)]
pub struct VcpuBlocking {
    file: File,
    /// Where the value lies in the file.
    at: u64,
}

impl VcpuBlocking {
    /// Opens `vcpu`'s statistics and finds `blocking` in them.
    pub fn open(vcpu: &VcpuFd) -> Result<VcpuBlocking, VcpuStatsError> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd
        // (or -1); `vcpu` is a valid vCPU fd for the call's duration.
        let fd = unsafe { libc::ioctl(vcpu.as_raw_fd(), KVM_GET_STATS_FD as _, 0) };
        if fd < 0 {
            return Err(VcpuStatsError::StatsFd(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just returned by the kernel and is owned by no
        // one else.
        let file = unsafe { File::from_raw_fd(fd) };
        let mut head = [0u8; std::mem::size_of::<kvm_stats_header>()];
        file.read_exact_at(&mut head, 0)
            .map_err(VcpuStatsError::Read)?;
        let h = parse_header(&head);
        let len = desc_len(&h)?
            .checked_mul(h.num_desc as usize)
            .filter(|&n| n <= 1 << 20)
            .ok_or(VcpuStatsError::Malformed("descriptor block too large"))?;
        let mut descs = vec![0u8; len];
        file.read_exact_at(&mut descs, u64::from(h.desc_offset))
            .map_err(VcpuStatsError::Read)?;
        let offset = find(&h, &descs, BLOCKING)?.ok_or(VcpuStatsError::NoBlocking)?;
        Ok(VcpuBlocking {
            file,
            at: u64::from(h.data_offset) + u64::from(offset),
        })
    }

    /// True while the vCPU sleeps in KVM (halted, waiting for an
    /// interrupt). An unreadable value reads as false: the caller then
    /// treats the vCPU as running, as it did without statistics.
    pub fn is_blocking(&self) -> bool {
        let mut v = [0u8; 8];
        self.file.read_exact_at(&mut v, self.at).is_ok() && u64::from_ne_bytes(v) != 0
    }
}

fn parse_header(b: &[u8; 24]) -> kvm_stats_header {
    let u = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    kvm_stats_header {
        flags: u(0),
        name_size: u(4),
        num_desc: u(8),
        id_offset: u(12),
        desc_offset: u(16),
        data_offset: u(20),
    }
}

/// One descriptor's length: its fixed part and its name field.
fn desc_len(h: &kvm_stats_header) -> Result<usize, VcpuStatsError> {
    if h.name_size == 0 || h.name_size > 4096 {
        return Err(VcpuStatsError::Malformed("name size"));
    }
    Ok(DESC_FIXED + h.name_size as usize)
}

/// The data offset of the statistic called `name` in the descriptor block
/// `descs`, if there is one.
fn find(h: &kvm_stats_header, descs: &[u8], name: &str) -> Result<Option<u32>, VcpuStatsError> {
    let len = desc_len(h)?;
    for d in descs.chunks_exact(len) {
        let field = &d[DESC_FIXED..];
        let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
        if &field[..end] == name.as_bytes() {
            return Ok(Some(u32::from_ne_bytes([d[8], d[9], d[10], d[11]])));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A descriptor block of `names` with 8-byte names, statistic `i` at
    /// data offset `8 * i`.
    fn block(names: &[&str]) -> (kvm_stats_header, Vec<u8>) {
        let h = kvm_stats_header {
            flags: 0,
            name_size: 8,
            num_desc: names.len() as u32,
            id_offset: 24,
            desc_offset: 72,
            data_offset: 512,
        };
        let mut b = Vec::new();
        for (i, n) in names.iter().enumerate() {
            b.extend_from_slice(&1u32.to_ne_bytes());
            b.extend_from_slice(&0i16.to_ne_bytes());
            b.extend_from_slice(&1u16.to_ne_bytes());
            b.extend_from_slice(&(8 * i as u32).to_ne_bytes());
            b.extend_from_slice(&0u32.to_ne_bytes());
            let mut name = [0u8; 8];
            name[..n.len()].copy_from_slice(n.as_bytes());
            b.extend_from_slice(&name);
        }
        (h, b)
    }

    #[test]
    fn finds_a_statistic_by_its_whole_name() {
        let (h, b) = block(&["halt_ns", "block", "blocking"]);
        assert_eq!(find(&h, &b, "blocking").unwrap(), Some(16));
        assert_eq!(find(&h, &b, "block").unwrap(), Some(8));
        assert_eq!(find(&h, &b, "blockin").unwrap(), None);
    }

    #[test]
    fn a_header_with_no_room_for_names_is_refused() {
        let (mut h, b) = block(&["blocking"]);
        h.name_size = 0;
        assert!(matches!(
            find(&h, &b, "blocking"),
            Err(VcpuStatsError::Malformed(_))
        ));
    }

    #[test]
    fn the_header_is_read_field_by_field() {
        let mut raw = [0u8; 24];
        for (i, v) in [0u32, 48, 7, 24, 72, 4096].iter().enumerate() {
            raw[4 * i..4 * i + 4].copy_from_slice(&v.to_ne_bytes());
        }
        let h = parse_header(&raw);
        assert_eq!(
            (h.name_size, h.num_desc, h.desc_offset, h.data_offset),
            (48, 7, 72, 4096)
        );
    }

    #[test]
    fn a_vcpu_blocks_on_hlt_and_not_before() {
        let h = testutil::TestVcpu::halted();
        assert!(
            h.seen_blocking(),
            "the vCPU never showed as blocking on its HLT"
        );
    }
}

/// A real vCPU sitting on HLT, for tests of what depends on `blocking`.
#[cfg(test)]
pub(crate) mod testutil {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    use pagefold_devices::GuestMemoryMmap;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

    use super::VcpuBlocking;

    /// A VM (root, /dev/kvm) whose one vCPU runs `hlt; jmp hlt` at 0x1000
    /// with an in-kernel irqchip and no interrupt due, so KVM keeps it
    /// asleep (`halted`), or spins (`spinning`); stopped and joined on
    /// drop.
    pub(crate) struct TestVcpu {
        pub(crate) blocking: Arc<VcpuBlocking>,
        /// Whether it showed as blocking within 10 s of starting.
        seen: bool,
        /// Returns from KVM_RUN (each kick makes one).
        pub(crate) exits: Arc<AtomicUsize>,
        /// Its thread has reached its first KVM_RUN.
        entered: Arc<AtomicBool>,
        done: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
        _vm: kvm_ioctls::VmFd,
        _mem: GuestMemoryMmap,
    }

    impl TestVcpu {
        pub(crate) fn halted() -> TestVcpu {
            TestVcpu::run(&[0xf4, 0xeb, 0xfd], false)
        }

        /// A vCPU that never halts (`jmp $`): running guest code from
        /// shortly after this returns until it is kicked.
        pub(crate) fn spinning() -> TestVcpu {
            let v = TestVcpu::run(&[0xeb, 0xfe], true);
            let end = Instant::now() + Duration::from_secs(10);
            while !v.entered.load(Ordering::SeqCst) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(1));
            }
            // From its thread's last step before KVM_RUN into guest code.
            std::thread::sleep(Duration::from_millis(20));
            v
        }

        fn run(code: &[u8], at_once: bool) -> TestVcpu {
            let kvm = kvm_ioctls::Kvm::new().expect("/dev/kvm");
            let vm = kvm.create_vm().unwrap();
            vm.create_irq_chip().unwrap();
            let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0x1000), 0x1000)]).unwrap();
            mem.write_slice(code, GuestAddress(0x1000)).unwrap();
            let host = mem.iter().next().unwrap().as_ptr() as u64;
            let region = kvm_bindings::kvm_userspace_memory_region {
                slot: 0,
                guest_phys_addr: 0x1000,
                memory_size: 0x1000,
                userspace_addr: host,
                flags: 0,
            };
            // SAFETY: the region maps `mem`, which lives as long as the VM
            // (both in the returned struct, the thread joined first).
            unsafe { vm.set_user_memory_region(region).unwrap() };
            let mut vcpu = vm.create_vcpu(0).unwrap();
            let mut sregs = vcpu.get_sregs().unwrap();
            sregs.cs.base = 0;
            sregs.cs.selector = 0;
            vcpu.set_sregs(&sregs).unwrap();
            let mut regs = vcpu.get_regs().unwrap();
            regs.rip = 0x1000;
            regs.rflags = 2;
            vcpu.set_regs(&regs).unwrap();
            let blocking =
                Arc::new(VcpuBlocking::open(&vcpu).expect("the vCPU's blocking statistic"));
            assert!(!blocking.is_blocking(), "blocking before it ran");
            crate::vcpu::install_kick_handler().unwrap();
            let done = Arc::new(AtomicBool::new(false));
            let d = done.clone();
            let exits = Arc::new(AtomicUsize::new(0));
            let x = exits.clone();
            let entered = Arc::new(AtomicBool::new(false));
            let e = entered.clone();
            let thread = std::thread::spawn(move || {
                e.store(true, Ordering::SeqCst);
                while !d.load(Ordering::SeqCst) {
                    let _ = vcpu.run();
                    x.fetch_add(1, Ordering::SeqCst);
                }
            });
            let end = Instant::now() + Duration::from_secs(10);
            while !at_once && !blocking.is_blocking() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(1));
            }
            let seen = blocking.is_blocking();
            TestVcpu {
                blocking,
                seen,
                exits,
                entered,
                done,
                thread: Some(thread),
                _vm: vm,
                _mem: mem,
            }
        }

        pub(crate) fn seen_blocking(&self) -> bool {
            self.seen
        }

        /// The vCPU thread, to kick.
        pub(crate) fn pthread(&self) -> libc::pthread_t {
            use std::os::unix::thread::JoinHandleExt;
            self.thread.as_ref().unwrap().as_pthread_t()
        }
    }

    impl Drop for TestVcpu {
        fn drop(&mut self) {
            use std::os::unix::thread::JoinHandleExt;
            self.done.store(true, Ordering::SeqCst);
            if let Some(t) = self.thread.take() {
                while !t.is_finished() {
                    // SAFETY: the thread is alive (not finished, not
                    // joined); the kick signal's handler does nothing.
                    unsafe { libc::pthread_kill(t.as_pthread_t(), crate::vcpu::kick_signal()) };
                    std::thread::sleep(Duration::from_millis(1));
                }
                let _ = t.join();
            }
        }
    }
}
