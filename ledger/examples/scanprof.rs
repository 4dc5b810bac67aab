//! Profiling aid: builds a ledger of N events in DIR (unless it exists) and
//! times a full `verify`: `cargo run --release -p ledger --example scanprof DIR N`.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1).map(std::path::PathBuf::from) else {
        eprintln!("usage: scanprof DIR [N]");
        std::process::exit(2);
    };
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    if !dir.join("FORMAT").exists() {
        let l = ledger::Ledger::init(&dir).expect("init");
        let mut head = None;
        let mut b = l.batch();
        for i in 0..n {
            let payload: Vec<u8> = (0..(64 + i % 1900))
                .map(|j| b"abcdefghij klmnop qrstu vwxyz 0123456789"[(i * 7 + j) % 40])
                .collect();
            head = Some(
                b.append("s", head, ledger::NewEvent::new("k", 1, payload))
                    .expect("append"),
            );
            if b.len() >= 1000 {
                b.commit().expect("commit");
                b = l.batch();
            }
        }
        b.commit().expect("commit");
    }
    let l = ledger::Ledger::open_with(&dir, ledger::Options::default()).expect("open");
    eprintln!("after open: {}", hwm());
    let t = std::time::Instant::now();
    let r = l.verify(&|_| Ok(())).expect("verify");
    println!(
        "{} events in {:?}: {:.0} ev/s",
        r.events,
        t.elapsed(),
        r.events as f64 / t.elapsed().as_secs_f64()
    );
}

fn hwm() -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("VmHWM") || l.starts_with("VmRSS"))
        .collect::<Vec<_>>()
        .join(" ")
}
