//! Kernel-KSM backend (madvise + sysfs).
