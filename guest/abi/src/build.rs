//! The modelled build: a source tree on a disk image, and the compile and
//! link steps the workload guest's BUILD phase runs over it.
//!
//! The classic dedup experiment is two copies of one VM building one kernel
//! tree side by side. This module is that build in miniature, with the
//! memory behaviour that matters to a dedup engine: a page cache of the
//! source tree (identical in both VMs), compile jobs whose heap pages come
//! from a free list and are rewritten job after job (merged heap pages get
//! COW-broken), object files and one linked output whose content depends
//! only on the source (identical in both VMs, so mergeable).
//!
//! Everything here is deterministic and shared by guest and host: the guest
//! runs [`compile_and_link`] over its guest-physical pages, the host runs the
//! very same function over a `Vec` ([`expected`], feature `std`) to predict
//! the output checksum both VMs must report.
//!
//! **Tree image.** Page 0 is a header ([`TreeHeader`]); then file `f` of
//! `files` occupies [`file_pages`] whole pages from [`file_start`] (page
//! aligned, like a file system's blocks), its [`file_size`] bytes of
//! text-like content ([`TextGen`]: lines of identifiers from a small
//! vocabulary and punctuation) followed by zeros.
//!
//! **Build area.** The guest's disk area, counted in *logical* slots, which a
//! [`Perm`] maps to disk-area pages (scattered by default, as a real guest's
//! page allocator scatters page-cache and heap pages; linear on request):
//! `[0, T)` page cache (disk page `k` in slot `k`), `[T, 2T)` objects,
//! `[2T, 3T)` the linked output, then [`HEAP_POOL`] heap pages;
//! `T = tree_pages`. See [`area_pages`].

use crate::disk::{checksum_step, page_digest, CHECKSUM_INIT};
use crate::generator::{fmix64, PageWords, WORDS};
use crate::PAGE_SIZE;

/// Word 0 of the tree header ("pfbuild1").
pub const TREE_MAGIC: u64 = 0x7066_6275_696c_6431;
/// Word 0 of an object's header, xor the file index.
pub const OBJ_MAGIC: u64 = 0x7066_6f62_6a65_6374;
/// Word 0 of the linked output's header.
pub const OUT_MAGIC: u64 = 0x7066_6f75_7470_7574;

/// Largest source file, in pages ([`file_size`] stays below it).
pub const MAX_FILE_PAGES: u64 = 11;
/// Pages of a compile job's symbol table (2048 entries of 8 bytes).
pub const SYMTAB_PAGES: u64 = 4;
/// Heap pages of the build area: the symbol table plus the token array of
/// the largest file (at most one 4-byte token per source byte).
pub const HEAP_POOL: u64 = SYMTAB_PAGES + 4 * MAX_FILE_PAGES;
/// Most files a tree may hold (keeps every count in a u32).
pub const MAX_FILES: u32 = 1 << 20;
/// Words of the vocabulary identifiers are drawn from.
const VOCAB: u64 = 400;
const SYMTAB_ENTRIES: usize = (SYMTAB_PAGES as usize) * WORDS;
const U32_PER_PAGE: u64 = PAGE_SIZE / 4;

/// What the host chooses for a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeSpec {
    /// Content seed: same seed, same tree.
    pub seed: u64,
    /// Number of source files (1..=[`MAX_FILES`]).
    pub files: u32,
    /// Optimisation rounds each compile job runs over its tokens: the CPU
    /// cost per file (about 1 ns per token and round).
    pub rounds: u32,
}

/// Page 0 of a tree image: what the guest learns from the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeHeader {
    pub spec: TreeSpec,
    /// Pages of the image: header plus every file's pages.
    pub tree_pages: u64,
}

/// Why a header page is not a tree header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TreeError {
    BadMagic(u64),
    BadFiles(u64),
    /// The stored page count disagrees with the one the spec implies.
    BadPages {
        stored: u64,
        computed: u64,
    },
}

impl core::fmt::Display for TreeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::BadMagic(m) => write!(f, "not a build tree (magic {m:#x})"),
            Self::BadFiles(n) => write!(f, "build tree with {n} files (1..={MAX_FILES})"),
            Self::BadPages { stored, computed } => write!(
                f,
                "build tree header says {stored} pages, its files need {computed}"
            ),
        }
    }
}

