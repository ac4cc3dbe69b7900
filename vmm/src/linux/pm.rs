//! The hardware-reduced ACPI power-management register: one I/O port that
//! the FADT names as reset register and as sleep control/status register.
//! A guest `reboot` writes [`PM_RESET_VALUE`]; a guest `poweroff` writes
//! SLP_TYP=S5 with SLP_EN. Each signals an EventFd the VMM waits on.

use log::{debug, warn};
use pagefold_devices::bus::BusDevice;
use vmm_sys_util::eventfd::EventFd;

/// Value the FADT tells the guest to write to reset the machine.
pub const PM_RESET_VALUE: u8 = 1;
/// Sleep type of S5 (soft off) as given in the DSDT's `\_S5_`.
pub const SLP_TYP_S5: u8 = 5;
/// Sleep control register: SLP_TYP in bits 2..4, SLP_EN in bit 5.
const SLP_EN: u8 = 1 << 5;
const SLP_TYP_SHIFT: u8 = 2;
const SLP_TYP_MASK: u8 = 0x7;

/// What the guest asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PmEvent {
    Reset,
    Shutdown,
}

/// The PM register; place it on the port I/O bus at
/// [`super::layout::ACPI_PM_PORT`], length 1.
pub struct AcpiPmDevice {
    reset_evt: EventFd,
    shutdown_evt: EventFd,
}

impl AcpiPmDevice {
    /// `reset_evt` / `shutdown_evt` are signalled on guest reboot /
    /// poweroff (they may be clones of one EventFd).
    pub fn new(reset_evt: EventFd, shutdown_evt: EventFd) -> Self {
        Self {
            reset_evt,
            shutdown_evt,
        }
    }

    /// Decodes a byte written to the register.
    pub fn decode(v: u8) -> Option<PmEvent> {
        if v & SLP_EN != 0 {
            // Only S5 is advertised; other sleep states are not entered.
            return ((v >> SLP_TYP_SHIFT) & SLP_TYP_MASK == SLP_TYP_S5)
                .then_some(PmEvent::Shutdown);
        }
        (v == PM_RESET_VALUE).then_some(PmEvent::Reset)
    }
}

impl BusDevice for AcpiPmDevice {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        // Sleep status: WAK_STS never set (we never sleep and wake).
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let (Some(&v), 0) = (data.first(), offset) else {
            return;
        };
        let evt = match Self::decode(v) {
            Some(PmEvent::Reset) => &self.reset_evt,
            Some(PmEvent::Shutdown) => &self.shutdown_evt,
            None => {
                // E.g. the WAK_STS clear Linux writes before sleeping.
                debug!("acpi-pm: ignored write {v:#x}");
                return;
            }
        };
        if let Err(e) = evt.write(1) {
            warn!("acpi-pm: cannot signal the VMM: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    #[test]
    fn decodes_linux_writes() {
        assert_eq!(
            AcpiPmDevice::decode(0x34),
            Some(PmEvent::Shutdown),
            "S5 | SLP_EN"
        );
        assert_eq!(AcpiPmDevice::decode(PM_RESET_VALUE), Some(PmEvent::Reset));
        assert_eq!(AcpiPmDevice::decode(0x80), None, "WAK_STS clear");
        assert_eq!(AcpiPmDevice::decode(0x2c), None, "S3 | SLP_EN");
        assert_eq!(AcpiPmDevice::decode(0x14), None, "S5 without SLP_EN");
    }

    #[test]
    fn signals_eventfds() {
        let reset = EventFd::new(EFD_NONBLOCK).unwrap();
        let off = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut d = AcpiPmDevice::new(reset.try_clone().unwrap(), off.try_clone().unwrap());
        d.write(0, &[0x80]);
        assert!(reset.read().is_err() && off.read().is_err());
        d.write(0, &[0x34]);
        assert_eq!(off.read().unwrap(), 1);
        d.write(0, &[1]);
        assert_eq!(reset.read().unwrap(), 1);
        let mut b = [0xff];
        d.read(0, &mut b);
        assert_eq!(b, [0]);
    }
}
