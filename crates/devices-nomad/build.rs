//! Generates the bindings of Nomad's plugin protocol (Base, Device, shared structs and HCL
//! specs), go-plugin's controller and gRPC's health check from `proto/` with protox (no
//! protoc needed). Clients and servers both: the example plugin serves them.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const FILES: &[&str] = &[
        "nomad/structs.proto",
        "nomad/hclspec.proto",
        "nomad/base.proto",
        "nomad/device.proto",
        "goplugin/controller.proto",
        "grpc/health.proto",
    ];
    for file in FILES {
        println!("cargo:rerun-if-changed=proto/{file}");
    }
    let fds = protox::compile(FILES, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
