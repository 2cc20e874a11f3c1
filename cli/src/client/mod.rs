//! `reeve` as a client of any deployment (`--endpoint` / `REEVE_ENDPOINT`).
//!
//! [`Client`] holds the endpoint and its profile from the credentials file,
//! and sends every request: it opens a session when the cached token is
//! missing or expired (and once more when the server refuses one), and turns
//! every answer that is not a success into a [`ClientError`], whose
//! [`exit code`](ClientError::exit_code) scripts can rely on.

// One file per help group of client commands (space, upload, task).
pub mod credentials;
pub mod output;
pub mod payment_required;
pub mod receipt;
pub mod refund;
pub mod space;
pub mod task;
pub mod upload;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use clap::builder::TypedValueParser as _;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use time::OffsetDateTime;

use credentials::{CredentialsFile, Profile};

pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:8080";

/// What every client command takes.
#[derive(Args, Debug, Clone)]
pub struct ClientOpts {
    /// The deployment's API (`reeve serve` locally).
    #[arg(long, env = reeve_shared::settings::ENDPOINT, global = true)]
    pub endpoint: Option<String>,
    /// Where task events stream from, if not the API's host (the relay's URL).
    #[arg(long, env = reeve_shared::settings::RELAY, global = true)]
    pub relay: Option<String>,
    /// The credentials profile (default: one per endpoint, named after it).
    #[arg(long, env = reeve_shared::settings::PROFILE, global = true)]
    pub profile: Option<String>,
    /// Machine output: one JSON document on stdout.
    #[arg(long, global = true)]
    pub json: bool,
    /// Where the credentials file is kept: DIR/reeve/credentials.toml
    /// (default: ~/.config).
    // Parsed as an OsString: clap's PathBuf parser refuses a blank value,
    // which XDG says is unset (`credentials::path` sees to that).
    #[arg(long, env = reeve_shared::settings::CONFIG_HOME, global = true, value_name = "DIR",
          value_parser = clap::builder::OsStringValueParser::new().map(PathBuf::from))]
    pub config_home: Option<PathBuf>,
}

/// Why a client command did not succeed. Each maps to a stable exit code.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error envelope (or something else that
    /// is not a success): exit 3.
    #[error("{message} ({code}, HTTP {status})")]
    Refused { status: u16, code: String, message: String },
    /// `402`: the task is priced and no payment was sent. The body is the
    /// x402 challenge, shown by [`payment_required`]: exit 3.
    #[error("payment required")]
    PaymentRequired(Value),
    /// No answer at all: exit 5.
    #[error("cannot reach {endpoint}: {cause}")]
    Unreachable { endpoint: String, cause: String },
    /// Bad arguments or local trouble (a missing file, no Space ID yet): exit 4.
    #[error("{0}")]
    Usage(String),
}

pub const EXIT_TASK_FAILED: u8 = 1;
pub const EXIT_TASK_CANCELED: u8 = 2;
pub const EXIT_REFUSED: u8 = 3;
pub const EXIT_USAGE: u8 = 4;
pub const EXIT_UNREACHABLE: u8 = 5;

impl ClientError {
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            ClientError::Refused { .. } | ClientError::PaymentRequired(_) => EXIT_REFUSED,
            ClientError::Usage(_) => EXIT_USAGE,
            ClientError::Unreachable { .. } => EXIT_UNREACHABLE,
        })
    }

    /// The stable code: the server's own, or the client's for local trouble.
    pub fn code(&self) -> &str {
        match self {
            ClientError::Refused { code, .. } => code,
            ClientError::PaymentRequired(_) => "payment_required",
            ClientError::Unreachable { .. } => "unreachable",
            ClientError::Usage(_) => "usage",
        }
    }

    pub fn to_json(&self) -> Value {
        let mut error = json!({ "code": self.code(), "message": self.to_string() });
        match self {
            ClientError::Refused { status, message, .. } => {
                error["status"] = json!(status);
                error["message"] = json!(message);
            }
            ClientError::PaymentRequired(challenge) => error["payment_required"] = challenge.clone(),
            _ => {}
        }
        json!({ "error": error })
    }
}

/// An answer that was a success.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    /// A success as it is; anything else as the server's refusal.
    pub fn checked(self) -> Result<Answer, ClientError> {
        let Answer { status, body, .. } = &self;
        if status.is_success() {
            return Ok(self);
        }
        if *status == StatusCode::PAYMENT_REQUIRED && body.get("accepts").is_some() {
            return Err(ClientError::PaymentRequired(self.body));
        }
        let code = body["error"]["code"].as_str().map_or_else(|| format!("http_{}", status.as_u16()), str::to_owned);
        let message = body["error"]["message"]
            .as_str()
            .or(body.as_str())
            .map_or_else(|| format!("HTTP {}", status.as_u16()), str::to_owned);
        Err(ClientError::Refused { status: status.as_u16(), code, message })
    }

    /// The error code of a refusal, if it has one.
    pub fn code(&self) -> Option<&str> {
        self.body["error"]["code"].as_str()
    }
}

