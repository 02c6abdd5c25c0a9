//! Compiles berth's own gRPC services (pull progress) next to CRI.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/pull.proto");
    tonic_prost_build::configure().compile_protos(&["proto/pull.proto"], &["proto"])?;
    Ok(())
}
