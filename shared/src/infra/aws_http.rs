//! The AWS SDK's HTTP client: reqwest, on the process's TLS roots
//! ([`crate::infra::tls`]).
//!
//! The SDK's own client is a second hyper stack beside reqwest's (which the
//! payment and executor clients use), and it always links HTTP/2 (`h2`,
//! half a megabyte of every Lambda binary) that AWS's regional endpoints do
//! not need for these calls. This hands the SDK's requests to one reqwest
//! client instead, built with the timeouts the SDK asks for.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;

/// For `aws_config::ConfigLoader::http_client`.
pub fn http_client() -> SharedHttpClient {
    SharedHttpClient::new(Reqwest::default())
}

/// A connect and a read timeout, as the SDK gives them.
type Timeouts = (Option<Duration>, Option<Duration>);

/// One reqwest client per distinct pair of timeouts the SDK asks for (in
/// practice one: its default connect timeout and no read timeout), so the
/// connection pool is shared by every AWS client of the process.
#[derive(Debug, Default)]
struct Reqwest {
    clients: Mutex<HashMap<Timeouts, reqwest::Client>>,
}

impl HttpClient for Reqwest {
    fn http_connector(&self, settings: &HttpConnectorSettings, _: &RuntimeComponents) -> SharedHttpConnector {
        let timeouts: Timeouts = (settings.connect_timeout(), settings.read_timeout());
        let mut clients = self.clients.lock().expect("not poisoned");
        let client = clients.entry(timeouts).or_insert_with(|| reqwest_client(timeouts.0, timeouts.1));
        SharedHttpConnector::new(Connector(client.clone()))
    }
}

/// A client on the process's TLS roots with these timeouts, as the SDK's
/// requests are sent (and [`crate::infra::s3_objects`]'s).
pub fn reqwest_client(connect: Option<Duration>, read: Option<Duration>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .use_preconfigured_tls(crate::infra::tls::client_config().as_ref().clone())
        // As the SDK's own client: a proxy only when one is configured in
        // code, never from HTTPS_PROXY.
        .no_proxy()
        // The SDK follows no redirect: S3 answers a wrong region with one,
        // which the SDK reads as the error it is.
        .redirect(reqwest::redirect::Policy::none());
    if let Some(connect) = connect {
        builder = builder.connect_timeout(connect);
    }
    if let Some(read) = read {
        builder = builder.read_timeout(read);
    }
    builder.build().expect("a TLS configuration and timeouts build a client")
}

#[derive(Debug)]
struct Connector(reqwest::Client);

impl HttpConnector for Connector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let client = self.0.clone();
        HttpConnectorFuture::new(async move {
            let request = request.try_into_http1x().map_err(|e| ConnectorError::other(e.into(), None))?;
            let request = reqwest::Request::try_from(request.map(reqwest::Body::wrap))
                .map_err(|e| ConnectorError::other(e.into(), None))?;
            let response = client.execute(request).await.map_err(connector_error)?;
            let response = http::Response::from(response).map(SdkBody::from_body_1_x);
            HttpResponse::try_from(response).map_err(|e| ConnectorError::other(e.into(), None))
        })
    }
}

/// The SDK retries timeouts and I/O errors as transient, and not the others.
fn connector_error(error: reqwest::Error) -> ConnectorError {
    if error.is_timeout() {
        ConnectorError::timeout(error.into())
    } else if error.is_connect() || error.is_request() || error.is_body() {
        ConnectorError::io(error.into())
    } else {
        ConnectorError::other(error.into(), None)
    }
}

#[cfg(all(test, feature = "sqs"))]
mod tests {
    use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region, retry::RetryConfig};

    /// A refused connection reaches the SDK as an I/O error, which its retry
    /// strategy treats as transient, not as an unclassified failure.
    #[tokio::test]
    async fn a_refused_connection_is_an_io_error_the_sdk_retries() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .http_client(super::http_client())
            .region(Region::new("us-east-1"))
            .endpoint_url(closed)
            .credentials_provider(Credentials::new("test", "test", None, None, "test"))
            .retry_config(RetryConfig::standard().with_max_attempts(2))
            .build();
        let error = aws_sdk_sqs::Client::from_conf(config).list_queues().send().await.unwrap_err();
        let aws_sdk_sqs::error::SdkError::DispatchFailure(failure) = &error else { panic!("{error:?}") };
        assert!(failure.is_io(), "{error:?}");
    }
}
