//! The file as envoyproxy/ratelimit reads it: what YAML it takes, before any of it is checked.

use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileDoc {
    pub(crate) domain: String,
    #[serde(default)]
    pub(crate) descriptors: Vec<DescriptorDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DescriptorDoc {
    pub(crate) key: String,
    pub(crate) value: Option<String>,
    pub(crate) rate_limit: Option<RateLimitDoc>,
    #[serde(default)]
    pub(crate) descriptors: Vec<DescriptorDoc>,
    #[serde(default)]
    pub(crate) shadow_mode: bool,
    #[serde(default)]
    pub(crate) detailed_metric: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateLimitDoc {
    pub(crate) unit: Option<String>,
    pub(crate) requests_per_unit: Option<u32>,
    #[serde(default)]
    pub(crate) unlimited: bool,
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) replaces: Vec<ReplacesDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplacesDoc {
    pub(crate) name: String,
}