impl TreeHeader {
    /// The header of the tree `spec` describes.
    pub fn new(spec: TreeSpec) -> Self {
        Self {
            spec,
            tree_pages: tree_pages(&spec),
        }
    }

    /// Header page words: magic, seed, files, rounds, tree_pages, zeros.
    pub fn write(&self, page: &mut PageWords) {
        page.fill(0);
        page[0] = TREE_MAGIC;
        page[1] = self.spec.seed;
        page[2] = u64::from(self.spec.files);
        page[3] = u64::from(self.spec.rounds);
        page[4] = self.tree_pages;
    }

    /// Parses and checks a header page.
    pub fn parse(page: &PageWords) -> Result<Self, TreeError> {
        if page[0] != TREE_MAGIC {
            return Err(TreeError::BadMagic(page[0]));
        }
        if page[2] == 0 || page[2] > u64::from(MAX_FILES) {
            return Err(TreeError::BadFiles(page[2]));
        }
        let spec = TreeSpec {
            seed: page[1],
            files: page[2] as u32,
            rounds: page[3] as u32,
        };
        let h = Self::new(spec);
        if h.tree_pages != page[4] {
            return Err(TreeError::BadPages {
                stored: page[4],
                computed: h.tree_pages,
            });
        }
        Ok(h)
    }
}

/// Size in bytes of file `f`: 512 B to 8.5 KiB, and one file in four up to
/// 32 KiB more (a long tail, as in real trees).
pub fn file_size(seed: u64, f: u32) -> u64 {
    let h = fmix64(seed ^ (u64::from(f) + 1).wrapping_mul(0xa076_1d64_78bd_642f));
    let mut size = 512 + h % 8192;
    if (h >> 40) % 4 == 0 {
        size += (h >> 16) % 32768;
    }
    size
}

/// Whole pages file `f` occupies.
pub fn file_pages(seed: u64, f: u32) -> u64 {
    file_size(seed, f).div_ceil(PAGE_SIZE)
}

/// First page of file `f` in the image (linear in `f`; sequential users
/// should accumulate [`file_pages`] instead).
pub fn file_start(seed: u64, f: u32) -> u64 {
    1 + (0..f).map(|g| file_pages(seed, g)).sum::<u64>()
}

/// Pages of the whole image.
pub fn tree_pages(spec: &TreeSpec) -> u64 {
    file_start(spec.seed, spec.files)
}

/// Build-area pages a tree of `tree_pages` pages needs.
pub const fn area_pages(tree_pages: u64) -> u64 {
    3 * tree_pages + HEAP_POOL
}

/// Text-like bytes of one file: lines of 3 to 12 tokens, indented by 0, 4 or
/// 8 spaces; tokens are identifiers from a 400-word vocabulary (skewed
/// towards the first words, as identifiers in code are) or punctuation.
pub struct TextGen {
    state: u64,
    seed: u64,
    /// Bytes of the current token or line prefix still to emit.
    pending: [u8; 16],
    pending_len: usize,
    pending_pos: usize,
    tokens_left_in_line: u32,
}

const PUNCT: &[u8] = b"(){};,=+*<>&";
const LETTERS: &[u8] = b"etaoinshrdlcumwfgypbvkxjqz_";

impl TextGen {
    pub fn new(seed: u64, f: u32) -> Self {
        Self {
            state: fmix64(seed ^ 0x7465_7874 ^ (u64::from(f) << 20)),
            seed,
            pending: [0; 16],
            pending_len: 0,
            pending_pos: 0,
            tokens_left_in_line: 0,
        }
    }

    fn rand(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        fmix64(self.state)
    }

