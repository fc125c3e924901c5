//! TLS and mTLS on the gRPC listener, with certificates generated for the test.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose};
use sluice_proto::{DiscoveryRequest, capacity_client::CapacityClient};
use sluice_tests::harness::Server;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    client_cert_pem: String,
    client_key_pem: String,
}

impl Pki {
    /// A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA.
    fn new() -> Pki {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let leaf = |names: Vec<String>| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names).unwrap().signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()]);
        let (client_cert_pem, client_key_pem) = leaf(vec!["client.sluice.test".into()]);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("server.pem"), server_cert).unwrap();
        std::fs::write(dir.path().join("server.key"), server_key).unwrap();
        Pki { ca_pem: ca.pem(), client_cert_pem, client_key_pem, dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }

    fn server(&self, mutual: bool) -> Server {
        let mut builder = Server::builder()
            .arg("--tls-cert")
            .arg(self.path("server.pem"))
            .arg("--tls-key")
            .arg(self.path("server.key"));
        if mutual {
            builder = builder.arg("--tls-client-ca").arg(self.path("ca.pem"));
        }
        builder.start()
    }

    fn tls(&self, with_client_cert: bool) -> ClientTlsConfig {
        let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem)).domain_name("127.0.0.1");
        if with_client_cert {
            tls.identity(Identity::from_pem(&self.client_cert_pem, &self.client_key_pem))
        } else {
            tls
        }
    }
}

async fn discovery(url: String, tls: Option<ClientTlsConfig>) -> Result<bool, String> {
    let mut endpoint = Channel::from_shared(url).unwrap();
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).map_err(|e| e.to_string())?;
    }
    let channel = endpoint.connect().await.map_err(|e| format!("connect: {e}"))?;
    let response = CapacityClient::new(channel).discovery(DiscoveryRequest {}).await.map_err(|e| e.to_string())?;
    Ok(response.into_inner().is_master)
}

#[tokio::test]
async fn tls_serves_only_tls_clients() {
    let pki = Pki::new();
    let server = pki.server(false);
    assert_eq!(discovery(format!("https://{}", server.grpc), Some(pki.tls(false))).await, Ok(true));
    assert!(discovery(format!("http://{}", server.grpc), None).await.is_err(), "plaintext is refused");
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_from_the_ca() {
    let pki = Pki::new();
    let server = pki.server(true);
    assert_eq!(discovery(format!("https://{}", server.grpc), Some(pki.tls(true))).await, Ok(true));
    assert!(
        discovery(format!("https://{}", server.grpc), Some(pki.tls(false))).await.is_err(),
        "no client certificate, no service"
    );
}
