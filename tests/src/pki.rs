//! Certificates for the TLS tests, made fresh by rcgen for each test.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose};

/// A self-signed CA that signs the certificates a test needs.
pub fn ca() -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("a key")).expect("a self-signed CA")
}

/// A certificate for `names` (DNS names or IP addresses) signed by `ca`, and its key, in PEM.
pub fn leaf(ca: &CertifiedIssuer<'static, KeyPair>, names: &[&str]) -> (String, String) {
    let key = KeyPair::generate().expect("a key");
    let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let cert = CertificateParams::new(names).expect("leaf parameters").signed_by(&key, ca).expect("signed");
    (cert.pem(), key.serialize_pem())
}
