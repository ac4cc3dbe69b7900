//! virtio-mmio transport and virtio-blk.
