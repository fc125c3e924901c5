//! Compiles the test upstream's `echo.proto` and the subset of Envoy's rate limit quota service
//! (RLQS) under `proto/rlqs` with protox (pure Rust), so building needs no system `protoc`.

const RLQS: &str = "envoy/service/rate_limit_quota/v3/rlqs.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/echo.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-changed=proto/rlqs");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    let rlqs = protox::compile([RLQS], ["proto/rlqs"])?;
    tonic_prost_build::configure().build_client(false).compile_fds(rlqs)?;
    Ok(())
}
