//! FPU defaults and LAPIC local interrupt lines.

use kvm_bindings::{kvm_fpu, kvm_lapic_state};
use kvm_ioctls::VcpuFd;

use super::Error;

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

/// x87 control word after FNINIT, and MXCSR with all exceptions masked.
pub fn configure_fpu(vcpu: &VcpuFd) -> Result<(), Error> {
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(Error::SetFpu)
}

fn get_reg(l: &kvm_lapic_state, off: usize) -> u32 {
    let b = &l.regs[off..off + 4];
    u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
}

fn set_reg(l: &mut kvm_lapic_state, off: usize, v: u32) {
    for (i, b) in v.to_le_bytes().iter().enumerate() {
        l.regs[off + i] = *b as _;
    }
}

/// Sets a LVT entry's delivery mode (bits 8-10), keeping its other bits.
fn with_delivery_mode(reg: u32, mode: u32) -> u32 {
    (reg & !0x700) | (mode << 8)
}

/// LINT0 = ExtINT (the legacy PIC), LINT1 = NMI, as firmware leaves them.
pub fn configure_lint(vcpu: &VcpuFd) -> Result<(), Error> {
    let mut l = vcpu.get_lapic().map_err(Error::Lapic)?;
    let lvt0 = get_reg(&l, APIC_LVT0);
    set_reg(
        &mut l,
        APIC_LVT0,
        with_delivery_mode(lvt0, APIC_MODE_EXTINT),
    );
    let lvt1 = get_reg(&l, APIC_LVT1);
    set_reg(&mut l, APIC_LVT1, with_delivery_mode(lvt1, APIC_MODE_NMI));
    vcpu.set_lapic(&l).map_err(Error::Lapic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lvt_delivery_mode_bits() {
        let mut l = kvm_lapic_state::default();
        set_reg(&mut l, APIC_LVT0, 0x0001_0000 | 0x300);
        let v = with_delivery_mode(get_reg(&l, APIC_LVT0), APIC_MODE_EXTINT);
        assert_eq!(v, 0x0001_0700);
        assert_eq!(with_delivery_mode(0xffff_ffff, APIC_MODE_NMI), 0xffff_fcff);
        set_reg(&mut l, APIC_LVT1, 0xdead_beef);
        assert_eq!(get_reg(&l, APIC_LVT1), 0xdead_beef);
    }
}
