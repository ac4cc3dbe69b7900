//! Parsing and execution of one virtio-blk request (virtio 1.x, 5.2.6).
//!
//! A request is a descriptor chain: device-readable descriptors (the
//! 16-byte header, then data for writes), followed by device-writable ones
//! (data for reads / GET_ID, then the 1-byte status). Any layout of these
//! bytes over descriptors is accepted (VIRTIO_F_ANY_LAYOUT is implied by
//! VERSION_1). Every guest-memory access goes through vm-memory, which
//! bounds it to guest RAM; a chain that breaks the rules gets an error
//! status if its status byte is usable, else it is returned with length 0.

use std::io::{Read, Write};
use std::ops::Deref;

use crate::virtio::{ChainReader, ChainWriter};
use crate::GuestMemoryMmap;
use log::debug;
use virtio_bindings::virtio_blk::{
    virtio_blk_outhdr, VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
    VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT,
};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, Reader, Writer};
use vm_memory::{Address, ByteValued, Bytes, GuestAddress, GuestMemory};

use super::disk::{Disk, SECTOR_SIZE};

/// Bounce-buffer size for disk <-> guest copies.
const CHUNK: usize = 64 * 1024;

/// The request header the driver puts first in the chain: virtio-bindings'
/// `virtio_blk_outhdr` (type, ioprio, sector). A newtype because reading it
/// from guest memory needs vm-memory's `ByteValued`, which only a type of
/// this crate may implement.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestHeader(pub virtio_blk_outhdr);

// SAFETY: RequestHeader is a transparent wrapper of virtio_blk_outhdr, plain
// old data of fixed layout (two u32 and one u64, no padding, as its bindings
// assert at compile time); every bit pattern is a valid value.
unsafe impl ByteValued for RequestHeader {}

/// Per-request limits the device advertises in its config space.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// VIRTIO_BLK_F_SEG_MAX: data segments per request.
    pub seg_max: u32,
    /// VIRTIO_BLK_F_SIZE_MAX: bytes per segment.
    pub size_max: u32,
}

/// Why a request failed; each maps to a status byte.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("descriptor chain is empty or unreadable")]
    EmptyChain,
    #[error("descriptor chain has a device-readable descriptor after a writable one")]
    ReadableAfterWritable,
    #[error("descriptor chain has no writable status byte at its end")]
    NoStatus,
    #[error("descriptor chain has {0} descriptors, more than the advertised seg_max + 2")]
    TooManySegments(usize),
    #[error("descriptor of {0} bytes exceeds the advertised size_max")]
    SegmentTooLarge(u32),
    #[error("descriptor chain points outside guest memory: {0}")]
    BadBuffer(virtio_queue::Error),
    #[error("request header is incomplete: {0}")]
    ShortHeader(std::io::Error),
    #[error("data length {0} is not a multiple of the sector size")]
    Unaligned(usize),
    #[error("sectors {sector}..+{count} are beyond the disk's {capacity} sectors")]
    OutOfRange {
        sector: u64,
        count: u64,
        capacity: u64,
    },
    #[error("write to a read-only disk")]
    ReadOnly,
    #[error("unsupported request type {0}")]
    Unsupported(u32),
    #[error("disk I/O failed: {0}")]
    Io(std::io::Error),
    #[error("guest memory access failed: {0}")]
    Memory(std::io::Error),
}

impl Error {
    /// The status byte the driver sees for this failure.
    pub fn status(&self) -> u8 {
        match self {
            Error::Unsupported(_) => VIRTIO_BLK_S_UNSUPP as u8,
            _ => VIRTIO_BLK_S_IOERR as u8,
        }
    }
}

/// The outcome of one request: the status byte written (if any) and the
/// number of bytes written to the chain's writable part, for the used ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub status: Option<u8>,
    pub used_len: u32,
}

