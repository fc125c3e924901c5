//! The server's way to etcd, shared by the election and the configuration source: the endpoints,
//! TLS toward them (`https://`, with a CA and for mTLS a client certificate, the files rotated in
//! place), and etcd's user/password auth, whose token every call carries.
//!
//! Each etcd session (an election session, a configuration watch) connects anew with the TLS files
//! in force and authenticates; a call that etcd refuses for its token (a simple token expires after
//! minutes idle) authenticates again and is sent once more.

use std::{
    fmt,
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use arc_swap::ArcSwap;
use sluice_client::tls::ClientTlsFiles;
use sluice_etcd::etcdserverpb::{
    AuthenticateRequest, RangeRequest, RangeResponse, auth_client::AuthClient, kv_client::KvClient,
};
use sluice_runtime::{reload::rotating, telemetry::with_causes};
use tokio::time::timeout;
use tonic::{
    Code, Request, Status,
    metadata::{Ascii, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Channel, ClientTlsConfig, Endpoint},
};

use crate::defaults::{ETCD_KEEPALIVE_INTERVAL, ETCD_REQUEST_TIMEOUT};

/// How the server reaches etcd.
#[derive(Clone, Debug)]
pub struct Settings {
    /// All `http://` or all `https://`.
    pub endpoints: Vec<String>,
    /// For `https://` endpoints: the CA (the system roots when absent) and the client certificate.
    pub tls: Option<ClientTlsFiles>,
    pub user: Option<Credentials>,
}

/// An etcd user and its password (`--etcd-user name:password`).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub name: String,
    pub password: String,
}

impl Credentials {
    /// `name:password`, as etcdctl's `--user` takes it.
    pub fn parse(text: &str) -> Result<Credentials, String> {
        match text.split_once(':') {
            Some((name, password)) if !name.is_empty() => {
                Ok(Credentials { name: name.to_owned(), password: password.to_owned() })
            }
            _ => Err("expected name:password".into()),
        }
    }
}

/// Never prints the password (the flags are printed in debug output).
impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:<password>", self.name)
    }
}

/// Why an etcd call failed, in one line, and whether etcd could not be reached at all (rather
/// than refusing this server: an untrusted certificate, a wrong password, a missing permission).
#[derive(Debug)]
pub struct Error {
    pub message: String,
    pub unreachable: bool,
    /// etcd's answer, if it gave one.
    pub code: Option<Code>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<Error> for String {
    fn from(error: Error) -> String {
        error.message
    }
}

/// etcd as this server reaches it; connections made from it use the TLS files in force.
pub struct Etcd {
    endpoints: Vec<String>,
    tls: Option<Arc<ArcSwap<ClientTlsConfig>>>,
    /// Whether the connections present a client certificate.
    certificate: bool,
    user: Option<Credentials>,
}

impl Etcd {
    /// Reads and checks the TLS files, then polls them every `poll`. Must be called on a runtime.
    pub fn new(settings: Settings, poll: Duration) -> Result<Arc<Etcd>, String> {
        let certificate = settings.tls.as_ref().is_some_and(|files| files.identity.is_some());
        let tls = settings
            .tls
            .map(|files| rotating("etcd client", files.paths(), poll, move |content| files.client_config(content)))
            .transpose()?;
        Ok(Arc::new(Etcd { endpoints: settings.endpoints, tls, certificate, user: settings.user }))
    }

    /// Whether etcd takes this server: connects, authenticates and reads `key` (without its
    /// value), which every use of etcd needs to be allowed to.
    pub async fn check(&self, key: &str) -> Result<(), Error> {
        self.connect().await?.range(key, true).await.map(drop)
    }

