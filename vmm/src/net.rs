//! Network interfaces of Linux guests: virtio-net devices on host taps,
//! each on virtio-mmio in the slot after the disks (the same windows,
//! GSIs and wiring as every device: [`crate::virtio_mmio`]).

use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use pagefold_devices::bus::Bus;
use pagefold_devices::virtio::net::{Net, Tap, TapWatcher};
use pagefold_devices::virtio::WriteHook;
use vm_memory::GuestMemoryMmap;

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
/// its QueueNotify register, and a [`TapWatcher`] on its tap. `written`
/// hears of every guest range a received frame is written to.
pub fn attach_nets(
    name: &str,
    nets: &[NetConfig],
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
        let tap = Tap::open(&cfg.tap).map_err(|source| Error::Tap { index, source })?;
        let watched = tap
            .try_clone()
            .map_err(|source| Error::Tap { index, source })?;
        let mac = cfg.mac_for(name, index);
        let mut net = Net::new(tap, mac).map_err(|e| dev_err(e.to_string()))?;
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
        out.subscribers.push(Arc::new(Mutex::new(TapWatcher::new(
            attached.transport,
            watched,
            &cfg.tap,
            stats,
        ))));
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
        let nets = [NetConfig {
            tap: "lo".into(),
            mac: None,
        }];
        let e = match attach_nets("vm", &nets, 0, &vm, &mem, &mut mmio, None) {
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
        let nets = [NetConfig {
            tap: format!("pfn{}", std::process::id() % 1_000_000),
            mac: None,
        }];
        let n = attach_nets("vm", &nets, 2, &vm, &mem, &mut mmio, None).unwrap();
        assert_eq!(n.slots, vec![VirtioMmioDevice::slot(2)]);
        assert_eq!(n.subscribers.len(), 2);
        // The device answers at its window: virtio magic, device ID 1.
        let mut id = [0u8; 4];
        assert!(mmio.read(VirtioMmioDevice::slot(2).addr + 8, &mut id));
        assert_eq!(u32::from_le_bytes(id), 1);
    }
}