pub struct Client {
    pub http: reqwest::Client,
    pub endpoint: String,
    pub profile_name: String,
    path: PathBuf,
    file: CredentialsFile,
}

impl Client {
    /// The endpoint is `--endpoint`/`REEVE_ENDPOINT`, else the named
    /// profile's, else the local default. The profile is `--profile`, else
    /// the one named after the endpoint. The credentials file is under
    /// `--config-home`/`XDG_CONFIG_HOME` (see [`credentials::path`]).
    pub fn open(opts: &ClientOpts) -> Result<Client, ClientError> {
        let (endpoint, profile) = (opts.endpoint.clone(), opts.profile.clone());
        let path = credentials::path(opts.config_home.as_deref())?;
        let file = CredentialsFile::load(&path)?;
        let named = profile.as_ref().and_then(|name| file.profiles.get(name)).and_then(|p| p.endpoint.clone());
        let endpoint = endpoint.or(named).unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned());
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(ClientError::Usage(format!(
                "the endpoint must be an http:// or https:// URL, not {endpoint:?}"
            )));
        }
        let profile_name = profile.unwrap_or_else(|| endpoint.clone());
        let http = reqwest::Client::builder()
            .user_agent(concat!("reeve-cli/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| ClientError::Usage(format!("cannot build an HTTP client: {e}")))?;
        Ok(Client { http, endpoint, profile_name, path, file })
    }

    pub fn credentials_path(&self) -> &std::path::Path {
        &self.path
    }

    pub fn profile(&self) -> Profile {
        self.file.profiles.get(&self.profile_name).cloned().unwrap_or_default()
    }

    /// Changes the profile and writes the file at once.
    pub fn update_profile(&mut self, change: impl FnOnce(&mut Profile)) -> Result<(), ClientError> {
        let profile = self.file.profiles.entry(self.profile_name.clone()).or_default();
        profile.endpoint = Some(self.endpoint.clone());
        change(profile);
        self.file.save(&self.path)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.endpoint)
    }

    fn unreachable(&self, e: &reqwest::Error) -> ClientError {
        let mut cause = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(inner) = source {
            cause = format!("{cause}: {inner}");
            source = inner.source();
        }
        ClientError::Unreachable { endpoint: self.endpoint.clone(), cause }
    }

    /// Sends a request; a transport failure is `Unreachable`, any status but
    /// a success is the server's refusal.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Result<Answer, ClientError> {
        self.send_raw(request).await?.checked()
    }

    /// Sends a request and hands back whatever the server answered, for a
    /// caller that acts on a refusal's headers (`Retry-After`).
    pub async fn send_raw(&self, request: reqwest::RequestBuilder) -> Result<Answer, ClientError> {
        let response = request.send().await.map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.map_err(|e| self.unreachable(&e))?;
        // A refusal that is not JSON keeps its first words, for its message.
        let body: Value = match serde_json::from_slice(&bytes) {
            Ok(body) => body,
            Err(_) if bytes.is_empty() || status.is_success() => Value::Null,
            Err(_) => Value::String(String::from_utf8_lossy(&bytes).chars().take(200).collect()),
        };
        Ok(Answer { status, headers, body })
    }

    /// A request without a token.
    pub async fn public(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Answer, ClientError> {
        let mut request = self.http.request(method, self.url(path));
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body.to_string());
        }
        self.send(request).await
    }

    /// Opens a session on the profile's Space and caches its token.
    pub async fn login(&mut self) -> Result<Answer, ClientError> {
        let Some(space_id) = self.profile().space_id else {
            return Err(ClientError::Usage(format!(
                "no Space ID for {}: run `reeve space create`, or `reeve login --space-id ID`",
                self.endpoint
            )));
        };
        let answer = self.public(Method::POST, "/v1/sessions", Some(&json!({ "space_id": space_id }))).await?;
        let token = answer.body["token"].as_str().map(str::to_owned);
        let expires = answer.body["expires_at"]
            .as_str()
            .and_then(|s| OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok());
        self.update_profile(|p| {
            p.token = token;
            p.token_expires_at = expires;
        })?;
        Ok(answer)
    }

    /// Ends the cached session on the server (`DELETE /v1/sessions/current`)
    /// and forgets its token; the Space ID stays. `true` if the server ended
    /// a session, `false` if there was none to end: no cached token, or one
    /// the server already refuses (expired or ended), which is forgotten all
    /// the same. Never opens a session to end it.
    pub async fn logout(&mut self) -> Result<bool, ClientError> {
        let Some(token) = self.profile().token else {
            return Ok(false);
        };
        let request = self.http.delete(self.url("/v1/sessions/current")).bearer_auth(&token);
        let answer = self.send_raw(request).await?;
        let ended = match answer.status {
            StatusCode::UNAUTHORIZED => false,
            _ => {
                answer.checked()?;
                true
            }
        };
        self.update_profile(|p| {
            p.token = None;
            p.token_expires_at = None;
        })?;
        Ok(ended)
    }

    /// The cached token, renewed first if it has expired.
    pub async fn token(&mut self) -> Result<String, ClientError> {
        if let Some(token) = self.profile().live_token(OffsetDateTime::now_utc()) {
            return Ok(token.to_owned());
        }
        self.login().await?;
        self.profile().token.ok_or_else(|| ClientError::Usage("the session answer carried no token".into()))
    }

    /// A request with the session token. A `401` (a token revoked by a key
    /// rotation, a clock skew) renews the session once and tries again.
    pub async fn authed(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, String)],
    ) -> Result<Answer, ClientError> {
        self.authed_raw(method, path, body, headers).await?.checked()
    }

    /// [`Client::authed`], handing back a refusal as it came (see
    /// [`Client::send_raw`]).
    pub async fn authed_raw(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, String)],
    ) -> Result<Answer, ClientError> {
        for attempt in 0..2 {
            let token = self.token().await?;
            let mut request = self.http.request(method.clone(), self.url(path)).bearer_auth(&token);
            for (name, value) in headers {
                request = request.header(*name, value);
            }
            if let Some(body) = body {
                request = request.header("content-type", "application/json").body(body.to_string());
            }
            match self.send_raw(request).await {
                Ok(answer) if answer.status == StatusCode::UNAUTHORIZED && attempt == 0 => {
                    self.update_profile(|p| p.token_expires_at = None)?;
                }
                other => return other,
            }
        }
        unreachable!("the second attempt returns")
    }
}