    fn refill(&mut self) {
        self.pending_pos = 0;
        if self.tokens_left_in_line == 0 {
            let r = self.rand();
            self.tokens_left_in_line = 3 + (r % 10) as u32;
            let indent = ((r >> 8) % 3) as usize * 4;
            self.pending[0] = b'\n';
            self.pending[1..=indent].fill(b' ');
            self.pending_len = 1 + indent;
            return;
        }
        self.tokens_left_in_line -= 1;
        let r = self.rand();
        if r % 4 == 0 {
            self.pending[0] = PUNCT[((r >> 8) % PUNCT.len() as u64) as usize];
            self.pending[1] = b' ';
            self.pending_len = 2;
            return;
        }
        let a = (r >> 8) % VOCAB;
        let b = (r >> 24) % VOCAB;
        let w = a * b / VOCAB;
        let h = fmix64(self.seed ^ 0x766f_6361_6200_0000 ^ w);
        let len = 2 + (h % 9) as usize;
        for (i, c) in self.pending[..len].iter_mut().enumerate() {
            *c = LETTERS[((h >> (4 + 5 * i)) % LETTERS.len() as u64) as usize];
        }
        self.pending[len] = b' ';
        self.pending_len = len + 1;
    }

    pub fn next_byte(&mut self) -> u8 {
        if self.pending_pos == self.pending_len {
            self.refill();
        }
        let b = self.pending[self.pending_pos];
        self.pending_pos += 1;
        b
    }
}

/// Writes image page `k` of the tree `h` (host use: making the disk image).
/// Pages are produced file by file, so callers should go in order with one
/// [`ImageWriter`]; this is that writer.
pub struct ImageWriter {
    h: TreeHeader,
    next_page: u64,
    file: u32,
    file_page: u64,
    gen: TextGen,
}

impl ImageWriter {
    pub fn new(h: TreeHeader) -> Self {
        Self {
            h,
            next_page: 0,
            file: 0,
            file_page: 0,
            gen: TextGen::new(h.spec.seed, 0),
        }
    }

    /// The next image page, or `None` after the last.
    pub fn next_page(&mut self, page: &mut PageWords) -> Option<()> {
        if self.next_page >= self.h.tree_pages {
            return None;
        }
        self.next_page += 1;
        if self.next_page == 1 {
            self.h.write(page);
            return Some(());
        }
        let seed = self.h.spec.seed;
        let size = file_size(seed, self.file);
        let start = self.file_page * PAGE_SIZE;
        let mut bytes = [0u8; PAGE_SIZE as usize];
        let n = size.saturating_sub(start).min(PAGE_SIZE) as usize;
        for b in &mut bytes[..n] {
            *b = self.gen.next_byte();
        }
        for (w, c) in page.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut le = [0u8; 8];
            le.copy_from_slice(c);
            *w = u64::from_le_bytes(le);
        }
        self.file_page += 1;
        if self.file_page == file_pages(seed, self.file) {
            self.file += 1;
            self.file_page = 0;
            self.gen = TextGen::new(seed, self.file);
        }
        Some(())
    }
}

/// A bijection of `[0, n)`: `s -> (a*s + b) mod n`, `gcd(a, n) = 1`. With
/// `a` near `0.618 n` consecutive slots land far apart (scattered); `a = 1,
/// b = 0` is the identity (linear).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Perm {
    pub n: u64,
    pub a: u64,
    pub b: u64,
}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

impl Perm {
    pub const fn linear(n: u64) -> Self {
        Self { n, a: 1, b: 0 }
    }

    /// A scattered permutation keyed by `key` (e.g. the VM's private seed,
    /// so two VMs place the same page differently, as real guests do).
    pub fn scattered(n: u64, key: u64) -> Self {
        if n <= 2 {
            return Self::linear(n);
        }
        let mut a = ((n as u128 * 0x9E37_79B9_7F4A_7C15u128) >> 64) as u64 | 1;
        a += fmix64(key) % 64 * 2;
        a %= n;
        while a < 2 || gcd(a, n) != 1 {
            a = (a + 1) % n;
        }
        Self {
            n,
            a,
            b: fmix64(key ^ 0x706c_6163_6500_0000) % n,
        }
    }

    #[inline]
    pub fn map(&self, s: u64) -> u64 {
        ((u128::from(self.a) * u128::from(s) + u128::from(self.b)) % u128::from(self.n)) as u64
    }
}

/// The build area as the compile and link steps see it: logical slots
/// (page cache, objects, output, heap; see the module doc).
pub trait BuildArea {
    /// Logical slot `slot` of the area. Callers hold one page at a time.
    fn page(&mut self, slot: u64) -> &mut PageWords;
}

