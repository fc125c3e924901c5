//! Native sidecar or classic container, by what the cluster runs. A native sidecar (an init
//! container with `restartPolicy: Always`) needs the `SidecarContainers` feature: beta and on by
//! default from Kubernetes 1.29, GA in 1.33. An older API server drops the unknown field from the
//! patched pod, and then refuses the pod outright (an init container may not have probes): a
//! native patch sent to it blocks every pod of an injected namespace. So `auto`, the default,
//! injects natively only into a cluster whose API server says it is 1.29 or later, and classic
//! otherwise, or when it cannot tell.
//!
//! The webhook asks the API server's `/version` (readable by any client: the
//! `system:public-info-viewer` role) at start and every
//! [`VERSION_REFRESH`](crate::defaults::VERSION_REFRESH) after.

use std::{path::PathBuf, sync::Arc};

use clap::ValueEnum;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use serde::Deserialize;
use tokio::{net::TcpStream, time::timeout};
use tokio_rustls::TlsConnector;

use crate::{
    defaults::{KUBE_API_TIMEOUT, MAX_VERSION_BYTES},
    upstream,
};

/// The first minor version of 1.x whose API servers run native sidecars by default.
const NATIVE_FROM_MINOR: u32 = 29;

/// Where a pod in the cluster finds the API server and its credentials.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// `--native`: how the sidecar is injected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Native {
    /// Natively where the cluster runs native sidecars (1.29 and later), else classic.
    #[default]
    Auto,
    /// Always a native sidecar (the cluster must be 1.29 or later).
    True,
    /// Always a classic container, started before the application's.
    False,
}

/// How one pod gets its sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Native,
    Classic,
}

/// An API server's `major.minor`, from its `/version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubeVersion {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[derive(Deserialize)]
struct VersionDoc {
    major: String,
    minor: String,
}

impl KubeVersion {
    /// Reads `/version`'s answer; managed clusters add a suffix to the minor (`"28+"`).
    pub fn parse(json: &[u8]) -> Result<KubeVersion, String> {
        let doc: VersionDoc = serde_json::from_slice(json).map_err(|e| format!("/version: {e}"))?;
        let number = |field: &str, text: &str| {
            let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().map_err(|_| format!("/version: {field} {text:?} is not a number"))
        };
        Ok(KubeVersion { major: number("major", &doc.major)?, minor: number("minor", &doc.minor)? })
    }
}

impl Native {
    /// The mode for a cluster of `version` (`None`: unknown, so classic).
    pub fn mode(self, version: Option<KubeVersion>) -> Mode {
        match (self, version) {
            (Native::True, _) => Mode::Native,
            (Native::False, _) | (Native::Auto, None) => Mode::Classic,
            (Native::Auto, Some(v)) if v.major > 1 || (v.major == 1 && v.minor >= NATIVE_FROM_MINOR) => Mode::Native,
            (Native::Auto, Some(_)) => Mode::Classic,
        }
    }
}

/// How the webhook reaches the API server: in a pod, from its environment and ServiceAccount.
#[derive(Clone, Debug, clap::Args)]
pub struct ApiAccess {
    /// The API server's URL, for its version (`--native auto`); default: the in-cluster
    /// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
    #[arg(long)]
    pub kube_api: Option<String>,

    /// CA of the API server's certificate; default: the ServiceAccount's ca.crt.
    #[arg(long)]
    pub kube_ca: Option<PathBuf>,

    /// Bearer token toward the API server; default: the ServiceAccount's token, if mounted
    /// (`/version` needs none).
    #[arg(long)]
    pub kube_token: Option<PathBuf>,
}

impl ApiAccess {
    /// Asks the API server its version.
    pub async fn version(&self) -> Result<KubeVersion, String> {
        let url = match &self.kube_api {
            Some(url) => url.clone(),
            None => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST")
                    .map_err(|_| "no --kube-api and no KUBERNETES_SERVICE_HOST: not in a cluster".to_owned())?;
                let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
                // An IPv6 service address needs brackets in a URL.
                if host.contains(':') { format!("https://[{host}]:{port}") } else { format!("https://{host}:{port}") }
            }
        };
        let uri: hyper::Uri = url.parse().map_err(|e| format!("--kube-api {url:?}: {e}"))?;
        let (Some(host), Some("https")) = (uri.host(), uri.scheme_str()) else {
            return Err(format!("--kube-api {url:?}: must be https://host[:port]"));
        };
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let account = PathBuf::from(SERVICE_ACCOUNT_DIR);
        let ca_path = self.kube_ca.clone().unwrap_or_else(|| account.join("ca.crt"));
        let ca = std::fs::read(&ca_path).map_err(|e| format!("{}: {e}", ca_path.display()))?;
        let tls = upstream::tls_config(Some((&ca_path, &ca)))?;
        let token = match &self.kube_token {
            Some(path) => Some(std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?),
            None => std::fs::read_to_string(account.join("token")).ok(),
        };
        timeout(KUBE_API_TIMEOUT, get_version(&host, port, tls, token.as_deref().map(str::trim)))
            .await
            .map_err(|_| format!("{url}/version: no answer within {KUBE_API_TIMEOUT:?}"))?
            .map_err(|e| format!("{url}/version: {e}"))
    }
}

async fn get_version(host: &str, port: u16, tls: ClientConfig, token: Option<&str>) -> Result<KubeVersion, String> {
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| format!("{host}: {e}"))?;
    let stream = TcpStream::connect((host, port)).await.map_err(|e| e.to_string())?;
    let tls = TlsConnector::from(Arc::new(tls)).connect(name, stream).await.map_err(|e| format!("TLS: {e}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let mut request = hyper::Request::get("/version").header("host", host).header("accept", "application/json");
    if let Some(token) = token.filter(|t| !t.is_empty()) {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("HTTP {}", response.status()));
    }
    let body = http_body_util::Limited::new(response.into_body(), MAX_VERSION_BYTES);
    let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    KubeVersion::parse(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(minor: &str) -> Option<KubeVersion> {
        Some(
            KubeVersion::parse(format!(r#"{{"major":"1","minor":"{minor}","gitVersion":"v1.x"}}"#).as_bytes()).unwrap(),
        )
    }

    #[test]
    fn auto_is_native_from_1_29_and_classic_before_or_when_unknown() {
        // 1.20 knows no native sidecars; 1.28 has the feature gate, off by default.
        assert_eq!(Native::Auto.mode(version("20")), Mode::Classic);
        assert_eq!(Native::Auto.mode(version("28")), Mode::Classic);
        assert_eq!(Native::Auto.mode(version("28+")), Mode::Classic);
        // Beta and on by default in 1.29; GA in 1.33.
        assert_eq!(Native::Auto.mode(version("29")), Mode::Native);
        assert_eq!(Native::Auto.mode(version("33")), Mode::Native);
        assert_eq!(Native::Auto.mode(version("33+")), Mode::Native);
        assert_eq!(Native::Auto.mode(None), Mode::Classic);
        // Told, it does as told.
        assert_eq!(Native::True.mode(version("20")), Mode::Native);
        assert_eq!(Native::False.mode(version("33")), Mode::Classic);
    }

    #[test]
    fn a_version_that_is_not_one_is_an_error() {
        assert!(KubeVersion::parse(br#"{"major":"1","minor":""}"#).is_err());
        assert!(KubeVersion::parse(b"<html>").is_err());
        assert_eq!(KubeVersion::parse(br#"{"major":"1","minor":"31"}"#).unwrap().to_string(), "1.31");
    }
}
