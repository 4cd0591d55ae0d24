#[test]
fn bench() {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/m96.cact");
    let f = exporter::cact::CactFile::read(p).unwrap();
    let t = std::time::Instant::now();
    let mut n = 0;
    for _ in 0..10 { let w = f.weights().unwrap(); n += w.embedding.data.len() + w.layers.iter().map(|l| l.q_proj.data.len()*2+l.k_proj.data.len()*2+l.out_proj.data.len()+l.gate_proj.data.len()).sum::<usize>(); }
    println!("{:?} per element approx {:?}", t.elapsed(), t.elapsed() / n as u32);
}