/// What [`compile_and_link`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildStats {
    pub files: u64,
    pub tokens: u64,
    /// Pages written: heap pages taken by jobs, object and output pages.
    pub pages_written: u64,
    /// Heap pages taken from the free list that an earlier job had used.
    pub pages_reused: u64,
    pub object_pages: u64,
    pub output_pages: u64,
    /// `disk::checksum_step` over `disk::page_digest` of every output page.
    pub checksum: u64,
}

/// The free list of heap pages: LIFO, so the pages the last job freed are
/// the first the next job takes (as a real allocator's hot free list).
struct Heap {
    base: u64,
    free: [u8; HEAP_POOL as usize],
    free_len: usize,
    used: [bool; HEAP_POOL as usize],
}

impl Heap {
    fn new(base: u64) -> Self {
        let mut free = [0u8; HEAP_POOL as usize];
        // Take slot 0 first.
        for (i, f) in free.iter_mut().enumerate() {
            *f = (HEAP_POOL as usize - 1 - i) as u8;
        }
        Self {
            base,
            free,
            free_len: HEAP_POOL as usize,
            used: [false; HEAP_POOL as usize],
        }
    }

    /// Takes a page; counts whether an earlier job had it.
    fn take(&mut self, st: &mut BuildStats) -> u64 {
        // HEAP_POOL covers the largest job; `file_size` bounds it.
        self.free_len -= 1;
        let i = self.free[self.free_len] as usize;
        if self.used[i] {
            st.pages_reused += 1;
        }
        self.used[i] = true;
        st.pages_written += 1;
        self.base + i as u64
    }

    fn give_back(&mut self, slot: u64) {
        self.free[self.free_len] = (slot - self.base) as u8;
        self.free_len += 1;
    }
}

#[inline]
fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// Streams bytes into consecutive logical slots, page by page; folds each
/// page into a checksum as it is written.
struct PageWriter {
    next_slot: u64,
    buf: PageWords,
    fill: usize,
    pages: u64,
    checksum: u64,
}

impl PageWriter {
    fn new(first_slot: u64) -> Self {
        Self {
            next_slot: first_slot,
            buf: [0; WORDS],
            fill: 0,
            pages: 0,
            checksum: CHECKSUM_INIT,
        }
    }

    fn word(&mut self, area: &mut impl BuildArea, w: u64) {
        for b in w.to_le_bytes() {
            self.byte(area, b);
        }
    }

    #[inline]
    fn byte(&mut self, area: &mut impl BuildArea, b: u8) {
        let (w, s) = (self.fill / 8, (self.fill % 8) * 8);
        self.buf[w] |= u64::from(b) << s;
        self.fill += 1;
        if self.fill == PAGE_SIZE as usize {
            self.flush(area);
        }
    }

    fn flush(&mut self, area: &mut impl BuildArea) {
        if self.fill == 0 {
            return;
        }
        *area.page(self.next_slot) = self.buf;
        self.checksum = checksum_step(self.checksum, page_digest(&self.buf));
        self.next_slot += 1;
        self.pages += 1;
        self.buf = [0; WORDS];
        self.fill = 0;
    }
}

/// Compiles every file of the tree (already in the page cache, slots
/// `[0, T)`) into objects, links them into the output, and returns what it
/// did. `tick(done, total)` runs after each file and before the link; an
/// `Err` from it stops the build.
pub fn compile_and_link<A: BuildArea, E>(
    area: &mut A,
    h: &TreeHeader,
    mut tick: impl FnMut(u64, u64) -> Result<(), E>,
) -> Result<BuildStats, E> {
    let t = h.tree_pages;
    let seed = h.spec.seed;
    let files = h.spec.files;
    let mut st = BuildStats::default();
    let mut heap = Heap::new(3 * t);
    let mut obj = PageWriter::new(t);
    let mut src_page = 1u64;
    for f in 0..files {
        let pages = file_pages(seed, f);
        compile_one(area, h, f, src_page, &mut heap, &mut obj, &mut st);
        src_page += pages;
        st.files += 1;
        tick(u64::from(f) + 1, u64::from(files) + 1)?;
    }
    st.object_pages = obj.pages;
    st.pages_written += obj.pages;
    link(area, h, &mut st);
    tick(u64::from(files) + 1, u64::from(files) + 1)?;
    Ok(st)
}

