//! Compiles `doorman.proto` with protox (pure Rust), so building needs no system `protoc`.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "doorman.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["."])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    // The reflection service serves this descriptor set.
    std::fs::write(out.join("doorman_descriptor.bin"), prost::Message::encode_to_vec(&descriptors))?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
