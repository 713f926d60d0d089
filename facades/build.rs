//! Compiles the upstream schemas this crate serves (written field for field in
//! `proto/proto/compat`, see docs/compat/README.md) with the pure-Rust `protox`, as
//! `proto/build.rs` does for prefixlog's own. Clients are generated too: the tests call the
//! facade through the upstream client shape.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = "../proto/proto/compat";
    let files = ["sglang/kv_indexer.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={root}/{f}");
    }
    let fds = protox::compile(files, [root])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
