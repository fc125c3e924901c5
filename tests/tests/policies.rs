//! Who may ask for what, against a real `sluice-server` with mTLS and a policy: each caller's
//! identity comes from its certificate (rcgen), and what it may do from the configuration.

use std::path::Path;

use rcgen::{CertificateParams, DnType, KeyPair, SanType};
use sluice_proto::{
    GetCapacityRequest, GetServerCapacityRequest, PriorityBandAggregate, ReleaseCapacityRequest, ResourceRequest,
    ServerCapacityResourceRequest, capacity_client::CapacityClient,
};
use sluice_tests::{
    config::{
        Algorithm, Fallback, Kind, Listener, Match, PathMatch, Policy, Resource, Rule, ServerConfig, ServerTls,
        SidecarConfig, Template, Upstream,
    },
    harness::{Server, Sidecar, http_get},
    upstream::UpstreamProcess,
    wait::{eventually_blocking, lazily},
};
use tonic::{
    Code, Status,
    transport::{Certificate, Channel, ClientTlsConfig, Identity},
};

const TRUST_DOMAIN: &str = "spiffe://sluice.test";

/// A CA, the server's certificate, and client certificates each naming one identity.
struct Pki {
    dir: tempfile::TempDir,
    ca: rcgen::CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Pki {
        let pki = Pki { dir: tempfile::tempdir().unwrap(), ca: sluice_tests::pki::ca() };
        std::fs::write(pki.path("ca.pem"), pki.ca.pem()).unwrap();
        let mut server = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
        server.distinguished_name.push(DnType::CommonName, "server");
        pki.issue("server", server);
        pki
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }

    /// Writes `<name>.pem` and `<name>.key`, and returns them.
    fn issue(&self, name: &str, params: CertificateParams) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        std::fs::write(self.path(&format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{name}.key")), key.serialize_pem()).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A client certificate whose identity is the SPIFFE id `spiffe://sluice.test/<path>`.
    fn spiffe(&self, name: &str, path: &str) -> (String, String) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![SanType::URI(format!("{TRUST_DOMAIN}/{path}").try_into().unwrap())];
        self.issue(name, params)
    }

    /// A client certificate that names its holder only by its common name.
    fn common_name(&self, name: &str) -> (String, String) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        self.issue(name, params)
    }

    fn server(&self, config: &ServerConfig, args: &[&str]) -> Server {
        Server::launch()
            .config(config)
            .args(["--tls-cert", &self.path("server.pem"), "--tls-key", &self.path("server.key")])
            .args(["--tls-client-ca", &self.path("ca.pem")])
            .args(args.iter().copied())
            .start()
    }

    async fn client(&self, server: &Server, (cert, key): &(String, String)) -> CapacityClient<Channel> {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.ca.pem()))
            .domain_name("127.0.0.1")
            .identity(Identity::from_pem(cert, key));
        let channel = Channel::from_shared(format!("https://{}", server.grpc))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        CapacityClient::new(channel)
    }
}

/// One catch-all resource of 100, shared fairly; pods may use ids under their own name and ask
/// for `api/*` only, at most `pod_ids` ids each; the region's server may call GetServerCapacity.
fn config(pod_ids: usize) -> ServerConfig {
    ServerConfig::new()
        .template(Template::catch_all(100.0, Algorithm::fair_share(60, 5).learning(0)))
        .policy(
            Policy::new(&format!("{TRUST_DOMAIN}/ns/*/pod/*"), &["{2}:*"])
                .resources(&["api/*"])
                .max_client_ids(pod_ids),
        )
        .policy(Policy::new(&format!("{TRUST_DOMAIN}/ns/sluice/sa/region"), &["*"]).server_capacity())
}

fn ask(client: &str, resources: &[&str], wants: f64) -> GetCapacityRequest {
    GetCapacityRequest {
        client_id: client.into(),
        resource: resources
            .iter()
            .map(|id| ResourceRequest { resource_id: (*id).into(), priority: 0, has: None, wants, signals: None })
            .collect(),
    }
}

async fn get(client: &mut CapacityClient<Channel>, id: &str, resources: &[&str], wants: f64) -> Result<f64, Status> {
    let answer = client.get_capacity(ask(id, resources, wants)).await?.into_inner();
    Ok(answer.response.iter().map(|r| r.gets.capacity).sum())
}

fn release(client: &str, resource: &str) -> ReleaseCapacityRequest {
    ReleaseCapacityRequest { client_id: client.into(), resource_id: vec![resource.into()] }
}

