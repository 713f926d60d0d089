fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/records.proto", "proto/query.proto", "proto/peer.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    // The encoded descriptor set serves gRPC reflection (so grpcurl works without .proto files).
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("prefixlog_descriptor.bin"), protox::prost::Message::encode_to_vec(&fds))?;
    // Same wire format as tonic_prost::ProstCodec, cheaper per field (src/codec.rs says why).
    tonic_prost_build::configure().codec_path("crate::codec::SliceCodec").compile_fds(fds)?;
    Ok(())
}
