//! VMM.