    /// A new connection with the TLS files in force, authenticated when there is a user.
    pub async fn connect(&self) -> Result<Connection, Error> {
        let tls = self.tls.as_ref().map(|t| t.load_full());
        let endpoints = self
            .endpoints
            .iter()
            .map(|url| {
                let endpoint = Endpoint::from_shared(url.clone())
                    .map_err(|e| format!("etcd endpoint {url}: {e}"))?
                    .connect_timeout(ETCD_REQUEST_TIMEOUT)
                    .http2_keep_alive_interval(ETCD_KEEPALIVE_INTERVAL)
                    .keep_alive_timeout(ETCD_REQUEST_TIMEOUT)
                    .keep_alive_while_idle(true)
                    .tcp_nodelay(true);
                match &tls {
                    Some(tls) => endpoint
                        .tls_config(ClientTlsConfig::clone(tls))
                        .map_err(|e| format!("etcd endpoint {url}: {}", with_causes(&e.to_string(), &e))),
                    None => Ok(endpoint),
                }
            })
            .collect::<Result<Vec<_>, String>>()
            .map_err(|message| Error { message, unreachable: false, code: None })?;
        // Balanced over the endpoints and connecting lazily: each request is bounded on its own,
        // and a long call (a campaign, a stream) is not.
        let connection = Connection {
            channel: Channel::balance_list(endpoints.into_iter()),
            token: Token::default(),
            certificate: self.certificate,
            user: self.user.clone(),
        };
        connection.authenticate().await?;
        Ok(connection)
    }
}

/// One connection to etcd and the auth token its calls carry.
#[derive(Clone)]
pub struct Connection {
    channel: Channel,
    token: Token,
    certificate: bool,
    user: Option<Credentials>,
}

/// What the generated clients are made on: the channel, each call carrying the token.
pub type Service = InterceptedService<Channel, Token>;

impl Connection {
    pub fn service(&self) -> Service {
        InterceptedService::new(self.channel.clone(), self.token.clone())
    }

    /// An etcd request that should answer at once, bounded so that an unreachable etcd cannot
    /// stall its caller. One that etcd refuses for its token authenticates again and is sent once
    /// more.
    pub async fn request<T, F, Fut>(&self, what: &str, call: F) -> Result<T, Error>
    where
        F: Fn(Service) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        match bounded(call(self.service())).await {
            Err(Failed::Refused(status)) if self.user.is_some() && stale_token(&status) => {
                tracing::info!(what, "etcd refused the auth token: authenticating again");
                self.authenticate().await?;
                bounded(call(self.service())).await.map_err(|e| e.into_error(what, self.certificate))
            }
            answer => answer.map_err(|e| e.into_error(what, self.certificate)),
        }
    }

    /// Reads `key`: its value, or only whether it is there when `count_only`.
    pub async fn range(&self, key: &str, count_only: bool) -> Result<RangeResponse, Error> {
        let range = RangeRequest { key: key.as_bytes().to_vec(), count_only, ..RangeRequest::default() };
        self.request(&format!("reading {key} from etcd"), |s| {
            let range = range.clone();
            async move { KvClient::new(s).range(range).await }
        })
        .await
    }

    /// Gets a token for the user, if any. An etcd without auth enabled takes the user's calls
    /// without one, so that credentials can be given before auth is turned on.
    async fn authenticate(&self) -> Result<(), Error> {
        let Some(user) = &self.user else { return Ok(()) };
        let request = AuthenticateRequest { name: user.name.clone(), password: user.password.clone() };
        let what = format!("authenticating to etcd as {}", user.name);
        let answer = bounded(AuthClient::new(self.channel.clone()).authenticate(request)).await;
        let token = match answer {
            Ok(answer) => Some(answer.token),
            Err(Failed::Refused(status)) if status.message().contains("authentication is not enabled") => None,
            Err(e) => return Err(e.into_error(&what, self.certificate)),
        };
        let token = token.map(|t| MetadataValue::try_from(t.as_str())).transpose().map_err(|_| Error {
            message: format!("{what}: the token etcd gave is not ASCII"),
            unreachable: false,
            code: None,
        })?;
        *self.token.0.lock().unwrap_or_else(PoisonError::into_inner) = token;
        Ok(())
    }
}

