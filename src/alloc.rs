//! The allocator `mass` runs with: jemalloc (`tikv-jemallocator`), in place
//! of glibc's malloc, which was about 15% of all samples with 1,024
//! concurrent rollouts (`malloc`, `free` and `malloc_consolidate` in a
//! `perf` profile of `benches/orchestration.rs`). Measured there, back to
//! back on 2 cores, the allocator alone (jemalloc's default options): CPU
//! per recorded call 0.42 -> 0.34 ms at 256 rollouts, 0.34 -> 0.28 ms at
//! 1,024; the transport-only baseline 0.15 -> 0.10 ms. The benches that
//! run the engine or the proxy in their own process include this file, so
//! they measure the allocator `mass` uses.
//!
//! `tcache_max:4096` keeps only small size classes in the per-thread
//! caches: the engine's blocking-pool threads each hold a cache, and with
//! jemalloc's default (32 KiB) the peak at 1,024 rollouts was 643 MiB
//! against glibc's 507; with this option 461 against glibc's 537 in
//! another pair, at the CPU of the default options. The arena count is
//! jemalloc's default (four per core), so the allocator still scales with
//! the machine.

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc reads its options from this symbol at its first allocation
/// (before `main`, and in the sandbox launcher too); a C string.
#[export_name = "_rjem_malloc_conf"]
pub static MALLOC_CONF: &[u8] = b"tcache_max:4096\0";