fn denied(result: Result<impl std::fmt::Debug, Status>, says: &str) -> Status {
    let status = result.expect_err("refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains(says), "{:?} does not say {says:?}", status.message());
    status
}

fn clients(server: &Server, resource: &str) -> f64 {
    server.metric(&format!("sluice_server_clients{{resource=\"{resource}\"}}")).unwrap_or(0.0)
}

#[tokio::test]
async fn a_policy_keeps_each_identity_to_its_client_ids_resources_and_calls() {
    let pki = Pki::new();
    let server = pki.server(&config(10), &[]);
    let mut web1 = pki.client(&server, &pki.spiffe("web-1", "ns/shop/pod/web-1")).await;
    let mut web2 = pki.client(&server, &pki.spiffe("web-2", "ns/shop/pod/web-2")).await;
    let mut region = pki.client(&server, &pki.spiffe("region", "ns/sluice/sa/region")).await;
    let mut stranger = pki.client(&server, &pki.common_name("stranger")).await;

    assert_eq!(get(&mut web1, "web-1:80", &["api/orders"], 100.0).await.unwrap(), 100.0);

    // Another pod cannot release the victim's lease, nor a caller allowed every id but not the
    // victim's identity; the victim keeps its lease.
    denied(web2.release_capacity(release("web-1:80", "api/orders")).await, "does not allow the client id");
    denied(region.release_capacity(release("web-1:80", "api/orders")).await, "holds leases for another identity");
    denied(region.get_capacity(ask("web-1:80", &["api/orders"], 1.0)).await, "holds leases for another identity");
    assert_eq!(clients(&server, "api/orders"), 1.0);
    assert_eq!(get(&mut web1, "web-1:80", &["api/orders"], 100.0).await.unwrap(), 100.0);

    // A resource outside the pod's globs: the call is refused, names it, and changes nothing.
    let status = denied(web2.get_capacity(ask("web-2:80", &["api/orders", "cache"], 10.0)).await, "\"cache\"");
    assert_eq!(sluice_client::answer::denied(&status), ["cache"]);
    assert_eq!(clients(&server, "api/orders"), 1.0);
    assert_eq!(server.metric("sluice_server_clients{resource=\"cache\"}"), None);

    // GetServerCapacity is the region server's, not a pod's.
    let server_ask = GetServerCapacityRequest {
        server_id: "region".into(),
        resource: vec![ServerCapacityResourceRequest {
            resource_id: "api/orders".into(),
            has: None,
            wants: vec![PriorityBandAggregate { priority: 0, num_clients: 3, wants: 30.0, profile: None }],
            signals: None,
        }],
    };
    denied(web1.get_server_capacity(server_ask.clone()).await, "does not allow GetServerCapacity");
    assert!(region.get_server_capacity(server_ask).await.is_ok());

    // No policy names a caller known by its common name only.
    denied(stranger.get_capacity(ask("stranger", &["api/orders"], 1.0)).await, "no policy of this server matches");

    let denials = |method: &str, reason: &str| {
        server
            .metric(&format!("sluice_server_policy_denials_total{{method=\"{method}\",reason=\"{reason}\"}}"))
            .unwrap_or(0.0)
    };
    assert_eq!(denials("ReleaseCapacity", "client_id"), 1.0);
    assert_eq!(denials("ReleaseCapacity", "owned"), 1.0);
    assert_eq!(denials("GetCapacity", "owned"), 1.0);
    assert_eq!(denials("GetCapacity", "resource"), 1.0);
    assert_eq!(denials("GetServerCapacity", "server_capacity"), 1.0);
    assert_eq!(denials("GetCapacity", "no_policy"), 1.0);
    assert!(server.logs().contains("does not allow the client id \"web-1:80\""), "{}", server.logs());
}

#[tokio::test]
async fn an_identity_opening_a_thousand_client_ids_holds_no_more_than_its_bound() {
    let pki = Pki::new();
    let server = pki.server(&config(10), &[]);
    let mut greedy = pki.client(&server, &pki.spiffe("greedy", "ns/shop/pod/greedy")).await;
    let mut honest = pki.client(&server, &pki.spiffe("honest", "ns/shop/pod/honest")).await;
    assert!(get(&mut honest, "honest:80", &["api/orders"], 100.0).await.is_ok());

    let mut granted = 0;
    for i in 0..1_000 {
        match get(&mut greedy, &format!("greedy:{i}"), &["api/orders"], 100.0).await {
            Ok(_) => granted += 1,
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(status.message().contains("max_client_ids"), "{}", status.message());
            }
        }
    }
    assert_eq!(granted, 10);
    assert_eq!(clients(&server, "api/orders"), 11.0);
    let refused = "sluice_server_bound_refusals_total{bound=\"client_ids_per_identity\"}";
    assert_eq!(server.metric(refused), Some(990.0));
    // The ids it holds renew; the honest pod's fair share is a twelfth... of 11 clients.
    assert!(get(&mut greedy, "greedy:3", &["api/orders"], 100.0).await.is_ok());
    let share = get(&mut honest, "honest:80", &["api/orders"], 100.0).await.unwrap();
    assert!((share - 100.0 / 11.0).abs() < 1e-6, "{share}");
    // An id let go is room for another.
    greedy.release_capacity(release("greedy:0", "api/orders")).await.unwrap();
    assert!(get(&mut greedy, "greedy:1000", &["api/orders"], 100.0).await.is_ok());
}

