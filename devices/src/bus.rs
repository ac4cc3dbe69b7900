//! Address-range dispatch for port-I/O and MMIO devices.
//!
//! A vCPU exit names an address; the bus finds the device whose range holds
//! it and hands it the offset into that range. Devices sit behind a mutex
//! each, so vCPUs of one VM can use different devices at once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A device on a bus. `offset` is relative to the start of its range.
pub trait BusDevice: Send {
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// Errors of bus set-up.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("bus range {base:#x}+{len:#x} is empty or overlaps another device")]
    Overlap { base: u64, len: u64 },
}

type Entry = (u64, Arc<Mutex<dyn BusDevice>>);

/// A set of non-overlapping device ranges.
#[derive(Default, Clone)]
pub struct Bus {
    // base -> (len, device)
    devices: BTreeMap<u64, Entry>,
}

impl Bus {
    pub fn new() -> Self {
        Self::default()
    }

    /// Places `dev` at `base..base+len`.
    pub fn insert(
        &mut self,
        dev: Arc<Mutex<dyn BusDevice>>,
        base: u64,
        len: u64,
    ) -> Result<(), Error> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(Error::Overlap { base, len })?;
        if let Some((&b, (l, _))) = self.devices.range(..end).next_back() {
            if b + *l > base {
                return Err(Error::Overlap { base, len });
            }
        }
        self.devices.insert(base, (len, dev));
        Ok(())
    }

    /// The device covering `addr` and the offset of `addr` in its range.
    pub fn resolve(&self, addr: u64) -> Option<(u64, Arc<Mutex<dyn BusDevice>>)> {
        let (&base, (len, dev)) = self.devices.range(..=addr).next_back()?;
        (addr - base < *len).then(|| (addr - base, dev.clone()))
    }

    /// Dispatches a read; returns false if no device claims `addr`.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.resolve(addr) {
            Some((off, dev)) => {
                dev.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .read(off, data);
                true
            }
            None => false,
        }
    }

    /// Dispatches a write; returns false if no device claims `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.resolve(addr) {
            Some((off, dev)) => {
                dev.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .write(off, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rec(Vec<(u64, u8)>);
    impl BusDevice for Rec {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data[0]));
        }
    }

    #[test]
    fn dispatch_and_overlap() {
        let mut bus = Bus::new();
        let a = Arc::new(Mutex::new(Rec(vec![])));
        bus.insert(a.clone(), 0x3f8, 8).unwrap();
        assert_eq!(
            bus.insert(a.clone(), 0x3fc, 8),
            Err(Error::Overlap {
                base: 0x3fc,
                len: 8
            })
        );
        assert_eq!(
            bus.insert(a.clone(), 0x3f0, 9),
            Err(Error::Overlap {
                base: 0x3f0,
                len: 9
            })
        );
        assert_eq!(
            bus.insert(a.clone(), 0x10, 0),
            Err(Error::Overlap { base: 0x10, len: 0 })
        );
        bus.insert(a.clone(), 0x3f0, 8).unwrap();
        let mut d = [0u8; 1];
        assert!(bus.read(0x3fa, &mut d));
        assert_eq!(d[0], 2);
        assert!(!bus.read(0x400, &mut d));
        assert!(!bus.read(0x3e0, &mut d));
        assert!(bus.write(0x3f7, &[9]));
        assert_eq!(a.lock().unwrap().0, vec![(7, 9)]);
    }
}
