use rank::bt::*;
#[test]
fn scratch() {
    let d = |a,b| Comparison{a,b,outcome:Outcome::AWins};
    let mut data = vec![d(1, 0)];
    data.extend(std::iter::repeat_n(d(0, 1), 10_000));
    for opts in [FitOptions::default(), FitOptions { prior: Prior::L2(0.5), ..Default::default() }, FitOptions { prior: Prior::None, ..Default::default() }] {
        let f = fit(2, &data, &opts).unwrap();
        eprintln!("{:?} {} {} {:?}", opts.prior, f.iterations, f.converged, f.ratings.iter().map(|r| r.score).collect::<Vec<_>>());
    }
}
