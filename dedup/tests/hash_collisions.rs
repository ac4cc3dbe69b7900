//! Pages whose 32-bit hash folds collide (root: userfaultfd and pagemap
//! PFNs). The engine stores a 32-bit fold per page and files pool slots
//! under it; two distinct contents share a fold about twice in a pair of
//! 64 Ki-page guests. Such pages must still find their own twins.

mod common;

use std::collections::HashMap;

use common::*;
use pagefold_dedup::pagemap::Pagemap;
use pagefold_dedup::DedupBackend;

/// Two pattern values whose pages fold to one 32-bit hash (the engine's
/// fold of xxh3-64: low half xor high half) with different 64-bit hashes.
fn colliding_patterns() -> (u64, u64) {
    let mut seen: HashMap<u32, (u64, u64)> = HashMap::new();
    for v in 1u64.. {
        let h = twox_hash::XxHash3_64::oneshot(&pattern(v));
        let fold = (h ^ (h >> 32)) as u32;
        match seen.get(&fold) {
            Some(&(w, hw)) if hw != h => return (w, v),
            Some(_) => {}
            None => {
                seen.insert(fold, (v, h));
            }
        }
    }
    unreachable!("a fold collision exists within 2^32 + 1 patterns")
}

#[test]
fn twins_whose_hash_names_another_contents_slot_still_merge() {
    let (x, y) = colliding_patterns();
    assert_ne!(pattern(x), pattern(y));
    let pm = Pagemap::open().unwrap();
    // Page 0: content x (a pair, so a slot filed under the shared fold);
    // page 1: unique to each guest (no run reaches page 2); page 2:
    // content y, whose stored fold names x's slot.
    let (a, b) = (Mem::new(3), Mem::new(3));
    for (m, unique) in [(&a, 1u64 << 40), (&b, 2u64 << 40)] {
        m.fill(0, x);
        m.fill(1, unique);
        m.fill(2, y);
    }
    let e = engine(256);
    let _ra = a.register(&e, "vm-a", "g");
    let _rb = b.register(&e, "vm-b", "g");
    // A pair forms on the second pass (KSM's rule: unchanged since the
    // first). y's copy in b may try x's slot, reserved in that same pass
    // and so not comparable yet, and fail its final compare: one pass
    // later, y's twins pair. Joining x's slot again and again instead
    // kept the twins out of step (each tried it on the pass the other was
    // filed as unique) for three more passes, or for good once levels
    // stopped spacing their visits.
    e.scan_now(3);
    let s = e.stats();
    assert_eq!(a.pfn(&pm, 0), b.pfn(&pm, 0), "x's twins: {s:?}");
    assert_eq!(
        a.pfn(&pm, 2),
        b.pfn(&pm, 2),
        "y's twins unmerged after 3 passes: {s:?}"
    );
    assert_ne!(a.pfn(&pm, 1), b.pfn(&pm, 1));
    assert_eq!((s.pages_shared, s.pages_sharing), (2, 2), "{s:?}");
    for (m, unique) in [(&a, 1u64 << 40), (&b, 2u64 << 40)] {
        assert_eq!(m.read(0), pattern(x));
        assert_eq!(m.read(1), pattern(unique));
        assert_eq!(m.read(2), pattern(y));
    }
}
