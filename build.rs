//! Compiles KEDA's external scaler protocol with a pure-Rust protobuf compiler (protox), so a
//! fresh machine needs nothing beyond cargo: no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/externalscaler.proto");
    let fds = protox::compile(["externalscaler.proto"], ["proto"])?;
    tonic_prost_build::configure()
        // Ordered: the scaler compares each request's table with the one it admitted, and an
        // ordered map decodes without hashing and compares in one pass.
        .btree_map(".externalscaler.ScaledObjectRef.scalerMetadata")
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