/// One compile job: tokenize file `f` into a heap token array (symbols
/// interned in a heap hash table), run `rounds` mixing passes over it, write
/// its object (page aligned, at most as many pages as the source), free the
/// heap.
fn compile_one<A: BuildArea>(
    area: &mut A,
    h: &TreeHeader,
    f: u32,
    first_page: u64,
    heap: &mut Heap,
    obj: &mut PageWriter,
    st: &mut BuildStats,
) {
    let seed = h.spec.seed;
    let size = file_size(seed, f);
    let src_pages = file_pages(seed, f);
    let mut taken = [0u64; HEAP_POOL as usize];
    let mut ntaken = 0usize;
    // Symbol table: SYMTAB_PAGES zeroed heap pages.
    for _ in 0..SYMTAB_PAGES {
        let s = heap.take(st);
        area.page(s).fill(0);
        taken[ntaken] = s;
        ntaken += 1;
    }
    let mut symbols = 0u32;
    let mut sym = [0u64; SYMTAB_PAGES as usize];
    sym.copy_from_slice(&taken[..SYMTAB_PAGES as usize]);
    let mut intern = |area: &mut A, key: u32| -> u32 {
        let key = key | 1;
        let mut i = mix32(key) as usize % SYMTAB_ENTRIES;
        loop {
            let slot = sym[i / WORDS];
            let e = &mut area.page(slot)[i % WORDS];
            if *e == 0 {
                symbols += 1;
                *e = (u64::from(key) << 32) | u64::from(symbols);
                return symbols ^ key.rotate_left(11);
            }
            if (*e >> 32) as u32 == key {
                return (*e as u32) ^ key.rotate_left(11);
            }
            i = (i + 1) % SYMTAB_ENTRIES;
        }
    };
    // Tokenize: identifiers [a-z_0-9] hashed with FNV-1a, every other
    // non-blank byte a token of its own.
    let tok_first = ntaken;
    let mut tok_buf: PageWords = [0; WORDS];
    let mut ntok = 0u64;
    let mut ident: Option<u32> = None;
    let mut src = [0u64; WORDS];
    let mut emit = |area: &mut A, v: u32, heap: &mut Heap, st: &mut BuildStats| {
        let j = (ntok % U32_PER_PAGE) as usize;
        let w = &mut tok_buf[j / 2];
        if j % 2 == 0 {
            *w = u64::from(v);
        } else {
            *w |= u64::from(v) << 32;
        }
        ntok += 1;
        if ntok % U32_PER_PAGE == 0 {
            let s = heap.take(st);
            *area.page(s) = tok_buf;
            taken[ntaken] = s;
            ntaken += 1;
        }
    };
    for p in 0..src_pages {
        src.copy_from_slice(area.page(first_page + p));
        let n = (size - p * PAGE_SIZE).min(PAGE_SIZE) as usize;
        for i in 0..n {
            let b = (src[i / 8] >> ((i % 8) * 8)) as u8;
            let is_ident = b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
            if is_ident {
                let hsh = ident.unwrap_or(0x811c_9dc5);
                ident = Some((hsh ^ u32::from(b)).wrapping_mul(0x0100_0193));
                continue;
            }
            if let Some(k) = ident.take() {
                let v = intern(area, k);
                emit(area, v, heap, st);
            }
            if b != b' ' && b != b'\n' && b != 0 {
                let v = intern(area, 0x7075_6e00 | u32::from(b));
                emit(area, v, heap, st);
            }
        }
    }
    if let Some(k) = ident.take() {
        let v = intern(area, k);
        emit(area, v, heap, st);
    }
    if ntok % U32_PER_PAGE != 0 {
        let s = heap.take(st);
        *area.page(s) = tok_buf;
        taken[ntaken] = s;
        ntaken += 1;
    }
    st.tokens += ntok;
    // Optimisation passes: each token mixed with its predecessor, in place
    // in the heap pages (the CPU-bound part, `rounds` x tokens).
    let mut acc = 0u32;
    for r in 0..h.spec.rounds {
        let mut prev = r ^ f;
        let mut left = ntok;
        for &s in &taken[tok_first..ntaken] {
            let pg = area.page(s);
            let n = left.min(U32_PER_PAGE) as usize;
            for j in 0..n {
                let w = &mut pg[j / 2];
                let sh = (j % 2) * 32;
                let v = (*w >> sh) as u32;
                let nv = mix32(v ^ prev.rotate_left(5)).wrapping_add(r);
                *w = (*w & !(0xffff_ffffu64 << sh)) | (u64::from(nv) << sh);
                prev = nv;
            }
            left -= n as u64;
        }
        acc = acc.wrapping_add(prev);
    }
    // Object: 32-byte header, one byte per token, capped at the source's
    // page count, padded to a page.
    let cap = src_pages * PAGE_SIZE;
    let payload = ntok.min(cap - 32);
    obj.word(area, OBJ_MAGIC ^ u64::from(f));
    obj.word(area, payload);
    obj.word(area, ntok);
    obj.word(area, u64::from(acc) | (u64::from(symbols) << 32));
    let mut left = payload;
    for &s in &taken[tok_first..ntaken] {
        if left == 0 {
            break;
        }
        let words: PageWords = *area.page(s);
        let n = left.min(U32_PER_PAGE) as usize;
        for j in 0..n {
            let v = (words[j / 2] >> ((j % 2) * 32)) as u32;
            obj.byte(area, (v ^ (v >> 8) ^ (v >> 16) ^ (v >> 24)) as u8);
        }
        left -= n as u64;
    }
    obj.flush(area);
    for &s in taken[..ntaken].iter().rev() {
        heap.give_back(s);
    }
}

