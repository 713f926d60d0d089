//! A Kafka broker as production runs it: SASL/SCRAM-SHA-256 over TLS (`SASL_SSL`, what MSK,
//! Confluent Cloud and Strimzi's TLS listeners ask for), for the tests of every component's
//! secured connection (tests/tests/secured_kafka.rs, prefixlog/tests/secured_cli.rs).
//!
//! - The broker is tansu 0.6.0 (`PREFIXLOG_TANSU_BIN`, set by scripts/with-tansu.sh) with
//!   `--authentication`: SASL PLAIN and SCRAM-SHA-256/512, SCRAM credentials kept in its storage.
//!   The user (both SCRAM mechanisms; [`SecuredKafka::properties`] use SHA-256) is created
//!   with `tansu user create` (AlterUserScramCredentials) on a first start
//!   without authentication, then tansu restarts on the same SQLite storage with it. (tansu's
//!   PLAIN accepts any password, so the tests use SCRAM.)
//! - tansu 0.6.0 has no TLS listener (it reads `--cert`/`--key` but never uses the acceptor),
//!   so a TLS terminator (rustls, on a thread of this process) listens in front of it and tansu
//!   advertises the terminator's address: every connection a client opens after bootstrap goes
//!   through TLS too.
//! - Certificates are made at start with the openssl CLI: a CA, a server certificate for
//!   127.0.0.1 signed by it (librdkafka verifies the name), and another CA that signed nothing,
//!   for the tests of a client that must refuse the broker.

use prefixlog_ingest::KafkaConnection;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_rustls::rustls;

/// The SCRAM user and password the broker knows.
pub const USER: &str = "prefixlog";
pub const PASSWORD: &str = "scram-secret-0";

/// How long the broker may take to start (a loaded 2-core CI machine).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// tansu's binary, or why a secured test cannot run here.
pub fn tansu_bin() -> Result<String, &'static str> {
    std::env::var("PREFIXLOG_TANSU_BIN")
        .map_err(|_| "PREFIXLOG_TANSU_BIN not set (run under scripts/with-tansu.sh)")
}

/// tansu behind a TLS terminator, with SCRAM authentication. Stopped and removed on drop.
pub struct SecuredKafka {
    /// The terminator's address: the bootstrap and the advertised broker address.
    pub brokers: String,
    /// The CA that signed the broker's certificate.
    pub ca: PathBuf,
    /// A CA that signed nothing the broker shows.
    pub other_ca: PathBuf,
    broker: Child,
    terminator: Option<Terminator>,
    _dir: tempfile::TempDir,
}

impl SecuredKafka {
    pub async fn start(tansu: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        make_certificates(dir.path())?;
        let (plain, tls) = (crate::listen_port(), crate::listen_port());
        let plain_url = format!("tcp://127.0.0.1:{plain}");
        let mut first = start_tansu(tansu, dir.path(), plain, &plain_url, false)?;
        let created = async {
            wait_port(plain).await?;
            create_user(tansu, &plain_url)
        }
        .await;
        first.kill()?;
        first.wait()?;
        created?;
        let broker = start_tansu(tansu, dir.path(), plain, &format!("tcp://127.0.0.1:{tls}"), true)?;
        let mut kafka = Self {
            brokers: format!("127.0.0.1:{tls}"),
            ca: dir.path().join("ca.pem"),
            other_ca: dir.path().join("other-ca.pem"),
            broker,
            terminator: None,
            _dir: dir,
        };
        wait_port(plain).await.map_err(|e| anyhow::anyhow!("{e}; tansu's log:\n{}", kafka.log()))?;
        kafka.terminator = Some(Terminator::start(kafka._dir.path(), tls, plain)?);
        kafka.wait_ready().await?;
        Ok(kafka)
    }

