//! Network interfaces of Linux guests: virtio-net devices on host taps,
//! each on virtio-mmio in the slot after the disks (the same windows,
//! GSIs and wiring as every device: [`crate::virtio_mmio`]).

use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use pagefold_devices::bus::Bus;
use pagefold_devices::virtio::net::{Net, Tap, TapWatcher};
use pagefold_devices::virtio::WriteHook;
use pagefold_devices::GuestMemoryMmap;

use crate::config::NetConfig;
use crate::nic::NicDevice;
use crate::virtio_mmio::{Subscriber, VirtioMmioDevice};

/// Errors attaching a NIC.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tap could not be opened: the message names it and gives the
    /// OS error (no such device for a tun, busy, no permission).
    #[error("network interface {index}: {source}")]
    Tap {
        index: usize,
        #[source]
        source: pagefold_devices::virtio::net::tap::Error,
    },
    #[error("network interface {index} (tap {tap:?}): {message}")]
    Device {
        index: usize,
        tap: String,
        message: String,
    },
    #[error("network interface {index} (tap {tap:?}): {source}")]
    Attach {
        index: usize,
        tap: String,
        #[source]
        source: crate::virtio_mmio::Error,
    },
}

/// The NICs of a VM, attached to its MMIO bus.
pub struct Nets {
    /// Where each NIC's virtio-mmio window is, in config order.
    pub slots: Vec<VirtioMmioDevice>,
    /// Queue-notification and tap subscribers the event loop must run.
    pub subscribers: Vec<Subscriber>,
    /// Where each NIC's figures are read, in config order.
    pub devices: Vec<NicDevice>,
}

