//! Generates the gRPC messages and service of `proto/cluster.proto` (needs `protoc`).
//! `bytes` fields become `prost::bytes::Bytes`, so a decoded message shares the
//! receive buffer instead of copying its packed fingerprints.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/cluster.proto");
    tonic_prost_build::configure()
        .bytes(".")
        .compile_protos(&["proto/cluster.proto"], &["proto"])?;
    Ok(())
}
