#![forbid(unsafe_code)]
//! The `nightshift` binary: parse the command line and hand over to the library.

use clap::Parser;

/// mimalloc instead of glibc malloc: the webhook's reviews and the scaler's calls make many small
/// short-lived allocations, which glibc served at a quarter of the webhook's CPU
/// (docs/performance.md, "Admission webhook").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    nightshift::install_crypto_provider();
    nightshift::cli::Cli::parse().run().await
}
