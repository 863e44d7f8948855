//! Generates the CSI bindings from `proto/csi.proto` with protox (no protoc needed).
//!
//! Every message that carries a `secrets` or `mount_flags` field loses its derived `Debug`; the
//! crate implements a redacting one by hand, and the generated `redacted_debug_check.rs` fails
//! the build if any of them lacks it.

use std::{env, fmt::Write as _, fs, path::PathBuf};

use prost_types::{DescriptorProto, FileDescriptorSet};

const SENSITIVE_FIELDS: &[&str] = &["secrets", "mount_flags"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    let fds: FileDescriptorSet = protox::compile(["csi.proto"], ["proto"])?;

    let mut sensitive = Vec::new();
    for file in fds.file.iter().filter(|f| f.package() == "csi.v1") {
        for msg in &file.message_type {
            collect_sensitive(&format!(".{}", file.package()), msg, &mut sensitive);
        }
    }

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .skip_debug(sensitive.iter().map(String::as_str))
        .compile_fds(fds)?;

    let mut check =
        String::from("const _: fn() = || {\n    fn has_debug<T: ::std::fmt::Debug>() {}\n");
    for path in &sensitive {
        let rust = path.trim_start_matches(".csi.v1.");
        let rust = rust_path(rust);
        writeln!(check, "    has_debug::<crate::pb::{rust}>();")?;
    }
    check.push_str("};\n");
    let out = PathBuf::from(env::var("OUT_DIR")?).join("redacted_debug_check.rs");
    fs::write(out, check)?;
    Ok(())
}

/// Adds `prefix.msg` (and nested messages) to `out` when it has a sensitive field.
fn collect_sensitive(prefix: &str, msg: &DescriptorProto, out: &mut Vec<String>) {
    let path = format!("{prefix}.{}", msg.name());
    if msg
        .field
        .iter()
        .any(|f| SENSITIVE_FIELDS.contains(&f.name()))
    {
        out.push(path.clone());
    }
    for nested in &msg.nested_type {
        if !nested.options.as_ref().is_some_and(|o| o.map_entry()) {
            collect_sensitive(&path, nested, out);
        }
    }
}

/// `VolumeCapability.MountVolume` → `volume_capability::MountVolume`.
fn rust_path(proto: &str) -> String {
    let parts: Vec<&str> = proto.split('.').collect();
    let (last, parents) = parts.split_last().expect("non-empty message path");
    let mut s = String::new();
    for p in parents {
        s.push_str(&snake(p));
        s.push_str("::");
    }
    s.push_str(last);
    s
}

fn snake(camel: &str) -> String {
    let mut s = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                s.push('_');
            }
            s.push(c.to_ascii_lowercase());
        } else {
            s.push(c);
        }
    }
    s
}