/// Attaches `nets` of VM `name` as virtio-net devices: NIC `i` in slot
/// `first_slot + i`, with an irqfd for its GSI, an ioeventfd per queue on
/// its QueueNotify register, and a [`TapWatcher`] on each of its tap
/// queues. A NIC gets one queue pair per vCPU (`vcpus`), up to its
/// `queue_pairs` ([`NetConfig::pairs_for`]). `written` hears of every
/// guest range a received frame is written to.
#[allow(clippy::too_many_arguments)]
pub fn attach_nets(
    name: &str,
    nets: &[NetConfig],
    vcpus: usize,
    first_slot: usize,
    vm_fd: &VmFd,
    mem: &GuestMemoryMmap,
    mmio: &mut Bus,
    written: Option<&WriteHook>,
) -> Result<Nets, Error> {
    let mut out = Nets {
        slots: Vec::new(),
        subscribers: Vec::new(),
        devices: Vec::new(),
    };
    for (index, cfg) in nets.iter().enumerate() {
        let dev_err = |message: String| Error::Device {
            index,
            tap: cfg.tap.clone(),
            message,
        };
        let slot = VirtioMmioDevice::slot((first_slot + index) as u32);
        let taps = Tap::open_queues(&cfg.tap, cfg.pairs_for(vcpus))
            .map_err(|source| Error::Tap { index, source })?;
        let watched = taps
            .iter()
            .map(|t| Ok((t.try_clone()?, t.attached_flag())))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| Error::Tap { index, source })?;
        let mac = cfg.mac_for(name, index);
        let mut net = Net::with_taps(taps, mac).map_err(|e| dev_err(e.to_string()))?;
        if let Some(hook) = written {
            net.set_write_hook(hook.clone());
        }
        let stats = net.stats();
        let attached =
            crate::virtio_mmio::attach(slot, Box::new(net), "virtio-net", vm_fd, mem, mmio)
                .map_err(|source| Error::Attach {
                    index,
                    tap: cfg.tap.clone(),
                    source,
                })?;
        out.subscribers.push(attached.notifier);
        out.devices.push(NicDevice {
            tap: cfg.tap.clone(),
            mac: mac.to_string(),
            stats: stats.clone(),
            transport: attached.transport.clone(),
        });
        for (pair, (fd, flag)) in watched.into_iter().enumerate() {
            let w = TapWatcher::new(attached.transport.clone(), fd, &cfg.tap, stats.clone())
                .for_pair(pair, flag);
            out.subscribers.push(Arc::new(Mutex::new(w)));
        }
        out.slots.push(slot);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    fn vm() -> (VmFd, GuestMemoryMmap) {
        let kvm = kvm_ioctls::Kvm::new().unwrap();
        let vm = kvm.create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        (vm, mem)
    }

    /// A tap that cannot be attached (here `lo`, which is no tap) fails
    /// VM creation with a message naming the NIC, the tap and the OS error.
    #[test]
    fn a_tap_that_cannot_be_opened_is_named_in_the_error() {
        let (vm, mem) = vm();
        let mut mmio = Bus::new();
        let nets = [NetConfig::on_tap("lo")];
        let e = match attach_nets("vm", &nets, 1, 0, &vm, &mem, &mut mmio, None) {
            Ok(_) => panic!("lo attached as a tap"),
            Err(e) => e,
        };
        let msg = format!("{e}: {}", std::error::Error::source(&e).unwrap());
        assert!(
            msg.contains("network interface 0") && msg.contains("\"lo\""),
            "{msg}"
        );
        assert!(msg.contains("Invalid argument"), "{msg}");
    }

    /// NICs take the slots after the disks: window and GSI of slot
    /// `first_slot + i`, with a notifier and a tap watcher each.
    #[test]
    fn nics_take_the_slots_after_the_disks() {
        let (vm, mem) = vm();
        let mut mmio = Bus::new();
        let nets = [NetConfig::on_tap(&format!(
            "pfn{}",
            std::process::id() % 1_000_000
        ))];
        let n = attach_nets("vm", &nets, 1, 2, &vm, &mem, &mut mmio, None).unwrap();
        assert_eq!(n.slots, vec![VirtioMmioDevice::slot(2)]);
        assert_eq!(n.subscribers.len(), 2);
        // One vCPU, one pair: the tap as before multiqueue.
        assert_eq!(tun_flags(&nets[0].tap) & libc::IFF_MULTI_QUEUE as u32, 0);
        assert_eq!(n.devices[0].status().queue_pairs, 1);
        // The device answers at its window: virtio magic, device ID 1.
        let mut id = [0u8; 4];
        assert!(mmio.read(VirtioMmioDevice::slot(2).addr + 8, &mut id));
        assert_eq!(u32::from_le_bytes(id), 1);
    }

    /// The flags of tap `name` as sysfs shows them (`IFF_*`).
    fn tun_flags(name: &str) -> u32 {
        let f = std::fs::read_to_string(format!("/sys/class/net/{name}/tun_flags")).unwrap();
        u32::from_str_radix(f.trim().trim_start_matches("0x"), 16).unwrap()
    }

    /// A VM with two vCPUs gets two queue pairs on a multiqueue tap
    /// (pagefold creates it so), a tap watcher per pair, and only the
    /// first pair's tap queue attached until the driver sets more; the
    /// config's `queue_pairs` caps the count.
    #[test]
    fn a_nic_gets_a_queue_pair_per_vcpu_on_a_multiqueue_tap() {
        let tap = format!("pfq{}", std::process::id() % 1_000_000);
        {
            let (vm, mem) = vm();
            let mut mmio = Bus::new();
            let nets = [NetConfig::on_tap(&tap)];
            let n = attach_nets("vm", &nets, 2, 0, &vm, &mem, &mut mmio, None).unwrap();
            // The notifier, then one watcher per pair.
            assert_eq!(n.subscribers.len(), 3);
            let s = n.devices[0].status();
            assert_eq!((s.queue_pairs, s.active_pairs, s.pairs.len()), (2, 1, 2));
            assert_ne!(tun_flags(&tap) & libc::IFF_MULTI_QUEUE as u32, 0);
            // max_virtqueue_pairs in the config space (offset 0x100 + 8).
            let mut pairs = [0u8; 2];
            assert!(mmio.read(VirtioMmioDevice::slot(0).addr + 0x108, &mut pairs));
            assert_eq!(u16::from_le_bytes(pairs), 2);
        }
        let (vm, mem) = vm();
        let mut mmio = Bus::new();
        let capped = NetConfig {
            queue_pairs: Some(1),
            ..NetConfig::on_tap(&tap)
        };
        let n = attach_nets("vm", &[capped], 2, 0, &vm, &mem, &mut mmio, None).unwrap();
        assert_eq!(n.subscribers.len(), 2);
        assert_eq!(n.devices[0].status().queue_pairs, 1);
    }

    /// Makes tap `name` persistent (`multi_queue` or not) or not.
    fn persist(name: &str, multi_queue: bool, on: bool) {
        let t = Tap::open_queues(name, if multi_queue { 2 } else { 1 }).unwrap();
        // SAFETY: TUNSETPERSIST takes its argument by value; the fd is an
        // attached tap.
        let r = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&t[0]),
                libc::TUNSETPERSIST,
                libc::c_ulong::from(on),
            )
        };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    }

    /// The pairs and subscribers NICs on `tap` get in a VM with `vcpus`.
    fn pairs_on(tap: &str, vcpus: usize) -> Result<(usize, u16), String> {
        let (vm, mem) = vm();
        let mut mmio = Bus::new();
        attach_nets(
            "vm",
            &[NetConfig::on_tap(tap)],
            vcpus,
            0,
            &vm,
            &mem,
            &mut mmio,
            None,
        )
        .map(|n| (n.subscribers.len(), n.devices[0].status().queue_pairs))
        .map_err(|e| e.to_string())
    }

    /// A tap made beforehand without `multi_queue` refuses the flag: the
    /// NIC falls back to one pair (with a warning) instead of failing;
    /// and one made with it serves a one-vCPU VM's single pair.
    #[test]
    fn taps_made_beforehand_serve_either_way() {
        let name = format!("pfs{}", std::process::id() % 1_000_000);
        persist(&name, false, true);
        let single = pairs_on(&name, 4);
        persist(&name, false, false);
        assert_eq!(single.unwrap(), (2, 1));
        persist(&name, true, true);
        let (one, two) = (pairs_on(&name, 1), pairs_on(&name, 2));
        persist(&name, true, false);
        assert_eq!(one.unwrap(), (2, 1));
        assert_eq!(two.unwrap(), (3, 2));
    }
}
