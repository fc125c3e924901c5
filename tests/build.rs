//! Compiles the test upstream's `echo.proto` with protox (pure Rust), so building needs no system
//! `protoc`. (Envoy's RLS and RLQS protocols are `sluice-proto`'s.)

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/echo.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
