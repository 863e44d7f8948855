//! Generates the plugin registration bindings from `proto/pluginregistration.proto` with protox
//! (no protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/pluginregistration.proto");
    let fds = protox::compile(["pluginregistration.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
