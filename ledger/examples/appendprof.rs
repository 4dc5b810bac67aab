fn main() {
    for (name, off) in [("default", ledger::Unprotected::default()), ("no mark", ledger::Unprotected { no_reader_watermark: true, ..Default::default() })] {
        let dir = tempfile::tempdir().unwrap();
        let l = ledger::Ledger::init_with(&dir.path().join("l"), ledger::Options { unprotected: off, ..Default::default() }).unwrap();
        let mut head = None;
        let t = std::time::Instant::now();
        for i in 0..300u32 {
            head = Some(l.append("s", head, ledger::NewEvent::new("k", 1, vec![i as u8; 500])).unwrap());
        }
        println!("{name}: {:.0} ev/s", 300.0 / t.elapsed().as_secs_f64());
    }
}
