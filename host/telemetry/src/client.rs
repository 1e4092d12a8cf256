//! The exporter's HTTP client: hyper with rustls (webpki roots), sending
//! on the host's Tokio runtime. The SDK's batch processor exports from a
//! thread of its own, so each request is spawned on the runtime the
//! client was made in and awaited from there.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};

/// How long one export may take, from connecting to the answer's end.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The client.
#[derive(Debug, Clone)]
pub(crate) struct Exporting {
    http: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
}

impl Exporting {
    /// A client sending on the current Tokio runtime.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub(crate) fn new() -> Self {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let tls =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports rustls's default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        Self {
            http: Client::builder(TokioExecutor::new()).build(connector),
            runtime: tokio::runtime::Handle::current(),
        }
    }
}

impl HttpClient for Exporting {
    fn send_bytes<'life0, 'async_trait>(
        &'life0 self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'async_trait>>
    where
        Self: 'async_trait,
        'life0: 'async_trait,
    {
        let http = self.http.clone();
        let sent = self.runtime.spawn(async move {
            let (parts, body) = request.into_parts();
            let exchange = async {
                let response = http.request(Request::from_parts(parts, Full::new(body))).await?;
                let (parts, body) = response.into_parts();
                let body = body.collect().await?.to_bytes();
                Ok::<_, HttpError>(Response::from_parts(parts, body))
            };
            match tokio::time::timeout(TIMEOUT, exchange).await {
                Ok(answer) => answer,
                Err(_) => Err(format!("no answer within {TIMEOUT:?}").into()),
            }
        });
        Box::pin(async move { sent.await.map_err(|e| Box::new(e) as HttpError)? })
    }
}
