//! The generated bindings: Nomad's plugin protocol (packages `hashicorp.nomad.plugins.…`),
//! go-plugin's controller (package `plugin`) and gRPC's health check (`grpc.health.v1`), each
//! with its client and server. The modules nest as the packages do (the generated code refers
//! across them by relative paths); the short aliases below are what the rest of the crate uses.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// Package `hashicorp…`, nested as the generated code expects.
pub mod hashicorp {
    /// `hashicorp.nomad`.
    pub mod nomad {
        /// `hashicorp.nomad.plugins`.
        pub mod plugins {
            /// `hashicorp.nomad.plugins.base`.
            pub mod base {
                /// `hashicorp.nomad.plugins.base.proto`: the BasePlugin service.
                pub mod proto {
                    tonic::include_proto!("hashicorp.nomad.plugins.base.proto");
                }
            }
            /// `hashicorp.nomad.plugins.device`: the DevicePlugin service.
            pub mod device {
                tonic::include_proto!("hashicorp.nomad.plugins.device");
            }
            /// `hashicorp.nomad.plugins.shared`.
            pub mod shared {
                /// `hashicorp.nomad.plugins.shared.structs`: attributes and statistics.
                pub mod structs {
                    tonic::include_proto!("hashicorp.nomad.plugins.shared.structs");
                }
                /// `hashicorp.nomad.plugins.shared.hclspec`: configuration schemas.
                pub mod hclspec {
                    tonic::include_proto!("hashicorp.nomad.plugins.shared.hclspec");
                }
            }
        }
    }
}

/// go-plugin's package `plugin`: the GRPCController service (`Shutdown`).
pub mod controller {
    tonic::include_proto!("plugin");
}

/// `grpc.health.v1`: the health check go-plugin servers answer for service `"plugin"`.
pub mod health {
    tonic::include_proto!("grpc.health.v1");
}

pub use hashicorp::nomad::plugins::{
    base::proto as base,
    device,
    shared::{hclspec, structs},
};