/// Executes the request in `chain` against `disk` and writes its status.
/// After a successful read, `filled` gets each guest range it wrote.
pub fn handle<M>(
    chain: DescriptorChain<M>,
    mem: &GuestMemoryMmap,
    disk: &Disk,
    serial: &[u8],
    limits: Limits,
    filled: Option<&(dyn Fn(u64, usize) + Send + Sync)>,
) -> Completion
where
    M: Deref + Clone,
    M::Target: GuestMemory + Sized,
{
    let status_addr = match check_shape(chain.clone(), limits) {
        Ok(addr) => addr,
        Err(Shape::NoStatus(e)) => {
            debug!("virtio-blk: dropping request: {e}");
            return Completion {
                status: None,
                used_len: 0,
            };
        }
        Err(Shape::Invalid(addr, e)) => {
            debug!("virtio-blk: malformed request: {e}");
            return finish(mem, addr, e.status(), 0);
        }
    };
    let hint_chain = filled.map(|_| chain.clone());
    match execute(chain, mem, disk, serial) {
        Ok(data_len) => {
            if let (Some(f), Some(c)) = (filled, hint_chain) {
                report_filled(c, data_len as usize, f);
            }
            finish(mem, status_addr, VIRTIO_BLK_S_OK as u8, data_len)
        }
        Err(e) => {
            debug!("virtio-blk: request failed: {e}");
            finish(mem, status_addr, e.status(), 0)
        }
    }
}

/// Calls `f` for the writable descriptors holding the first `len` data
/// bytes (a read's destination; the status byte is not included).
fn report_filled<M>(
    chain: DescriptorChain<M>,
    mut len: usize,
    f: &(dyn Fn(u64, usize) + Send + Sync),
) where
    M: Deref + Clone,
    M::Target: GuestMemory + Sized,
{
    for d in chain.filter(|d| d.is_write_only()) {
        if len == 0 {
            break;
        }
        let n = (d.len() as usize).min(len);
        f(d.addr().0, n);
        len -= n;
    }
}

/// Writes the status byte. If even that fails, the chain was lying about
/// its memory and is returned with length 0.
fn finish(
    mem: &GuestMemoryMmap,
    status_addr: GuestAddress,
    status: u8,
    data_len: u32,
) -> Completion {
    match mem.write_obj(status, status_addr) {
        Ok(()) => Completion {
            status: Some(status),
            used_len: data_len.saturating_add(1),
        },
        Err(e) => {
            debug!("virtio-blk: status byte not writable: {e}");
            Completion {
                status: None,
                used_len: 0,
            }
        }
    }
}

enum Shape {
    /// No usable status byte: nothing can be reported.
    NoStatus(Error),
    /// The status byte is at this address, but the chain is invalid.
    Invalid(GuestAddress, Error),
}

/// Checks the chain's layout and limits; returns the status byte address.
fn check_shape<M>(chain: DescriptorChain<M>, limits: Limits) -> Result<GuestAddress, Shape>
where
    M: Deref + Clone,
    M::Target: GuestMemory + Sized,
{
    let max_descs = limits.seg_max as usize + 2;
    let mut last: Option<Descriptor> = None;
    let mut count = 0usize;
    let mut seen_writable = false;
    let mut layout_error = None;
    let mut too_large = None;
    // The chain iterator stops at loops (ttl) and bad indices; cap the walk
    // anyway so a long chain costs bounded time.
    for desc in chain.take(max_descs + 1) {
        count += 1;
        if desc.is_write_only() {
            seen_writable = true;
        } else if seen_writable {
            layout_error = Some(Error::ReadableAfterWritable);
        }
        if desc.len() > limits.size_max && too_large.is_none() {
            too_large = Some(desc.len());
        }
        last = Some(desc);
    }
    let last = last.ok_or(Shape::NoStatus(Error::EmptyChain))?;
    if !last.is_write_only() || last.len() == 0 {
        return Err(Shape::NoStatus(Error::NoStatus));
    }
    let status_addr = last
        .addr()
        .checked_add(u64::from(last.len()) - 1)
        .ok_or(Shape::NoStatus(Error::NoStatus))?;
    if count > max_descs {
        return Err(Shape::Invalid(status_addr, Error::TooManySegments(count)));
    }
    if let Some(e) = layout_error {
        return Err(Shape::Invalid(status_addr, e));
    }
    if let Some(len) = too_large {
        return Err(Shape::Invalid(status_addr, Error::SegmentTooLarge(len)));
    }
    Ok(status_addr)
}

