//! The built-in workload guest image (built by build.rs).
