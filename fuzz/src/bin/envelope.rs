#[path = "../../targets.rs"]
#[allow(dead_code)]
mod targets;

fn main() {
    afl::fuzz!(|data: &[u8]| targets::envelope(data));
}
