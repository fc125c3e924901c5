//! Compiles the test upstream's `echo.proto` with protox (pure Rust), so building needs no system
//! `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/echo.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
