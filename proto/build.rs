//! Compiles `doorman.proto` and the parts of Envoy's rate limit service (RLS) and rate limit quota
//! service (RLQS) Sluice serves with protox (pure Rust), so building needs no system `protoc`.

use std::{env, path::PathBuf};

const ENVOY_RLS: &str = "envoy/service/ratelimit/v3/rls.proto";
const ENVOY_RLQS: &str = "envoy/service/rate_limit_quota/v3/rlqs.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=doorman.proto");
    println!("cargo:rerun-if-changed=envoy");
    let out = PathBuf::from(env::var("OUT_DIR")?);
    let doorman = protox::compile(["doorman.proto"], ["."])?;
    // The reflection service serves this descriptor set.
    std::fs::write(out.join("doorman_descriptor.bin"), prost::Message::encode_to_vec(&doorman))?;
    // Boxed: most requests carry none, and a request of many resources holds one per resource.
    tonic_prost_build::configure()
        .boxed(".doorman.ResourceRequest.signals")
        .boxed(".doorman.ServerCapacityResourceRequest.signals")
        .compile_fds(doorman)?;
    // One set, so that the package both share (`envoy.type.v3`) is generated once, whole.
    let envoy = protox::compile([ENVOY_RLS, ENVOY_RLQS], ["."])?;
    std::fs::write(out.join("envoy_rls_descriptor.bin"), prost::Message::encode_to_vec(&envoy))?;
    tonic_prost_build::configure().compile_fds(envoy)?;
    Ok(())
}
