//! Regression (#23): a damaged length field made the scanner allocate the
//! rest of the segment (whatever the field claimed, up to what remained).
//! The keyed header check now holds before any length is trusted, so no
//! allocation follows a damaged claim. This test binary counts the largest
//! single allocation while a read-only open scans a segment whose first
//! record claims 6 MiB of body over 8 MiB of small records.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ledger::{Ledger, NewEvent};

struct Tracking;

static ON: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ON.load(Ordering::Relaxed) {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ON.load(Ordering::Relaxed) {
            LARGEST.fetch_max(new_size, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static A: Tracking = Tracking;

/// The largest single allocation of a read-only open of `dir`, and how many
/// damaged ranges it found.
fn scan(dir: &std::path::Path) -> (usize, usize) {
    LARGEST.store(0, Ordering::SeqCst);
    ON.store(true, Ordering::SeqCst);
    let l = Ledger::open_read_only(dir).unwrap();
    ON.store(false, Ordering::SeqCst);
    (LARGEST.load(Ordering::SeqCst), l.recovery().damage.len())
}

#[test]
fn a_damaged_length_field_allocates_nothing_it_claims() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("l");
    let l = Ledger::init(&dir).unwrap();
    let first = l.put_blob(b"the record whose length is damaged").unwrap();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut head = None;
    for i in 0..2048u32 {
        let bytes: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut b = l.batch();
        let blob = b.put_blob(&bytes).unwrap();
        head = Some(
            b.append(
                "s",
                head,
                NewEvent::new("k", 1, i.to_le_bytes().to_vec()).with_refs(vec![blob]),
            )
            .unwrap(),
        );
        b.commit().unwrap();
    }
    let loc = l.locate(&first).unwrap().unwrap();
    drop(l);
    fs::remove_dir_all(dir.join("index")).unwrap();
    let (clean, damage) = scan(&dir);
    assert_eq!(damage, 0);
    // Body length := 6 MiB, less than what remains of the segment.
    let f = OpenOptions::new()
        .write(true)
        .open(dir.join("segments/00000001.seg"))
        .unwrap();
    f.write_all_at(&(6u32 << 20).to_le_bytes(), loc.offset + 8)
        .unwrap();
    drop(f);
    let (damaged, damage) = scan(&dir);
    assert_eq!(damage, 1, "the damaged record is reported");
    assert!(
        damaged < 3 << 20 && damaged <= clean + (1 << 20),
        "largest allocation {damaged} bytes (undamaged scan: {clean})"
    );
}
