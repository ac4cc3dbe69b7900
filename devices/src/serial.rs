//! The 8250/16550 UART at 0x3f8 (IRQ 4), on vm-superio.
//!
//! Output goes to a writer chosen by the VMM: stdout (with each line prefixed
//! by the VM's name when several VMs share a terminal) or a file per VM.

use std::io::{self, Write};

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;

/// Legacy COM1 port base.
pub const COM1_BASE: u64 = 0x3f8;
/// Ports the UART decodes.
pub const COM1_LEN: u64 = 8;
/// Legacy COM1 interrupt line.
pub const COM1_IRQ: u32 = 4;

/// Raises the UART's interrupt through an irqfd.
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// A serial port on the I/O bus.
pub struct SerialDevice {
    uart: Serial<IrqTrigger, NoEvents, Box<dyn Write + Send>>,
}

impl SerialDevice {
    pub fn new(irq: EventFd, out: Box<dyn Write + Send>) -> Self {
        Self {
            uart: Serial::new(IrqTrigger(irq), out),
        }
    }

    /// Feeds host input (stdin) to the guest; returns how many bytes fit.
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> usize {
        self.uart.enqueue_raw_bytes(bytes).unwrap_or(0)
    }

    /// Flushes buffered output (e.g. a partial last line) at VM exit.
    pub fn flush(&mut self) {
        let _ = self.uart.writer_mut().flush();
    }
}

impl BusDevice for SerialDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if let Some(b) = data.first_mut() {
            *b = self.uart.read(offset as u8);
        }
        for b in data.iter_mut().skip(1) {
            *b = 0;
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let Some(&b) = data.first() {
            // A failed write to the host output must not stop the guest.
            if let Err(e) = self.uart.write(offset as u8, b) {
                log::debug!("serial write: {e}");
            }
        }
    }
}

/// Buffers output into lines and writes each one, prefixed, in one call, so
/// that the lines of several VMs sharing one terminal never interleave.
pub struct LinePrefixWriter<W: Write> {
    prefix: Vec<u8>,
    line: Vec<u8>,
    inner: W,
}

impl<W: Write> LinePrefixWriter<W> {
    /// Longest line kept before it is written out anyway.
    const MAX_LINE: usize = 4096;

    pub fn new(prefix: &str, inner: W) -> Self {
        Self {
            prefix: prefix.as_bytes().to_vec(),
            line: Vec::new(),
            inner,
        }
    }

    fn emit(&mut self) -> io::Result<()> {
        if self.line.is_empty() {
            return Ok(());
        }
        let mut out = Vec::with_capacity(self.prefix.len() + self.line.len() + 1);
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(&self.line);
        if out.last() != Some(&b'\n') {
            out.push(b'\n');
        }
        self.line.clear();
        self.inner.write_all(&out)?;
        self.inner.flush()
    }
}

impl<W: Write> Write for LinePrefixWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.prefix.is_empty() {
            // Nothing to prefix: pass bytes through (prompts without a
            // newline show at once).
            self.inner.write_all(buf)?;
            return Ok(buf.len());
        }
        for &b in buf {
            if b == b'\r' {
                continue;
            }
            self.line.push(b);
            if b == b'\n' || self.line.len() >= Self::MAX_LINE {
                self.emit()?;
            }
        }
        Ok(buf.len())
    }

    /// Flushes complete lines only: the UART flushes after every byte, and
    /// a partial line must not be cut (it is written at drop).
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write> Drop for LinePrefixWriter<W> {
    fn drop(&mut self) {
        let _ = self.emit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn prefixes_whole_lines() {
        let sink = Shared::default();
        let mut w = LinePrefixWriter::new("[vm0] ", sink.clone());
        w.write_all(b"hel").unwrap();
        assert!(sink.0.lock().unwrap().is_empty());
        w.write_all(b"lo\r\nworld\npa").unwrap();
        w.flush().unwrap();
        w.write_all(b"rt").unwrap();
        w.flush().unwrap();
        assert_eq!(&*sink.0.lock().unwrap(), b"[vm0] hello\n[vm0] world\n");
        drop(w);
        assert_eq!(
            &*sink.0.lock().unwrap(),
            b"[vm0] hello\n[vm0] world\n[vm0] part\n"
        );
    }

    #[test]
    fn without_prefix_bytes_pass_through() {
        let sink = Shared::default();
        let mut w = LinePrefixWriter::new("", sink.clone());
        w.write_all(b"login: ").unwrap();
        w.flush().unwrap();
        assert_eq!(&*sink.0.lock().unwrap(), b"login: ");
    }

    #[test]
    fn uart_transmits_to_writer() {
        let sink = Shared::default();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut s = SerialDevice::new(irq, Box::new(sink.clone()));
        for &b in b"ok" {
            s.write(0, &[b]);
        }
        assert_eq!(&*sink.0.lock().unwrap(), b"ok");
        // Line status register: transmitter empty bits set.
        let mut lsr = [0u8];
        s.read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x60, 0);
        // Input is queued for the guest to read from the data register.
        s.write(1, &[1]); // IER: enable rx interrupt
        assert_eq!(s.enqueue_input(b"x"), 1);
        let mut d = [0u8];
        s.read(0, &mut d);
        assert_eq!(d[0], b'x');
    }
}
