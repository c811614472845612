//! A run's token: made fresh for each run, and compared in constant time.

/// A fresh token: 128 random bits, as hex.
pub fn new() -> String {
    use rand::Rng;
    let bytes: [u8; 16] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `a == b`, in a time that depends only on their lengths (how long a
/// refusal takes says nothing of how much of a guess was right).
pub fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| std::hint::black_box(acc | (x ^ y)));
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_compared_whole_and_fresh_each_time() {
        assert!(same(b"abcd", b"abcd"));
        assert!(!same(b"abcd", b"abce"));
        assert!(!same(b"abc", b"abcd"));
        assert_eq!(new().len(), 32);
        assert_ne!(new(), new());
    }
}
