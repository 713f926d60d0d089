//! Compiles the upstream schemas this crate serves (written field for field in
//! `proto/proto/compat`, see docs/compat/README.md) with the pure-Rust `protox`, as
//! `proto/build.rs` does for prefixlog's own. Clients are generated too: the tests call the
//! facade through the upstream client shape.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = "../proto/proto/compat";
    let files = [
        "sglang/kv_indexer.proto",
        "smg/radix_index.proto",
        "envoy/service/ext_proc/v3/external_processor.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={root}/{f}");
    }
    let fds = protox::compile(files, [root])?;
    // The encoded descriptor set serves gRPC reflection on the query port (grpcurl without
    // .proto files), as prefixlog's own does.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("compat_descriptor.bin"), protox::prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