/// Link: reads every object in order and writes the output: a header, then
/// per object an 8-byte section header and its payload, relocated (each
/// byte xor a per-object key).
fn link<A: BuildArea>(area: &mut A, h: &TreeHeader, st: &mut BuildStats) {
    let t = h.tree_pages;
    let mut out = PageWriter::new(2 * t);
    out.word(area, OUT_MAGIC);
    out.word(area, u64::from(h.spec.files));
    out.word(area, st.tokens);
    out.word(area, st.object_pages);
    let mut slot = t;
    for f in 0..h.spec.files {
        let hdr: PageWords = *area.page(slot);
        let payload = hdr[1];
        let key = fmix64(hdr[3] ^ u64::from(f)) as u8;
        out.word(area, (u64::from(f) << 32) | payload);
        let mut words = hdr;
        let mut off = 32u64;
        for _ in 0..payload {
            if off == PAGE_SIZE {
                slot += 1;
                words = *area.page(slot);
                off = 0;
            }
            let b = (words[(off / 8) as usize] >> ((off % 8) * 8)) as u8;
            out.byte(area, b ^ key);
            off += 1;
        }
        slot += 1;
    }
    out.flush(area);
    st.output_pages = out.pages;
    st.pages_written += out.pages;
    st.checksum = out.checksum;
}

/// Host side (feature `std`): the image and the expected build.
#[cfg(any(test, feature = "std"))]
mod host {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// A build area in host memory (linear: the result does not depend on
    /// placement).
    pub struct VecArea(pub Vec<PageWords>);

    impl BuildArea for VecArea {
        fn page(&mut self, slot: u64) -> &mut PageWords {
            &mut self.0[slot as usize]
        }
    }

    /// The image's pages.
    pub fn image_pages(spec: TreeSpec) -> Vec<PageWords> {
        let h = TreeHeader::new(spec);
        let mut w = ImageWriter::new(h);
        let mut v = Vec::with_capacity(h.tree_pages as usize);
        let mut page = [0u64; WORDS];
        while w.next_page(&mut page).is_some() {
            v.push(page);
        }
        v
    }

    /// The image's bytes (little endian, as the guest sees them).
    pub fn image_bytes(spec: TreeSpec) -> Vec<u8> {
        image_pages(spec)
            .iter()
            .flat_map(|p| p.iter().flat_map(|w| w.to_le_bytes()))
            .collect()
    }

    /// What a guest building `spec` reports (checksum, pages written, ...),
    /// computed by the same code over host memory.
    pub fn expected(spec: TreeSpec) -> BuildStats {
        expected_area(spec).0
    }

