//! Compiles `datamodels/health_event.proto` with protox (a pure-Rust protobuf compiler:
//! these machines have no system `protoc`) and feeds the descriptors to tonic's codegen.
//! protox ships the `google/protobuf/*` well-known types itself.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "datamodels/health_event.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
