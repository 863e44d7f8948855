//! The Consul client against a fake Consul agent speaking the real HTTP API.

mod login;
mod preflight;
mod redaction;
mod support;
