//! Auto mode: merge only while host free memory is low.
