//! Profiling aid: group commits of 100 events (~1 KiB payloads), as in the
//! ledger bench's group-commit row. `cargo run --release --example groupprof -p ledger`.
fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let l = ledger::Ledger::init(&dir.path().join("l")).expect("init");
    let mut head = None;
    let t = std::time::Instant::now();
    let mut i = 0u32;
    while i < n {
        let mut b = l.batch();
        for _ in 0..100 {
            let payload: Vec<u8> = (0..1056u32)
                .map(|j| (j.wrapping_mul(31) ^ i) as u8 % 64 + 32)
                .collect();
            head = Some(
                b.append("s", head, ledger::NewEvent::new("bench.append", 1, payload))
                    .expect("append"),
            );
            i += 1;
        }
        b.commit().expect("commit");
    }
    println!("{:.0} ev/s", n as f64 / t.elapsed().as_secs_f64());
}