    /// As [`expected`], with the build area's pages after the build in
    /// logical slot order (page cache, objects, output, heap): what every
    /// guest that built `spec` holds, whatever its placement.
    pub fn expected_area(spec: TreeSpec) -> (BuildStats, Vec<PageWords>) {
        let h = TreeHeader::new(spec);
        let mut pages = image_pages(spec);
        pages.resize(area_pages(h.tree_pages) as usize, [0; WORDS]);
        let mut area = VecArea(pages);
        let r: Result<BuildStats, core::convert::Infallible> =
            compile_and_link(&mut area, &h, |_, _| Ok(()));
        match r {
            Ok(s) => (s, area.0),
            Err(e) => match e {},
        }
    }

    /// Pages a perfect merger shares among the build areas of `vms` VMs
    /// that built `spec` (KSM's `pages_sharing`: non-zero pages minus
    /// distinct contents). All-zero slots are left out: the build never
    /// writes them (the objects and output use part of their room, the
    /// heap part of its pool), so they are untouched memory, not savings.
    pub fn area_sharing(spec: TreeSpec, vms: u64) -> u64 {
        let (_, pages) = expected_area(spec);
        let mut distinct = std::collections::HashSet::new();
        let mut nonzero = 0u64;
        for p in pages.iter().filter(|p| p.iter().any(|&w| w != 0)) {
            nonzero += 1;
            distinct.insert(*p);
        }
        vms * nonzero - distinct.len() as u64
    }

    /// A scattered area, to test that placement does not change the result.
    pub struct PermArea {
        pub pages: Vec<PageWords>,
        pub perm: Perm,
    }

    impl BuildArea for PermArea {
        fn page(&mut self, slot: u64) -> &mut PageWords {
            &mut self.pages[self.perm.map(slot) as usize]
        }
    }

    /// Zero pages for an area of `n` pages.
    pub fn zero_area(n: u64) -> Vec<PageWords> {
        vec![[0; WORDS]; n as usize]
    }
}

