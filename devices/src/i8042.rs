//! Just enough of the i8042 keyboard controller for a guest to reset the
//! machine: vm-superio's `I8042Device`, which turns 0xFE (pulse reset
//! line) written to the command port 0x64 into a trigger, on our port bus.

use std::sync::atomic::{AtomicU64, Ordering};

use vm_superio::{I8042Device, Trigger};

use crate::bus::BusDevice;

/// Port base: data port 0x60, system port 0x61, command/status port 0x64.
pub const I8042_BASE: u64 = 0x60;
/// Ports decoded (0x60..=0x64).
pub const I8042_LEN: u64 = 5;

/// The trigger vm-superio fires on a reset command: counts and calls back.
struct ResetTrigger {
    on_reset: Box<dyn Fn() + Send>,
    resets: AtomicU64,
}

impl Trigger for ResetTrigger {
    type E = std::convert::Infallible;

    fn trigger(&self) -> Result<(), Self::E> {
        self.resets.fetch_add(1, Ordering::Relaxed);
        (self.on_reset)();
        Ok(())
    }
}

/// The controller; calls `on_reset` when the guest asks for a reset.
pub struct I8042(I8042Device<ResetTrigger>);

impl I8042 {
    pub fn new(on_reset: Box<dyn Fn() + Send>) -> Self {
        Self(I8042Device::new(ResetTrigger {
            on_reset,
            resets: AtomicU64::new(0),
        }))
    }

    /// How many resets the guest requested.
    pub fn resets(&self) -> u64 {
        self.0.reset_evt().resets.load(Ordering::Relaxed)
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        // Status 0: output buffer empty, input buffer empty (ready for a
        // command); no keyboard data. Port 0x61 reads 0 too.
        let v = u8::try_from(offset).map_or(0, |o| self.0.read(o));
        data.fill(v);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        // The first byte is the command; vm-superio ignores everything but
        // 0xFE at offset 4, and our trigger cannot fail.
        if let (Ok(offset), Some(&value)) = (u8::try_from(offset), data.first()) {
            let Ok(()) = self.0.write(offset, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    /// The command port and the reset command (the guest's view).
    const CMD_OFFSET: u64 = 4;
    const CMD_RESET: u8 = 0xfe;

    #[test]
    fn reset_command_calls_back() {
        let n = Arc::new(AtomicU32::new(0));
        let n2 = n.clone();
        let mut dev = I8042::new(Box::new(move || {
            n2.fetch_add(1, Ordering::SeqCst);
        }));
        dev.write(0, &[CMD_RESET]); // data port: not a reset
        dev.write(CMD_OFFSET, &[0xd1]); // other command
        assert_eq!(n.load(Ordering::SeqCst), 0);
        dev.write(CMD_OFFSET, &[CMD_RESET]);
        assert_eq!(n.load(Ordering::SeqCst), 1);
        assert_eq!(dev.resets(), 1);
        let mut st = [0xffu8];
        dev.read(CMD_OFFSET, &mut st);
        assert_eq!(st[0], 0);
    }
}
