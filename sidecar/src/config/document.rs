//! The configuration file as written: what YAML it takes, before any of it is checked.

use std::{net::SocketAddr, path::PathBuf};

use serde::Deserialize;

use super::OnLimit;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Document {
    pub(super) server: Option<ServerDoc>,
    #[serde(default)]
    pub(super) listeners: Vec<ListenerDoc>,
    #[serde(default)]
    pub(super) upstreams: Vec<UpstreamDoc>,
    #[serde(default)]
    pub(super) resources: Vec<ResourceDoc>,
    #[serde(default)]
    pub(super) rules: Vec<RuleDoc>,
    pub(super) rate_limit_service: Option<RateLimitServiceDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ServerDoc {
    pub(super) addresses: Vec<String>,
    pub(super) tls: Option<ServerTlsDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ServerTlsDoc {
    pub(super) ca: Option<PathBuf>,
    pub(super) cert: Option<PathBuf>,
    pub(super) key: Option<PathBuf>,
    pub(super) server_name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListenerDoc {
    pub(super) name: String,
    pub(super) address: SocketAddr,
    pub(super) upstream: Option<String>,
    pub(super) max_connections: Option<usize>,
    pub(super) max_requests: Option<usize>,
    pub(super) idle_timeout: Option<String>,
    pub(super) header_read_timeout: Option<String>,
    pub(super) send_timeout: Option<String>,
    pub(super) max_header_bytes: Option<usize>,
}

/// Envoy's rate limit service, answered from leases (`docs/envoy.md`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RateLimitServiceDoc {
    pub(super) address: SocketAddr,
    /// envoyproxy/ratelimit's files, one domain each.
    pub(super) files: Vec<PathBuf>,
    pub(super) max_requests: Option<usize>,
    pub(super) max_keys: Option<usize>,
    pub(super) idle_timeout: Option<String>,
    #[serde(default)]
    pub(super) when_unreachable: FallbackDoc,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UpstreamDoc {
    pub(super) name: String,
    pub(super) url: String,
    #[serde(default)]
    pub(super) hosts: Vec<String>,
    pub(super) ca: Option<PathBuf>,
    pub(super) timeout: Option<String>,
    pub(super) body_idle_timeout: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResourceDoc {
    pub(super) id: String,
    #[serde(default)]
    pub(super) kind: KindDoc,
    pub(super) capacity: Option<f64>,
    pub(super) burst: Option<f64>,
    #[serde(default)]
    pub(super) priority: i64,
    #[serde(default)]
    pub(super) when_unreachable: FallbackDoc,
    pub(super) safe_capacity: Option<f64>,
    pub(super) per: Option<PerDoc>,
    pub(super) max_keys: Option<usize>,
    pub(super) idle_timeout: Option<String>,
    pub(super) metrics: Option<MetricsDoc>,
}

/// `method`, `host`, or a map with exactly one of the attributes.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum PerDoc {
    Named(PerNameDoc),
    Attribute(PerAttributeDoc),
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum PerNameDoc {
    Method,
    Host,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PerAttributeDoc {
    pub(super) header: Option<String>,
    pub(super) path_segment: Option<usize>,
    pub(super) query: Option<String>,
    pub(super) grpc: Option<GrpcPartDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum GrpcPartDoc {
    Service,
    Method,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum MetricsDoc {
    PerResource,
    PerKey,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(super) enum KindDoc {
    #[default]
    Rate,
    Concurrency,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(super) enum FallbackDoc {
    #[default]
    Safe,
    Optimistic,
    Pessimistic,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RuleDoc {
    pub(super) name: Option<String>,
    #[serde(default, rename = "match")]
    pub(super) matcher: MatchDoc,
    pub(super) resource: String,
    #[serde(default)]
    pub(super) also: Vec<String>,
    #[serde(default)]
    pub(super) cost: CostDoc,
    pub(super) max_cost: Option<f64>,
    pub(super) on_limit: Option<OnLimit>,
    pub(super) max_wait: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct MatchDoc {
    pub(super) listener: Option<String>,
    #[serde(default)]
    pub(super) methods: Vec<String>,
    pub(super) path: Option<PathDoc>,
    pub(super) host: Option<String>,
    pub(super) grpc: Option<GrpcDoc>,
    #[serde(default)]
    pub(super) headers: Vec<HeaderDoc>,
}

/// Exactly one of the three.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PathDoc {
    pub(super) exact: Option<String>,
    pub(super) prefix: Option<String>,
    pub(super) glob: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GrpcDoc {
    pub(super) service: Option<String>,
    pub(super) method: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HeaderDoc {
    pub(super) name: String,
    pub(super) value: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum CostDoc {
    Constant(f64),
    Header {
        header: String,
        #[serde(default = "one")]
        default: f64,
    },
    Bytes(BytesDoc),
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum BytesDoc {
    RequestBytes,
    ResponseBytes,
}

impl Default for CostDoc {
    fn default() -> Self {
        CostDoc::Constant(1.0)
    }
}

pub(super) fn one() -> f64 {
    1.0
}
