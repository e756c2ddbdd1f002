#[test]
fn scratch_roundtrip() {
    let mut x: u64 = 12345;
    let mut bad = 0;
    let mut n = 0;
    for i in 0..200000u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let a = (x >> 40) as i64 % 200 - 100;
        let b = (i % 7 + 1) as f64;
        let f = a as f64 / 4.0 / b * if i % 3 == 0 { 1.0 / 3.0 } else { 1.0 };
        let s = serde_json::Value::from(f).to_string();
        let back: serde_json::Value = serde_json::from_str(&s).unwrap();
        n += 1;
        if back.as_f64().unwrap().to_bits() != f.to_bits() {
            bad += 1;
            if bad < 5 {
                eprintln!("{f:?} {s}");
            }
        }
    }
    eprintln!("{bad}/{n}");
}
