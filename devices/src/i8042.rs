//! Just enough of the i8042 keyboard controller for a guest to reset the
//! machine: writing 0xFE (pulse reset line) to the command port 0x64.

use crate::bus::BusDevice;

/// Port base: data port 0x60, system port 0x61, command/status port 0x64.
pub const I8042_BASE: u64 = 0x60;
/// Ports decoded (0x60..=0x64).
pub const I8042_LEN: u64 = 5;
const CMD_OFFSET: u64 = 4;
const CMD_RESET: u8 = 0xfe;

/// The controller; calls `on_reset` when the guest asks for a reset.
pub struct I8042 {
    on_reset: Box<dyn Fn() + Send>,
    resets: u64,
}

impl I8042 {
    pub fn new(on_reset: Box<dyn Fn() + Send>) -> Self {
        Self {
            on_reset,
            resets: 0,
        }
    }

    /// How many resets the guest requested.
    pub fn resets(&self) -> u64 {
        self.resets
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        // Status 0: output buffer empty, input buffer empty (ready for a
        // command); no keyboard data. Port 0x61 reads 0 too.
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset == CMD_OFFSET && data.first() == Some(&CMD_RESET) {
            self.resets += 1;
            (self.on_reset)();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

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
