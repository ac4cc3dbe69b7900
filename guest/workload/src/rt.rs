//! The C memory functions that `core` calls (there is no libc here). String
//! instructions, not Rust loops: LLVM would turn a copy/fill loop back into a
//! call to the very function being defined.

use core::arch::asm;

/// # Safety
/// C `memset` contract: `dst..dst+n` writable.
#[no_mangle]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees the range; `rep stosb` writes exactly n bytes
    // forward (DF is clear: the SysV ABI requires it at calls).
    unsafe {
        asm!("rep stosb", inout("rcx") n => _, inout("rdi") dst => _, in("al") c as u8,
             options(nostack, preserves_flags));
    }
    dst
}

/// # Safety
/// C `memcpy` contract: valid, non-overlapping ranges.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees both ranges; forward byte copy.
    unsafe {
        asm!("rep movsb", inout("rcx") n => _, inout("rdi") dst => _, inout("rsi") src => _,
             options(nostack, preserves_flags));
    }
    dst
}

/// # Safety
/// C `memmove` contract: valid ranges, which may overlap.
#[no_mangle]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize).wrapping_sub(src as usize) >= n {
        // dst before src or no overlap: a forward copy is safe.
        // SAFETY: as memcpy; forward order never reads a byte already overwritten.
        unsafe { memcpy(dst, src, n) };
    } else {
        // SAFETY: overlapping with dst after src: copy backwards from the last
        // byte (DF set for the copy, cleared again as the ABI requires).
        unsafe {
            asm!("std", "rep movsb", "cld",
                 inout("rcx") n => _, inout("rdi") dst.add(n - 1) => _,
                 inout("rsi") src.add(n - 1) => _, options(nostack));
        }
    }
    dst
}

/// # Safety
/// C `memcmp` contract: both ranges readable.
#[no_mangle]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        // SAFETY: i < n and the caller guarantees n readable bytes at a and b.
        let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
    }
    0
}

/// # Safety
/// As `memcmp`.
#[no_mangle]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: same contract as memcmp.
    unsafe { memcmp(a, b, n) }
}
