//! The workload control device (host side of guest/abi).
