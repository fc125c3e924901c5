//! Compiles `doorman.proto` and the part of Envoy's rate limit service Sluice serves with protox
//! (pure Rust), so building needs no system `protoc`.

use std::{env, path::PathBuf};

const ENVOY_RLS: &str = "envoy/service/ratelimit/v3/rls.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=doorman.proto");
    println!("cargo:rerun-if-changed=envoy");
    let out = PathBuf::from(env::var("OUT_DIR")?);
    let doorman = protox::compile(["doorman.proto"], ["."])?;
    // The reflection service serves this descriptor set.
    std::fs::write(out.join("doorman_descriptor.bin"), prost::Message::encode_to_vec(&doorman))?;
    tonic_prost_build::configure().compile_fds(doorman)?;
    let envoy = protox::compile([ENVOY_RLS], ["."])?;
    std::fs::write(out.join("envoy_rls_descriptor.bin"), prost::Message::encode_to_vec(&envoy))?;
    tonic_prost_build::configure().compile_fds(envoy)?;
    Ok(())
}
