//! A configured upstream and its connections: a request goes out over HTTP/1.1 or HTTP/2 as the
//! application spoke it (gRPC needs HTTP/2 end to end), on pooled keep-alive connections, with
//! TLS for `https://` upstreams, bodies and trailers streamed both ways; what fails is the
//! refusal to answer with.

use std::sync::Arc;

use http::{
    HeaderMap, HeaderName, HeaderValue, Request, Response, Uri, Version,
    header::{CONNECTION, HOST, TE, TRANSFER_ENCODING, UPGRADE},
    uri::{Authority, PathAndQuery, Scheme},
};
use http_body_util::Either;
use sluice_http::{
    body::{BoxError, Guarded, IdleTimeout, RequestBodyFailed},
    h1::Http1Pool,
    pool::{self, Http2Pool},
};
use sluice_runtime::telemetry::with_causes;

use crate::{
    body::{RequestBody, UpstreamBody},
    config,
    enforce::CutOff,
    refusal::Refusal,
};

/// One configured upstream and its connection pools.
pub struct UpstreamClient {
    config: config::Upstream,
    /// The `ca` bundle's content it trusts, to tell when the file changed.
    ca: Option<Vec<u8>>,
    scheme: Scheme,
    authority: Authority,
    host: HeaderValue,
    http1: Arc<Http1Pool>,
    http2: Http2Pool<RequestBody>,
}

impl UpstreamClient {
    pub fn new(config: &config::Upstream) -> Result<UpstreamClient, String> {
        let ca = match &config.ca {
            Some(path) => Some(std::fs::read(path).map_err(|e| format!("ca: cannot read {}: {e}", path.display()))?),
            None => None,
        };
        UpstreamClient::trusting(config, ca)
    }

    /// A client for `config` that trusts `ca`, the content of its `ca` file.
    pub fn trusting(config: &config::Upstream, ca: Option<Vec<u8>>) -> Result<UpstreamClient, String> {
        let scheme = config.url.scheme().cloned().unwrap_or(Scheme::HTTP);
        let authority = config.url.authority().cloned().ok_or("the url has no authority")?;
        let host = HeaderValue::from_str(authority.as_str()).map_err(|e| e.to_string())?;
        let (http1, http2) = pool::pools(&config.url, &tls_config(config.ca.as_deref().zip(ca.as_deref()))?)?;
        Ok(UpstreamClient { config: config.clone(), ca, scheme, authority, host, http1, http2 })
    }

    /// Its `ca` file and the bundle it trusts from it.
    pub fn ca(&self) -> Option<(&std::path::Path, &[u8])> {
        self.config.ca.as_deref().zip(self.ca.as_deref())
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn config(&self) -> &config::Upstream {
        &self.config
    }

    /// Sends `req` upstream; a failure is the refusal to answer with: the upstream's (502,
    /// 504), the application's request body's (400), or a limit's when a paced body was cut off.
    pub async fn forward(&self, req: Request<RequestBody>) -> Result<Response<UpstreamBody>, Refusal> {
        let cut_off = req.body().cut_off();
        let sent = self.send(req);
        let answer = match self.config.timeout {
            Some(limit) => tokio::time::timeout(limit, sent)
                .await
                .map_err(|_| Refusal::GatewayTimeout { upstream: self.name().to_owned() })?,
            None => sent.await,
        };
        match answer {
            Ok(mut response) => {
                strip_hop_by_hop(response.headers_mut());
                Ok(response)
            }
            Err(_) if let Some(limited) = cut_off.as_ref().and_then(CutOff::limited) => {
                Err(Refusal::Limited(limited.clone()))
            }
            Err(e) if e.is::<RequestBodyFailed>() => Err(Refusal::Malformed(e.to_string())),
            Err(e) => {
                Err(Refusal::BadGateway { upstream: self.name().to_owned(), error: with_causes(&e.to_string(), &*e) })
            }
        }
    }

    /// HTTP/2 goes out as HTTP/2 (gRPC needs it end to end), everything else as HTTP/1.1.
    async fn send(&self, req: Request<RequestBody>) -> Result<Response<UpstreamBody>, BoxError> {
        let (mut parts, body) = req.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let path = parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
        if parts.version == Version::HTTP_2 {
            // The URI's authority becomes `:authority`; a Host header would contradict it.
            parts.headers.remove(HOST);
            parts.uri = Uri::builder()
                .scheme(self.scheme.clone())
                .authority(self.authority.clone())
                .path_and_query(path)
                .build()?;
            let (response, stream) = self.http2.send(Request::from_parts(parts, body)).await?;
            let idle = self.config.body_idle_timeout;
            Ok(response.map(|body| IdleTimeout::new(Either::Right(Guarded::new(body, stream)), idle)))
        } else {
            // HTTP/1.1 sends the target in origin form, the authority in Host.
            parts.version = Version::HTTP_11;
            // In place: an insert makes room for one more first, growing a map that is full.
            match parts.headers.get_mut(HOST) {
                Some(host) => *host = self.host.clone(),
                None => drop(parts.headers.insert(HOST, self.host.clone())),
            }
            parts.uri = Uri::from(path);
            let response = self.http1.send(Request::from_parts(parts, body)).await?;
            Ok(response.map(|body| IdleTimeout::new(Either::Left(body), self.config.body_idle_timeout)))
        }
    }
}

/// Headers that describe one connection rather than the message (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 5] = [
    CONNECTION,
    TRANSFER_ENCODING,
    UPGRADE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// Removes the hop-by-hop headers and those `Connection` names, keeping `te: trailers`, which
/// gRPC needs end to end.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none: one pass over the names settles that without a lookup.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name) || name == TE) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(&HOP_BY_HOP) {
        headers.remove(name);
    }
    if headers.get(TE).is_some_and(|v| v != "trailers") {
        headers.remove(TE);
    }
}

/// Trust for `https://` upstreams (and the webhook's calls to the API server): the configured CA
/// bundle, else the system's roots, else the Mozilla roots compiled in (for images without a CA
/// store).
pub(crate) fn tls_config(ca: Option<(&std::path::Path, &[u8])>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some((path, pem)) => {
            for cert in sluice_client::tls::certificates(path, pem).map_err(|e| format!("ca: {e}"))? {
                roots.add(cert).map_err(|e| format!("ca {}: {e}", path.display()))?;
            }
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            if roots.is_empty() {
                roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            }
        }
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_stay_on_their_connection() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-session"),
            ("keep-alive", "timeout=5"),
            ("x-session", "1"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("x-kept", "yes"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["te", "x-kept"]);

        headers.insert(TE, HeaderValue::from_static("gzip"));
        strip_hop_by_hop(&mut headers);
        assert!(!headers.contains_key(TE), "te other than trailers is hop-by-hop");
    }
}
