//! Who a caller is, read once per connection from its TLS client certificate: the first SPIFFE
//! URI SAN, else the first DNS SAN, else the subject's common name. tonic hands it to every call
//! on the connection as the connection's [`Caller`].

use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use x509_parser::{certificate::X509Certificate, extensions::GeneralName, prelude::FromDer};

use crate::defaults::MAX_IDENTITY_BYTES;

/// What each call knows of its connection.
#[derive(Clone, Debug, Default)]
pub struct Caller {
    /// `None` over plaintext, without a client certificate, or with one that names no one
    /// within [`MAX_IDENTITY_BYTES`].
    pub identity: Option<Arc<str>>,
}

impl Caller {
    /// The caller behind a client certificate chain (its first certificate is the client's).
    pub fn of(chain: Option<&[CertificateDer<'_>]>) -> Caller {
        Caller { identity: chain.and_then(|chain| identity(chain.first()?)).map(Arc::from) }
    }
}

fn identity(der: &CertificateDer<'_>) -> Option<String> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let names = cert.subject_alternative_name().ok().flatten().map(|san| &san.value.general_names);
    let first = |wanted: &dyn Fn(&GeneralName<'_>) -> Option<String>| names.and_then(|n| n.iter().find_map(wanted));
    let found = first(&|n| match n {
        GeneralName::URI(uri) if uri.starts_with("spiffe://") => Some((*uri).to_owned()),
        _ => None,
    })
    .or_else(|| {
        first(&|n| match n {
            GeneralName::DNSName(name) => Some((*name).to_owned()),
            _ => None,
        })
    })
    .or_else(|| Some(cert.subject().iter_common_name().next()?.as_str().ok()?.to_owned()))?;
    (!found.is_empty() && found.len() <= MAX_IDENTITY_BYTES).then_some(found)
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};

    use super::*;

    fn certificate(cn: &str, sans: Vec<SanType>) -> CertificateDer<'static> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.subject_alt_names = sans;
        params.self_signed(&KeyPair::generate().unwrap()).unwrap().der().clone()
    }

    fn of(cert: CertificateDer<'static>) -> Option<String> {
        Caller::of(Some(&[cert])).identity.map(|i| i.to_string())
    }

    #[test]
    fn a_spiffe_id_comes_first_then_a_dns_name_then_the_common_name() {
        let spiffe = SanType::URI("spiffe://cluster.local/ns/a/pod/b".try_into().unwrap());
        let web = SanType::URI("https://example.com".try_into().unwrap());
        let dns = SanType::DnsName("b.a.pod".try_into().unwrap());
        assert_eq!(
            of(certificate("cn", vec![dns.clone(), web.clone(), spiffe])).as_deref(),
            Some("spiffe://cluster.local/ns/a/pod/b")
        );
        assert_eq!(of(certificate("cn", vec![web.clone(), dns])).as_deref(), Some("b.a.pod"));
        assert_eq!(of(certificate("cn", vec![web])).as_deref(), Some("cn"));
        assert_eq!(of(certificate("", Vec::new())), None);
        assert_eq!(of(certificate(&"x".repeat(MAX_IDENTITY_BYTES + 1), Vec::new())), None);
        assert!(Caller::of(None).identity.is_none());
        assert!(Caller::of(Some(&[CertificateDer::from(vec![1, 2, 3])])).identity.is_none());
    }
}
