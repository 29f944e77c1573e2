//! A throwaway certificate authority for `--tls --ranks N`: one CA, a
//! certificate per rank and one for the launcher's store, all for
//! 127.0.0.1, written as PEM files into a temporary directory that is
//! removed on drop.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use ringwire::{TlsConfig, TlsMode};
use std::path::PathBuf;

pub(crate) struct TempPki {
    dir: PathBuf,
}

impl TempPki {
    /// Certificates for `ranks` ranks (index `ranks` is the store's).
    pub(crate) fn generate(ranks: usize) -> Result<TempPki, String> {
        let e = |e: &dyn std::fmt::Display| e.to_string();
        let dir = std::env::temp_dir().join(format!("ringwire-bench-pki-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|x| e(&x))?;
        let pki = TempPki { dir };
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(|x| e(&x))?;
        ca.distinguished_name
            .push(DnType::CommonName, "ringwire-bench throwaway CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().map_err(|x| e(&x))?;
        let ca_cert = ca.self_signed(&ca_key).map_err(|x| e(&x))?;
        std::fs::write(pki.ca_file(), ca_cert.pem()).map_err(|x| e(&x))?;
        let issuer = Issuer::new(ca, ca_key);
        for i in 0..=ranks {
            let mut p = CertificateParams::new(vec!["127.0.0.1".to_string()]).map_err(|x| e(&x))?;
            p.distinguished_name
                .push(DnType::CommonName, format!("ringwire-bench {i}"));
            let key = KeyPair::generate().map_err(|x| e(&x))?;
            let cert = p.signed_by(&key, &issuer).map_err(|x| e(&x))?;
            let (cf, kf) = pki.files(i);
            std::fs::write(&cf, cert.pem()).map_err(|x| e(&x))?;
            std::fs::write(&kf, key.serialize_pem()).map_err(|x| e(&x))?;
        }
        Ok(pki)
    }

    pub(crate) fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Certificate and key files of rank `i` (`i == ranks`: the store).
    pub(crate) fn files(&self, i: usize) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("cert-{i}.pem")),
            self.dir.join(format!("key-{i}.pem")),
        )
    }

    /// The store's mutual-TLS settings.
    pub(crate) fn tls_config(&self, ranks: usize) -> Result<TlsConfig, String> {
        let (c, k) = self.files(ranks);
        TlsConfig::from_files(TlsMode::Mutual, self.ca_file(), c, k).map_err(|e| e.to_string())
    }
}

impl Drop for TempPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