/// The auth token the calls of a connection carry (none without auth).
#[derive(Clone, Default)]
pub struct Token(Arc<Mutex<Option<MetadataValue<Ascii>>>>);

impl Interceptor for Token {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = self.0.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            request.metadata_mut().insert("token", token);
        }
        Ok(request)
    }
}

/// A call that failed: etcd's answer, or none in time.
enum Failed {
    Refused(Status),
    NoAnswer,
}

impl Failed {
    /// The error, one line; `certificate`: the connection presented a client certificate.
    fn into_error(self, what: &str, certificate: bool) -> Error {
        match self {
            Failed::Refused(status) => {
                let why = with_causes(status.message(), &status);
                // Over TLS 1.3 etcd refuses a client certificate after the handshake: depending on
                // timing the client reads the alert, or only that the connection ended.
                let hint = if certificate && matches!(status.code(), Code::Cancelled | Code::Unknown) {
                    " (as when etcd does not take the client certificate, --etcd-cert)"
                } else {
                    ""
                };
                Error {
                    message: format!("{what}: {:?}: {why}{hint}", status.code()),
                    unreachable: unreachable(&status),
                    code: Some(status.code()),
                }
            }
            Failed::NoAnswer => Error {
                message: format!("{what}: no answer within {ETCD_REQUEST_TIMEOUT:?}"),
                unreachable: true,
                code: None,
            },
        }
    }
}

async fn bounded<T>(call: impl Future<Output = Result<tonic::Response<T>, Status>>) -> Result<T, Failed> {
    match timeout(ETCD_REQUEST_TIMEOUT, call).await {
        Ok(Ok(answer)) => Ok(answer.into_inner()),
        Ok(Err(status)) => Err(Failed::Refused(status)),
        Err(_) => Err(Failed::NoAnswer),
    }
}

/// Whether etcd refused a call for want of a valid token, as etcd's own client sees it: the token
/// expired or is unknown (etcd restarted), the auth store changed since it was given, or there
/// was none (auth turned on after the connection authenticated).
fn stale_token(status: &Status) -> bool {
    status.code() == Code::Unauthenticated
        || ["user name is empty", "revision of auth store is old"].iter().any(|m| status.message().contains(m))
}

/// Whether a failed call never reached etcd: refused or unanswered connections, as while etcd is
/// down, unlike a TLS handshake that failed (a certificate not trusted either way).
fn unreachable(status: &Status) -> bool {
    use std::{error::Error as _, io::ErrorKind};
    let mut cause = status.source();
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if io.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) {
                return false;
            }
            if matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::TimedOut
                    | ErrorKind::HostUnreachable
                    | ErrorKind::NetworkUnreachable
                    | ErrorKind::AddrNotAvailable
            ) {
                return true;
            }
        }
        if error.is::<rustls::Error>() {
            return false;
        }
        if error.is::<tonic::TimeoutExpired>() {
            return true;
        }
        cause = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_name_colon_password_and_never_print_the_password() {
        let user = Credentials::parse("sluice:pa:ss").unwrap();
        assert_eq!((user.name.as_str(), user.password.as_str()), ("sluice", "pa:ss"), "the first colon splits");
        assert_eq!(format!("{user:?}"), "sluice:<password>");
        assert_eq!(Credentials::parse("sluice:").unwrap().password, "");
        for bad in ["sluice", ":password", ""] {
            assert!(Credentials::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_refused_connection_is_unreachable_and_a_refusal_by_etcd_is_not() {
        let refused = Status::from_error(Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)));
        assert!(unreachable(&refused));
        assert!(!unreachable(&Status::invalid_argument("etcdserver: authentication failed")));
        let tls = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls::Error::General("bad".into()));
        assert!(!unreachable(&Status::from_error(Box::new(tls))));
    }
}