#[cfg(any(test, feature = "std"))]
pub use host::{
    area_sharing, expected, expected_area, image_bytes, image_pages, zero_area, PermArea, VecArea,
};

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::collections::HashSet;

    const SPEC: TreeSpec = TreeSpec {
        seed: 42,
        files: 40,
        rounds: 3,
    };

    #[test]
    fn header_round_trips_and_rejects_garbage() {
        let h = TreeHeader::new(SPEC);
        let mut p = [0u64; WORDS];
        h.write(&mut p);
        assert_eq!(TreeHeader::parse(&p), Ok(h));
        let mut bad = p;
        bad[0] ^= 1;
        assert!(matches!(
            TreeHeader::parse(&bad),
            Err(TreeError::BadMagic(_))
        ));
        let mut bad = p;
        bad[4] += 1;
        assert!(matches!(
            TreeHeader::parse(&bad),
            Err(TreeError::BadPages { .. })
        ));
        let mut bad = p;
        bad[2] = 0;
        assert_eq!(TreeHeader::parse(&bad), Err(TreeError::BadFiles(0)));
    }

    #[test]
    fn files_vary_in_size_and_fit_the_heap() {
        let sizes: std::vec::Vec<u64> = (0..2000).map(|f| file_size(7, f)).collect();
        assert!(sizes
            .iter()
            .all(|&s| (512..=MAX_FILE_PAGES * PAGE_SIZE).contains(&s)));
        assert!(sizes.iter().any(|&s| s > 16384));
        assert!(sizes.iter().filter(|&&s| s < 4096).count() > 200);
        assert_eq!(
            tree_pages(&SPEC),
            1 + (0..40).map(|f| file_pages(42, f)).sum::<u64>()
        );
    }

    #[test]
    fn image_is_text_with_file_tails_zero() {
        let pages = image_pages(SPEC);
        assert_eq!(pages.len() as u64, tree_pages(&SPEC));
        let bytes = image_bytes(SPEC);
        let start = (file_start(42, 3) * PAGE_SIZE) as usize;
        let size = file_size(42, 3) as usize;
        let file = &bytes[start..start + size];
        assert!(file
            .iter()
            .all(|&b| b == b' ' || b == b'\n' || LETTERS.contains(&b) || PUNCT.contains(&b)));
        assert!(file.iter().filter(|&&b| b == b'\n').count() > 10);
        let end = (file_start(42, 4) * PAGE_SIZE) as usize;
        assert!(bytes[start + size..end].iter().all(|&b| b == 0));
        // Same seed, same image; another seed, another image.
        assert_eq!(bytes, image_bytes(SPEC));
        assert_ne!(bytes, image_bytes(TreeSpec { seed: 43, ..SPEC }));
    }

    #[test]
    fn build_is_deterministic_and_placement_independent() {
        let e = expected(SPEC);
        assert_eq!(e.files, 40);
        assert!(e.tokens > 1000);
        assert!(e.object_pages >= 40 && e.object_pages < tree_pages(&SPEC));
        assert!(e.output_pages >= 1 && e.output_pages < tree_pages(&SPEC));
        // Jobs reuse the free list's pages.
        assert!(e.pages_reused > 30 * SYMTAB_PAGES, "{e:?}");
        assert_eq!(expected(SPEC), e);
        // Scattered placement, dirty (non-zero) heap and area: same result.
        let h = TreeHeader::new(SPEC);
        let n = area_pages(h.tree_pages);
        let perm = Perm::scattered(n, 99);
        let mut pages = zero_area(n);
        for (k, p) in image_pages(SPEC).into_iter().enumerate() {
            pages[perm.map(k as u64) as usize] = p;
        }
        for s in h.tree_pages..n {
            pages[perm.map(s) as usize] = [0xdead_beef; WORDS];
        }
        let mut area = PermArea { pages, perm };
        let mut ticks = 0;
        let r: Result<_, ()> = compile_and_link(&mut area, &h, |_, _| {
            ticks += 1;
            Ok(())
        });
        assert_eq!(r.unwrap(), e);
        assert_eq!(ticks, 41);
        // Another seed or more rounds change the output.
        assert_ne!(expected(TreeSpec { seed: 43, ..SPEC }).checksum, e.checksum);
        assert_ne!(
            expected(TreeSpec { rounds: 4, ..SPEC }).checksum,
            e.checksum
        );
    }

    #[test]
    fn two_builds_share_their_whole_area_but_the_distinct_copies() {
        let (stats, pages) = expected_area(SPEC);
        assert_eq!(stats, expected(SPEC));
        let one = area_sharing(SPEC, 1);
        let two = area_sharing(SPEC, 2);
        let nonzero = pages.iter().filter(|p| p.iter().any(|&w| w != 0)).count() as u64;
        // The second VM's non-zero pages all merge into the first's.
        assert_eq!(two, one + nonzero);
        // The page cache alone is tree_pages distinct non-zero pages.
        assert!(nonzero >= tree_pages(&SPEC) + stats.object_pages + stats.output_pages);
    }

    #[test]
    fn a_tick_error_stops_the_build() {
        let h = TreeHeader::new(SPEC);
        let mut pages = image_pages(SPEC);
        pages.resize(area_pages(h.tree_pages) as usize, [0; WORDS]);
        let mut area = VecArea(pages);
        let mut n = 0;
        let r = compile_and_link(&mut area, &h, |d, _| {
            n += 1;
            if d == 5 {
                Err("stop")
            } else {
                Ok(())
            }
        });
        assert_eq!(r, Err("stop"));
        assert_eq!(n, 5);
    }

    #[test]
    fn perms_are_bijections() {
        for n in [1u64, 2, 3, 10, 97, 1000, 4096, 12_345] {
            for key in [0u64, 1, 77] {
                let p = Perm::scattered(n, key);
                let set: HashSet<u64> = (0..n).map(|s| p.map(s)).collect();
                assert_eq!(set.len() as u64, n, "n {n} key {key}");
                assert!(set.iter().all(|&s| s < n));
            }
        }
        let p = Perm::scattered(10_000, 5);
        // Scattered: neighbours land far apart.
        assert!(p.map(1).abs_diff(p.map(0)) > 100);
        assert_ne!(Perm::scattered(10_000, 5), Perm::scattered(10_000, 6));
        assert_eq!(Perm::linear(10).map(7), 7);
    }
}
