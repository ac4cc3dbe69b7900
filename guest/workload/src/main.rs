//! pagefold's workload guest: a freestanding 64-bit program that runs at CPL3
//! on identity-mapped RAM, fetches its parameters from the workload control
//! device and runs a program of memory phases (fill, churn, verify, ...),
//! reporting each to the host. See docs/workload-guest.md.
#![no_std]
#![no_main]

mod build;
mod clock;
mod host;
mod merge_probe;
mod phases;
mod probe;
mod program;
mod rt;
mod store;
mod virtio;

use core::arch::global_asm;

// Entry: the VMM jumps here at CPL3 with RSP = layout::STACK_TOP and no
// other set-up. Zero .bss (the ELF loader copies file-backed bytes only),
// align the stack as the SysV ABI wants at a call, and enter Rust.
global_asm!(
    ".section .text._start,\"ax\",@progbits",
    ".globl _start",
    "_start:",
    "    lea rdi, [rip + __bss_start]",
    "    lea rcx, [rip + __bss_end]",
    "    sub rcx, rdi",
    "    xor eax, eax",
    "    cld",
    "    rep stosb",
    "    and rsp, -16",
    "    call {main}",
    "    ud2",
    main = sym workload_main,
);

/// Rust entry point, called from `_start`.
extern "C" fn workload_main() -> ! {
    let code = program::run();
    host::exit(code)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    match info.location() {
        Some(l) => log!("panic at {}:{}: {}", l.file(), l.line(), info.message()),
        None => log!("panic: {}", info.message()),
    }
    host::exit(pagefold_guest_abi::mailbox::exit_code::PANIC)
}