#[tokio::test]
async fn a_crowded_resource_refuses_new_clients_while_its_clients_renew() {
    let pki = Pki::new();
    let server = pki.server(&config(100), &["--max-clients-per-resource", "3"]);
    let mut pod = pki.client(&server, &pki.spiffe("pod", "ns/shop/pod/pod")).await;
    for i in 0..3 {
        assert!(get(&mut pod, &format!("pod:{i}"), &["api/orders"], 1.0).await.is_ok());
    }
    let status = get(&mut pod, "pod:3", &["api/orders"], 1.0).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("--max-clients-per-resource"), "{}", status.message());
    assert!(get(&mut pod, "pod:3", &["api/other"], 1.0).await.is_ok(), "another resource has room");
    assert!(get(&mut pod, "pod:0", &["api/orders"], 1.0).await.is_ok(), "a client holding a lease renews");
    let refused = "sluice_server_bound_refusals_total{bound=\"clients_per_resource\"}";
    assert_eq!(server.metric(refused), Some(1.0));
}

/// A sidecar whose identity may ask for `api/*`, charging `api/orders` on /echo/orders and `cache`
/// on /echo/cache: the server refuses `cache`, which then lets nothing pass, while `api/orders` is
/// leased and passes.
#[test]
fn a_sidecar_refused_one_resource_keeps_leasing_the_others() {
    let pki = Pki::new();
    let server = pki.server(&config(10), &[]);
    pki.spiffe("web-1", "ns/shop/pod/web-1");
    let upstream = UpstreamProcess::start(None);
    let tls = ServerTls {
        ca: Some(Path::new(&pki.path("ca.pem")).into()),
        cert: Some(Path::new(&pki.path("web-1.pem")).into()),
        key: Some(Path::new(&pki.path("web-1.key")).into()),
        server_name: Some("localhost".into()),
    };
    let resource = |id| Resource::new(id).kind(Kind::Rate).capacity(1000.0).when_unreachable(Fallback::Optimistic);
    let config = SidecarConfig::proxy(Listener::app(), Upstream::app(upstream.addr()))
        .leasing_from([server.grpc])
        .server_tls(tls)
        .resource(resource("api/orders"))
        .resource(resource("cache"))
        .rule(Rule::charging("api/orders").matching(Match::default().path(PathMatch::Prefix("/echo/orders".into()))))
        .rule(Rule::charging("cache").matching(Match::default().path(PathMatch::Prefix("/echo/cache".into()))));
    let sidecar = Sidecar::launch(&config).args(["--client-id", "web-1:80"]).start();
    let status = |path| http_get(sidecar.listen(), path).map(|(status, _)| status).ok();
    let mode = |resource: &str, mode: &str| {
        sidecar.metric(&format!("sluice_sidecar_mode{{resource=\"{resource}\",mode=\"{mode}\"}}")) == Some(1.0)
    };
    eventually_blocking(lazily(|| format!("no lease and refusal; log:\n{}", sidecar.logs())), || {
        status("/echo/orders");
        status("/echo/cache");
        mode("api/orders", "leased") && mode("cache", "denied")
    });
    assert_eq!(status("/echo/orders"), Some(200));
    assert_eq!(status("/echo/cache"), Some(429));
    assert!(sidecar.logs().contains("policy refuses these resources"), "{}", sidecar.logs());
    assert_eq!(clients(&server, "api/orders"), 1.0);
    assert_eq!(server.metric("sluice_server_clients{resource=\"cache\"}"), None);
}
