//! Generates the device plugin API bindings (package `v1beta1`) from
//! `proto/deviceplugin_v1beta1.proto` with protox, so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/deviceplugin_v1beta1.proto");
    let fds = protox::compile(["deviceplugin_v1beta1.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