    /// The librdkafka properties of a client of this broker (what `-X` would pass).
    pub fn properties(&self) -> Vec<(String, String)> {
        let ca = self.ca.display().to_string();
        [
            ("security.protocol", "SASL_SSL"),
            ("ssl.ca.location", ca.as_str()),
            ("sasl.mechanism", "SCRAM-SHA-256"),
            ("sasl.username", USER),
            ("sasl.password", PASSWORD),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// [`SecuredKafka::properties`] with one of them changed.
    pub fn properties_with(&self, key: &str, value: &str) -> Vec<(String, String)> {
        let mut p = self.properties();
        p.iter_mut().filter(|(k, _)| k == key).for_each(|(_, v)| *v = value.to_string());
        p
    }

    pub fn connection(&self) -> KafkaConnection {
        KafkaConnection::new(&self.brokers).with_properties(self.properties())
    }

    /// The broker's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("broker.log")).unwrap_or_default()
    }

    /// Ready = a SASL_SSL client gets metadata through the terminator.
    async fn wait_ready(&self) -> anyhow::Result<()> {
        let conn = self.connection();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let c = conn.clone();
            let asked = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                use rdkafka::consumer::{BaseConsumer, Consumer};
                let consumer: BaseConsumer = c.client_config(prefixlog_ingest::ClientRole::Probe).create()?;
                consumer.fetch_metadata(None, Duration::from_secs(5))?;
                Ok(())
            })
            .await?;
            match asked {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    anyhow::bail!(
                        "secured tansu not ready within {START_TIMEOUT:?}: {e}; its log:\n{}",
                        self.log()
                    )
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

impl Drop for SecuredKafka {
    fn drop(&mut self) {
        let _ = self.broker.kill();
        let _ = self.broker.wait();
        drop(self.terminator.take());
    }
}

fn start_tansu(bin: &str, dir: &Path, port: u16, advertised: &str, auth: bool) -> anyhow::Result<Child> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("broker.log"))?;
    let mut cmd = Command::new(bin);
    cmd.current_dir(dir).args(["broker", "--listener-url", &format!("tcp://127.0.0.1:{port}")]).args([
        "--advertised-listener-url",
        advertised,
        "--storage-engine",
        "sqlite://tansu.db",
    ]);
    if auth {
        cmd.arg("--authentication");
    }
    Ok(cmd.stdout(Stdio::null()).stderr(log).spawn()?)
}

/// The user's SCRAM-SHA-256 and SCRAM-SHA-512 credentials.
fn create_user(bin: &str, broker_url: &str) -> anyhow::Result<()> {
    for mechanism in ["scram256", "scram512"] {
        let out = Command::new(bin)
            .args(["user", "create", "--broker", broker_url, "--mechanism", mechanism, USER, PASSWORD])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "tansu user create --mechanism {mechanism}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

async fn wait_port(port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        anyhow::ensure!(Instant::now() < deadline, "tansu did not listen on {port} within {START_TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// ca.pem, server.pem/server.key (127.0.0.1 and localhost, signed by ca.pem), other-ca.pem.
fn make_certificates(dir: &Path) -> anyhow::Result<()> {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let self_signed = |name: &str, cn: &str| -> anyhow::Result<()> {
        let (key, pem, subj) = (format!("{name}.key"), format!("{name}.pem"), format!("/CN={cn}"));
        openssl(
            dir,
            &[&["req", "-x509"][..], &ec, &["-keyout", &key, "-out", &pem, "-days", "2", "-subj", &subj]],
        )
    };
    self_signed("ca", "prefixlog test CA")?;
    self_signed("other-ca", "some other CA")?;
    openssl(
        dir,
        &[&["req"][..], &ec, &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]],
    )?;
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
    )?;
    openssl(
        dir,
        &[&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ]],
    )
}

fn openssl(dir: &Path, args: &[&[&str]]) -> anyhow::Result<()> {
    let args: Vec<&str> = args.concat();
    let out = Command::new("openssl").current_dir(dir).args(&args).output().map_err(|e| {
        anyhow::anyhow!(
            "running openssl (the openssl CLI makes the test certificates: apt-get install openssl): {e}"
        )
    })?;
    anyhow::ensure!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// TLS on `tls`, plaintext to `plain`: one thread, its own runtime, stopped on drop.
struct Terminator {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Terminator {
    fn start(dir: &Path, tls: u16, plain: u16) -> anyhow::Result<Self> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_file_iter(dir.join("server.pem"))?.collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_file(dir.join("server.key"))?;
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_no_client_auth()
                .with_single_cert(certs, key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind(("127.0.0.1", tls))?;
        listener.set_nonblocking(true)?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let thread = std::thread::Builder::new().name("tls-terminator".into()).spawn(move || {
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                tokio::select! {
                    _ = stopped => {}
                    _ = accept_loop(listener, acceptor, plain) => {}
                }
            })
        })?;
        Ok(Self { stop: Some(stop), thread: Some(thread) })
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, acceptor: tokio_rustls::TlsAcceptor, plain: u16) {
    while let Ok((tcp, _)) = listener.accept().await {
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            // A client that does not trust the certificate aborts the handshake: nothing to do.
            let Ok(mut tls) = acceptor.accept(tcp).await else { return };
            let Ok(mut broker) = tokio::net::TcpStream::connect(("127.0.0.1", plain)).await else { return };
            let _ = tokio::io::copy_bidirectional(&mut tls, &mut broker).await;
        });
    }
}

impl Drop for Terminator {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
