//! Typed configurations of both binaries, and the one writer of their files: tests build their
//! sidecars' and servers' configurations here instead of writing YAML, so that a file is
//! well-formed by construction and a change of format is made in one place. Names are the
//! files' own (`docs/sidecar.md`, `docs/server.md`);
//! a setting left unset is left out of the file, so that the binary's default applies. Values are
//! not checked here: a test of the binaries' validation builds a configuration they refuse.

mod server;
mod sidecar;
#[cfg(test)]
mod tests;

use std::time::Duration;

use serde::Serialize;
use yaml_serde::{Value, with::singleton_map_recursive};

/// A configuration file of one of the binaries.
pub trait ConfigFile {
    /// The file's text.
    fn yaml(&self) -> String;
}

/// The text of `config`: enums as one-key maps (`per: {header: x-tenant}`), as the binaries read
/// them, not YAML tags; unset settings (`None`) left out.
fn yaml(config: &impl Serialize) -> String {
    let mut tree = singleton_map_recursive::serialize(config, yaml_serde::value::Serializer)
        .expect("a configuration is a YAML tree");
    leave_out_unset(&mut tree);
    yaml_serde::to_string(&tree).expect("a YAML tree is text")
}

fn leave_out_unset(value: &mut Value) {
    match value {
        Value::Mapping(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(leave_out_unset);
        }
        Value::Sequence(items) => items.iter_mut().for_each(leave_out_unset),
        _ => {}
    }
}

/// A duration as the binaries read it: `300ms`, `5m`.
fn span(duration: Duration) -> Option<String> {
    Some(humantime::format_duration(duration).to_string())
}

pub use server::*;
pub use sidecar::*;
