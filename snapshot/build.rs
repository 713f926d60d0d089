// Intentionally empty: this build script only exists so that the build-dependency pins in
// Cargo.toml take part in feature unification (see the comment there).
fn main() {}
