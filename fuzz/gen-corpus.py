#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/: small valid inputs
in each target's input format (see the comment at the top of each target).
Usage: fuzz/gen-corpus.py [WORKLOAD_ELF] (an ELF for the kernel_loader seeds;
default: the workload guest ELF of a previous build, if one is found)."""
import glob, os, struct, sys

root = os.path.dirname(os.path.abspath(__file__))
corpus = os.path.join(root, "corpus")

def put(target, name, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

u16 = lambda v: struct.pack("<H", v)
u32 = lambda v: struct.pack("<I", v)
u64 = lambda v: struct.pack("<Q", v)

# config: the example files and a small config with every section.
for p in glob.glob(os.path.join(root, "..", "examples", "*.toml")):
    put("config", os.path.basename(p), open(p, "rb").read())
put("config", "full.toml", b'''stdin = "a"
[dedup]
mode = "auto"
backend = "pagefold"
pages_to_scan = 1000
sleep_millisecs = 20
max_page_sharing = 256
auto_threshold = 20
max_scanning_factor = 4
memory_signal = "available"
ksm_assist = "off"
io_hints = false
[[vm]]
name = "a"
memory = "256M"
vcpus = 2
serial = "null"
dedup = { enabled = true, group = "g" }
[vm.workload]
seed = 7
private_seed = 9
shared = "128M"
private = 64
zero_permille = 100
dup_permille = 50
churn_permille = 10
churn_rate = 1000
churn_ms = 100
phases = ["fill", "churn:50", "sleep:10", "wait:10", "rewrite", "verify"]
placement = "scattered"
extent_pages = 8
placement_seed = 3
[[vm]]
name = "b"
memory = 4097
[vm.kernel]
path = "/nonexistent/vmlinux"
cmdline = "console=ttyS0"
''')

# api_body: selector, then (VM routes) name length + name, then the body.
vm = b'{"memory": "64M", "vcpus": 1, "dedup": {"enabled": true, "group": "g"}, "workload": {"seed": 7, "shared": "32M", "phases": ["fill", "verify"], "placement": "scattered", "extent_pages": 8}}'
put("api_body", "put-vm", b"\x00" + bytes([3]) + b"vm1" + vm)
put("api_body", "put-vm-named", b"\x00" + bytes([3]) + b"vm1" + b'{"name": "vm1", "memory": 64.0}')
put("api_body", "patch-dedup", b"\x01" + b'{"mode": "auto", "pages_to_scan": 500, "sleep_millisecs": 10, "max_page_sharing": 64, "auto_threshold": 30, "max_scanning_factor": 4, "memory_signal": "free"}')
put("api_body", "patch-state", b"\x02" + b'{"state": "paused"}')
put("api_body", "cli-pairs", b"\x03" + b"mode=on\npages_to_scan=100\nmemory_signal=available")

# virtio_blk / virtio_mmio guest memory: a split queue of 16 at 0 (descs),
# 0x1000 (avail), 0x2000 (used); header at 0x3000, data at 0x3200, status at 0x3400.
NEXT, WRITE = 1, 2
def queue_mem(chains, header):
    mem = bytearray(0x3401)
    i = 0
    heads = []
    for bufs in chains:
        heads.append(i)
        for k, (addr, ln, w) in enumerate(bufs):
            last = k == len(bufs) - 1
            flags = (0 if last else NEXT) | (WRITE if w else 0)
            mem[16 * i:16 * i + 16] = u64(addr) + u32(ln) + u16(flags) + u16(i + 1)
            i += 1
    mem[0x1000:0x1004] = u16(0) + u16(len(heads))
    for n, h in enumerate(heads):
        mem[0x1004 + 2 * n:0x1006 + 2 * n] = u16(h)
    mem[0x3000:0x3010] = header
    mem[0x3200:0x3210] = b"written by fuzz!"
    return bytes(mem)

hdr = lambda t, sector: u32(t) + u32(0) + u64(sector)
read = [(0x3000, 16, False), (0x3200, 512, True), (0x3400, 1, True)]
write = [(0x3000, 16, False), (0x3200, 512, False), (0x3400, 1, True)]
getid = [(0x3000, 16, False), (0x3200, 20, True), (0x3400, 1, True)]
flush = [(0x3000, 16, False), (0x3400, 1, True)]
blk = lambda flags, chains, header: bytes([flags]) + u16(4096) + bytes([4]) + queue_mem(chains, header)
put("virtio_blk", "read", blk(0, [read], hdr(0, 1)))
put("virtio_blk", "write", blk(0, [write], hdr(1, 2)))
put("virtio_blk", "get-id-device", blk(2 | 4, [getid], hdr(8, 0)))
put("virtio_blk", "flush-ro", blk(1, [flush], hdr(4, 0)))

# virtio_net: receive queue of 16 at 0/0x1000/0x2000, transmit queue at
# 0x400/0x1400/0x2400, control queue (flag 8) at 0x800/0x1800/0x2800;
# receive buffers at 0x3000 and 0x4000, a frame to transmit at 0x5000
# (12-byte header, 60-byte frame), control requests at 0x5100 (their
# status bytes at 0x5200).
def net_mem(rx_chains, tx_chains, ctrl_chains=(), ctrl_reqs=b""):
    mem = bytearray(0x5300)
    mem[0x5100:0x5100 + len(ctrl_reqs)] = ctrl_reqs
    for (desc, avail, chains) in ((0, 0x1000, rx_chains), (0x400, 0x1400, tx_chains),
                                  (0x800, 0x1800, ctrl_chains)):
        i = 0
        heads = []
        for bufs in chains:
            heads.append(i)
            for k, (addr, ln, w) in enumerate(bufs):
                last = k == len(bufs) - 1
                flags = (0 if last else NEXT) | (WRITE if w else 0)
                mem[desc + 16 * i:desc + 16 * i + 16] = u64(addr) + u32(ln) + u16(flags) + u16(i + 1)
                i += 1
        mem[avail:avail + 4] = u16(0) + u16(len(heads))
        for n, h in enumerate(heads):
            mem[avail + 4 + 2 * n:avail + 6 + 2 * n] = u16(h)
    mem[0x5000 + 12:0x5000 + 72] = bytes(range(60))
    return bytes(mem)

def net(flags, frames, rx_chains, tx_chains, ctrl_chains=(), ctrl_reqs=b""):
    head = bytes([flags, 4, len(frames)])
    for f in frames:
        head += u16(len(f)) + f
    return head + net_mem(rx_chains, tx_chains, ctrl_chains, ctrl_reqs)

frame = lambda n: bytes(12) + bytes(i & 0xff for i in range(n))
rxbuf = [[(0x3000, 2048, True)], [(0x4000, 2048, True)]]
txbuf = [[(0x5000, 12, False), (0x5000 + 12, 60, False)]]
put("virtio_net", "rx-tx", net(0, [frame(100)], rxbuf, txbuf))
put("virtio_net", "rx-merged", net(1 | 2 | 4, [frame(3000), frame(60)], rxbuf, []))
put("virtio_net", "rx-oversize", net(0, [frame(4000)], [[(0x3000, 100, True)]], []))
# Multiqueue: set 2 pairs (OK), 3 pairs (ERR), an RX-class request (ERR),
# a request without a status byte (returned empty), then traffic.
mq_reqs = bytes([4, 0]) + u16(2) + bytes([4, 0]) + u16(3) + bytes([0, 0, 1])
ctrl = [[(0x5100, 4, False), (0x5200, 1, True)], [(0x5104, 4, False), (0x5201, 1, True)],
        [(0x5108, 3, False), (0x5202, 1, True)], [(0x5100, 4, False)]]
put("virtio_net", "mq-ctrl", net(8 | 1, [frame(100)], rxbuf, txbuf, ctrl, mq_reqs))

# virtio_balloon: queue k's rings at k*0x400 / 0x1000+k*0x400 /
# 0x2000+k*0x400, buffers from 0x3000: an inflate of PFNs (one in the
# hole, one beyond RAM), a deflate, a statistics buffer, a report of two
# ranges (one across the end of the first region).
def balloon_mem(chains):
    mem = bytearray(0x4000)
    for k, bufs_list in enumerate(chains):
        desc, avail = k * 0x400, 0x1000 + k * 0x400
        i = 0
        heads = []
        for bufs in bufs_list:
            heads.append(i)
            for j, (addr, ln, w) in enumerate(bufs):
                last = j == len(bufs) - 1
                flags = (0 if last else NEXT) | (WRITE if w else 0)
                mem[desc + 16 * i:desc + 16 * i + 16] = u64(addr) + u32(ln) + u16(flags) + u16(i + 1)
                i += 1
        mem[avail:avail + 4] = u16(0) + u16(len(heads))
        for n, h in enumerate(heads):
            mem[avail + 4 + 2 * n:avail + 6 + 2 * n] = u16(h)
    pfns = b"".join(u32(p) for p in (5, 6, 7, 0x18, 0x21, 0x1000))
    mem[0x3000:0x3000 + len(pfns)] = pfns
    stats = b"".join(u16(t) + u64(v) for t, v in ((4, 1 << 20), (5, 1 << 24), (42, 1)))
    mem[0x3100:0x3100 + len(stats)] = stats
    return bytes(mem)

balloon_chains = [
    [[(0x3000, 24, False)]],
    [[(0x3000, 12, False)]],
    [[(0x3100, 30, False)]],
    [[(0x4000, 0x2000, True), (0xf000, 0x2000, True)]],
]
put("virtio_balloon", "all-queues",
    bytes([3, 4, 6, 0, 1, 2, 0xff, 2, 3]) + balloon_mem(balloon_chains))
put("virtio_balloon", "no-stats",
    bytes([2, 4, 3, 0, 2, 1]) + balloon_mem([balloon_chains[0], balloon_chains[1], balloon_chains[3]]))

# virtio_mmio: a driver's initialization then a notify.
def w(off, v):  # register-indexed 4-byte write
    return bytes([0x80 | 0x40 | 2, off // 4]) + u32(v)
def r(off):
    return bytes([0x40 | 2, off // 4])
ops = b"".join([
    r(0x000), r(0x004), r(0x008), w(0x070, 1), w(0x070, 3),
    w(0x014, 0), r(0x010), w(0x014, 1), r(0x010),
    w(0x024, 1), w(0x020, 1), w(0x024, 0), w(0x020, 0),
    w(0x070, 0xb), r(0x070), w(0x030, 0), r(0x034), w(0x038, 16),
    w(0x080, 0), w(0x084, 0), w(0x090, 0x1000), w(0x094, 0), w(0x0a0, 0x2000), w(0x0a4, 0),
    w(0x044, 1), w(0x070, 0xf), r(0x070), w(0x050, 0), r(0x060), w(0x064, 1),
    bytes([0x00 | 2]) + u16(0x100), bytes([0x00 | 3]) + u16(0x108), bytes([0x80 | 0]) + u16(0x100) + b"\x01",
    bytes([0x20, 0]), r(0x0fc), w(0x070, 0),
])
put("virtio_mmio", "init-and-notify", b"\x00" + u16(len(ops)) + ops + queue_mem([getid], hdr(8, 0)))
put("virtio_mmio", "init-and-read", b"\x00" + u16(len(ops)) + ops + queue_mem([read], hdr(0, 3)))

# workload_mailbox: flags, 32 probe bytes, ops, memory with the mailbox at 0x1000.
BASE = 0  # kind low nibble = port - 0x500
def out(port_off, v):
    return bytes([port_off]) + u32(v)
def inp(port_off):
    return bytes([0xc0 | port_off, 4])
ops = b"".join([
    out(4, 0x1000), out(8, 0), out(0, 1), inp(12), out(0, 2), inp(12),
    out(0, 3), out(0, 5), out(0, 4), out(0, 6), out(0, 10), out(0, 7), out(0, 8), out(0, 9), inp(12),
])
mb = bytearray(0x1000 + 4096)
mb[0x1000:0x1008] = u64(3)  # args[0]: ABI version
mb[0x1000 + 0x128:0x1000 + 0x130] = u64(5)  # log_len (ignored if the offset differs)
put("workload_mailbox", "session", b"\x00" + bytes(32) + u16(len(ops)) + ops + bytes(mb))
put("workload_mailbox", "session-stopped", b"\x02" + bytes(32) + u16(len(ops)) + ops + bytes(mb))
# fuzzed params: a scattered layout with a disk.
params = u32((1 << 13) | (1 << 7) | (1 << 8) | (1 << 15)) + u64(1) + u64(16) + u32(1) + u32(8) + u64(0xd000_0000) + bytes(24)
put("workload_mailbox", "scattered-params", b"\x01" + params + bytes(range(32)) + u16(len(ops)) + ops + bytes(mb))

# kernel_loader: flags, vcpus, cmdline, initrd, kernel image.
def bzimage():
    entry = bytes([0x66, 0xba, 0xf8, 0x03, 0xee, 0xf4])
    img = bytearray(1024 + 0x1000)
    img[0x1f1] = 1
    img[0x1fe:0x200] = u16(0xaa55)
    img[0x202:0x206] = b"HdrS"
    img[0x206:0x208] = u16(0x020f)
    img[0x211] = 1
    img[0x214:0x218] = u32(0x10_0000)
    img[0x22c:0x230] = u32(0x7fff_ffff)
    img[0x230:0x234] = u32(0x20_0000)
    img[0x236:0x238] = u16(1)
    img[0x238:0x23c] = u32(2047)
    img[0x260:0x264] = u32(4 << 20)
    img[1024 + 0x200:1024 + 0x200 + len(entry)] = entry
    return bytes(img)
def kl(flags, vcpus, cmdline, initrd, kernel):
    return bytes([flags, vcpus]) + u16(len(cmdline)) + cmdline + u16(len(initrd)) + initrd + kernel
cmd = b"console=ttyS0 panic=-1"
put("kernel_loader", "bzimage-initrd", kl(2 | 0x20, 2, cmd, b"initrd" * 100, bzimage()))
put("kernel_loader", "bzimage-cmdline-devices", kl(4 | 0x30, 1, cmd, b"", bzimage()))
elf = sys.argv[1] if len(sys.argv) > 1 else next(iter(sorted(glob.glob(
    os.path.join(root, "..", "target", "*", "build", "pagefold-vmm-*", "out", "pagefold-workload.elf")))), None)
if elf:
    e = open(elf, "rb").read()
    put("kernel_loader", "workload-elf", kl(1, 1, b"", b"", e))
    put("kernel_loader", "elf-vmlinux", kl(2, 1, cmd, b"rd", e))