/// The payer's channel to `offer`'s seller, with its record under the
/// credentials directory (what `--pay --channel` and the refund share).
pub(crate) fn open_channel(
    opts: &ClientOpts,
    offer: &reeve_shared::payments::PaymentRequirements,
    signer: &alloy_signer_local::PrivateKeySigner,
) -> Result<crate::pay::channel::Channel, ClientError> {
    let file = credentials::path(opts.config_home.as_deref())?;
    let dir = file.parent().expect("the credentials file is in a directory");
    crate::pay::channel::Channel::open(dir, offer, signer).map_err(|e| ClientError::Usage(format!("channel: {e}")))
}

/// Prints a failed command's error: the server's code and message, the
/// payment requirements for a `402`, or the local problem. With `--json`,
/// the same as one JSON document on stdout.
pub async fn report(client: Option<&Client>, opts: &ClientOpts, error: &ClientError) {
    if opts.json {
        output::json(&error.to_json());
        return;
    }
    match error {
        ClientError::PaymentRequired(challenge) => {
            let catalog = match client {
                Some(client) => {
                    client.public(Method::GET, "/v1/catalog", None).await.map(|a| a.body).unwrap_or(Value::Null)
                }
                None => Value::Null,
            };
            eprintln!("{}", payment_required::describe(challenge, &catalog));
        }
        ClientError::Refused { code, message, .. } => eprintln!("error: {message} ({code})"),
        other => eprintln!("error: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A paid create the server refuses answers `402` with an error
    /// envelope (the challenge only in `PAYMENT-REQUIRED`): its code and
    /// message reach the user as they are, not a table of requirements. A
    /// metered payment from a payer that never approved Permit2 is one.
    #[test]
    fn a_refused_payment_shows_the_servers_code_and_message() {
        let message = "the payer has not approved Permit2 (0x000000000022D473030F116dDEE9F6B43aC78BA3) to spend \
                       this token: send approve(Permit2, max) from the payer once. Nothing was charged";
        let answer = Answer {
            status: StatusCode::PAYMENT_REQUIRED,
            headers: reqwest::header::HeaderMap::new(),
            body: json!({"error": {"code": "permit2_approval_required", "message": message, "request_id": "r"}}),
        };
        let error = answer.checked().unwrap_err();
        assert!(
            matches!(&error, ClientError::Refused { status: 402, code, message: m }
                if code == "permit2_approval_required" && m == message),
            "{error:?}"
        );
        assert_eq!(error.to_json()["error"]["message"], message);
        assert_eq!(error.exit_code(), ExitCode::from(EXIT_REFUSED));
    }
}
