//! Ethernet MAC addresses as the config file, the API and the CLI spell
//! them (`52:54:00:12:34:56`), and the default a NIC gets without one.

use std::fmt;
use std::str::FromStr;

/// Errors parsing a MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("invalid MAC address {0:?}: expected six hex byte pairs separated by ':' (e.g. 52:54:00:12:34:56)")]
    Syntax(String),
    #[error("invalid MAC address {0}: a multicast address (lowest bit of the first byte set) cannot be a NIC's")]
    Multicast(String),
}

/// A unicast Ethernet MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr([u8; 6]);

impl MacAddr {
    /// The locally administered prefix QEMU and libvirt use; the defaults
    /// below stay inside it, so they never collide with a vendor's address.
    pub const LOCAL_PREFIX: [u8; 3] = [0x52, 0x54, 0x00];

    /// Builds an address from its bytes; refuses multicast addresses,
    /// which a NIC cannot own.
    pub fn from_bytes(b: [u8; 6]) -> Result<Self, Error> {
        let m = Self(b);
        if b[0] & 1 != 0 {
            return Err(Error::Multicast(m.to_string()));
        }
        Ok(m)
    }

    /// The address as six bytes (the config-space layout).
    pub fn bytes(&self) -> [u8; 6] {
        self.0
    }

    /// The default address of NIC `index` of VM `vm`: 52:54:00 and three
    /// bytes of an FNV-1a hash of both, so the same VM gets the same
    /// address on every start (a DHCP lease or an ARP cache stays valid)
    /// and two VMs of one host most likely differ; give explicit
    /// addresses where a collision would matter.
    pub fn default_for(vm: &str, index: usize) -> Self {
        let mut h: u32 = 0x811c_9dc5;
        for b in vm.bytes().chain((index as u32).to_le_bytes()) {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
        let [a, b, c, _] = h.to_be_bytes();
        let p = Self::LOCAL_PREFIX;
        Self([p[0], p[1], p[2], a, b, c])
    }
}

impl FromStr for MacAddr {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let syntax = || Error::Syntax(s.to_string());
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let p = parts.next().ok_or_else(syntax)?;
            // from_str_radix alone would take a sign ("+5").
            if p.len() != 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(syntax());
            }
            *byte = u8::from_str_radix(p, 16).map_err(|_| syntax())?;
        }
        if parts.next().is_some() {
            return Err(syntax());
        }
        Self::from_bytes(out)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddr({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_the_colon_form() {
        let m: MacAddr = "52:54:00:AB:cd:0f".parse().unwrap();
        assert_eq!(m.bytes(), [0x52, 0x54, 0x00, 0xab, 0xcd, 0x0f]);
        assert_eq!(m.to_string(), "52:54:00:ab:cd:0f");
    }

    #[test]
    fn rejects_malformed_and_multicast_addresses() {
        for bad in [
            "",
            "52:54:00:12:34",
            "52:54:00:12:34:56:78",
            "52-54-00-12-34-56",
            "52:54:00:12:34:5",
            "52:54:00:12:34:567",
            "52:54:00:12:34:zz",
            "+5:54:00:12:34:56",
            "52:54:00:12:34:56:",
        ] {
            assert!(
                matches!(bad.parse::<MacAddr>(), Err(Error::Syntax(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            "01:00:5e:00:00:01".parse::<MacAddr>(),
            Err(Error::Multicast(_))
        ));
    }

    #[test]
    fn defaults_are_stable_local_unicast_and_differ_per_nic_and_vm() {
        let a0 = MacAddr::default_for("vm0", 0);
        assert_eq!(a0, MacAddr::default_for("vm0", 0));
        assert_eq!(a0.bytes()[..3], MacAddr::LOCAL_PREFIX);
        assert_eq!(a0.bytes()[0] & 1, 0);
        assert_ne!(a0, MacAddr::default_for("vm0", 1));
        assert_ne!(a0, MacAddr::default_for("vm1", 0));
    }
}