/// Runs the request; returns the number of data bytes written to the guest.
fn execute<M>(
    chain: DescriptorChain<M>,
    mem: &GuestMemoryMmap,
    disk: &Disk,
    serial: &[u8],
) -> Result<u32, Error>
where
    M: Deref + Clone,
    M::Target: GuestMemory + Sized,
{
    let mut reader: ChainReader<'_> = Reader::new(mem, chain.clone()).map_err(Error::BadBuffer)?;
    let mut writer: ChainWriter<'_> = Writer::new(mem, chain).map_err(Error::BadBuffer)?;
    // The last writable byte is the status; `writer` keeps the data part.
    let data_len = writer
        .available_bytes()
        .checked_sub(1)
        .ok_or(Error::NoStatus)?;
    writer.split_at(data_len).map_err(Error::BadBuffer)?;

    let RequestHeader(header) = reader.read_obj().map_err(Error::ShortHeader)?;
    match header.type_ {
        VIRTIO_BLK_T_IN => {
            let len = writer.available_bytes();
            let off = check_range(disk, header.sector, len)?;
            copy_disk_to_guest(disk, off, len, &mut writer)?;
            Ok(len as u32)
        }
        VIRTIO_BLK_T_OUT => {
            if disk.read_only() {
                return Err(Error::ReadOnly);
            }
            let len = reader.available_bytes();
            let off = check_range(disk, header.sector, len)?;
            copy_guest_to_disk(&mut reader, disk, off, len)?;
            Ok(0)
        }
        VIRTIO_BLK_T_FLUSH => {
            disk.flush().map_err(Error::Io)?;
            Ok(0)
        }
        VIRTIO_BLK_T_GET_ID => {
            let mut id = [0u8; VIRTIO_BLK_ID_BYTES as usize];
            let n = serial.len().min(id.len());
            id[..n].copy_from_slice(&serial[..n]);
            let len = writer.available_bytes().min(id.len());
            writer.write_all(&id[..len]).map_err(Error::Memory)?;
            Ok(len as u32)
        }
        t => Err(Error::Unsupported(t)),
    }
}

/// Checks that `len` bytes at `sector` are whole sectors inside the disk;
/// returns the byte offset.
fn check_range(disk: &Disk, sector: u64, len: usize) -> Result<u64, Error> {
    if (len as u64) % SECTOR_SIZE != 0 {
        return Err(Error::Unaligned(len));
    }
    let count = len as u64 / SECTOR_SIZE;
    let capacity = disk.nsectors();
    match sector.checked_add(count) {
        Some(end) if end <= capacity => Ok(sector * SECTOR_SIZE),
        _ => Err(Error::OutOfRange {
            sector,
            count,
            capacity,
        }),
    }
}

fn copy_disk_to_guest(
    disk: &Disk,
    mut off: u64,
    mut len: usize,
    writer: &mut ChainWriter<'_>,
) -> Result<(), Error> {
    let mut buf = vec![0u8; len.min(CHUNK)];
    while len > 0 {
        let n = len.min(CHUNK);
        disk.read_at(&mut buf[..n], off).map_err(Error::Io)?;
        writer.write_all(&buf[..n]).map_err(Error::Memory)?;
        off += n as u64;
        len -= n;
    }
    Ok(())
}

fn copy_guest_to_disk(
    reader: &mut ChainReader<'_>,
    disk: &Disk,
    mut off: u64,
    mut len: usize,
) -> Result<(), Error> {
    let mut buf = vec![0u8; len.min(CHUNK)];
    while len > 0 {
        let n = len.min(CHUNK);
        reader.read_exact(&mut buf[..n]).map_err(Error::Memory)?;
        disk.write_at(&buf[..n], off).map_err(Error::Io)?;
        off += n as u64;
        len -= n;
    }
    Ok(())
}
