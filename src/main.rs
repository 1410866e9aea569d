#![forbid(unsafe_code)]
//! The `nightshift` binary: parse the command line and hand over to the library.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    nightshift::install_crypto_provider();
    nightshift::cli::Cli::parse().run().await
}
