//! Benchmarks: pagefold against in-kernel KSM, side by side.
