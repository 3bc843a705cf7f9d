//! The S3 side: SigV4-signed requests (rusty-s3 signs, ureq sends) to any S3-compatible store
//! with path-style addressing, as S3 defines them: a Content-Length on every PUT and POST (0 for
//! an empty body), CreateBucket with the region's location outside us-east-1, multipart uploads
//! for bodies over [`PART_SIZE`], retries with backoff and jitter of what may succeed later
//! (5xx, throttling, timeouts, broken connections; never another 4xx), and S3's error answers
//! turned into messages that say what to do ([`S3Error`]), never with the signed URL. Every body
//! read from the store is bounded.

use crate::signing::ManifestKey;
use crate::{Error, Result};
use rand::Rng;
use rusty_s3::actions::CreateMultipartUpload;
use rusty_s3::{Bucket, Credentials, Method, S3Action, UrlStyle};
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long a signed request stays valid.
const SIGN_TTL: Duration = Duration::from_secs(15 * 60);
/// Most bytes of one listing page accepted (1000 keys of ours take about 300 KiB).
const MAX_LIST_PAGE: u64 = 8 << 20;
/// Most bytes of an error body kept for a message (and of the small XML answers of a multipart
/// upload's start and end).
const MAX_ERROR_BODY: u64 = 4096;
/// Bodies larger than this are written as multipart uploads in parts of this size. Nothing this
/// crate writes comes near it (a chunk is at most 4 MiB, a manifest at most 32 MiB to be read
/// back), but a body this large is better retried a part at a time than whole.
pub const PART_SIZE: usize = 64 << 20;
/// S3's smallest part of a multipart upload (all but the last).
pub const MIN_PART_SIZE: usize = 5 << 20;
/// S3's largest part.
pub const MAX_PART_SIZE: usize = 5 << 30;
/// S3's most parts in one upload.
const MAX_PARTS: usize = 10_000;

/// A store's settings as flags gave them (`branchbox remote`'s, branchboxd's); each one not
/// given is read from its environment variable by [`RemoteConfig::from_env`]. Credentials are
/// never flags: they come from the environment only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreSettings {
    /// `--remote s3://BUCKET[/PREFIX]`, else `BRANCHBOX_REMOTE`.
    pub remote: Option<String>,
    /// `--s3-endpoint http://HOST:PORT`, else `BRANCHBOX_S3_ENDPOINT`.
    pub s3_endpoint: Option<String>,
    /// `--s3-region`, else `BRANCHBOX_S3_REGION`, else `us-east-1`.
    pub s3_region: Option<String>,
    /// `--manifest-key-file`, else `BRANCHBOX_MANIFEST_KEY_FILE`: the fleet's manifest key
    /// (docs/remote.md, "Signed manifests"); none means manifests are neither signed nor checked.
    pub manifest_key_file: Option<PathBuf>,
}

/// Where the store is and how to sign for it.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// `s3://BUCKET/PREFIX` (the prefix may be empty).
    pub url: String,
    /// The S3 endpoint, e.g. `http://127.0.0.1:8333`.
    pub endpoint: String,
    /// The signing region.
    pub region: String,
    /// Access key id.
    pub access_key: String,
    /// Secret access key.
    pub secret_key: String,
    /// The key manifests are signed and checked with, if any.
    pub manifest_key: Option<ManifestKey>,
}

impl RemoteConfig {
    /// The store `flags` name, each setting they leave out from its variable
    /// (`BRANCHBOX_REMOTE`, `BRANCHBOX_S3_ENDPOINT`, `BRANCHBOX_S3_REGION` (default
    /// `us-east-1`), `BRANCHBOX_MANIFEST_KEY_FILE`); the credentials from `AWS_ACCESS_KEY_ID`
    /// and `AWS_SECRET_ACCESS_KEY`. Reads the manifest key file when one is named. Says which
    /// setting is missing or wrong.
    pub fn from_env(flags: &StoreSettings) -> Result<RemoteConfig> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let need = |v: Option<String>, what: &str| v.ok_or_else(|| Error::Invalid(what.to_string()));
        let key_file =
            flags.manifest_key_file.clone().or_else(|| env("BRANCHBOX_MANIFEST_KEY_FILE").map(PathBuf::from));
        Ok(RemoteConfig {
            url: need(
                flags.remote.clone().or_else(|| env("BRANCHBOX_REMOTE")),
                "no store named: pass --remote s3://BUCKET/PREFIX or set BRANCHBOX_REMOTE",
            )?,
            endpoint: need(
                flags.s3_endpoint.clone().or_else(|| env("BRANCHBOX_S3_ENDPOINT")),
                "no S3 endpoint: pass --s3-endpoint http://HOST:PORT or set BRANCHBOX_S3_ENDPOINT",
            )?,
            region: flags
                .s3_region
                .clone()
                .or_else(|| env("BRANCHBOX_S3_REGION"))
                .unwrap_or_else(|| "us-east-1".into()),
            access_key: need(env("AWS_ACCESS_KEY_ID"), "AWS_ACCESS_KEY_ID is not set")?,
            secret_key: need(env("AWS_SECRET_ACCESS_KEY"), "AWS_SECRET_ACCESS_KEY is not set")?,
            manifest_key: key_file.map(|p| ManifestKey::load(&p)).transpose()?,
        })
    }
}

/// One object from a listing.
#[derive(Debug, Clone)]
pub struct Listed {
    /// Its key, relative to the remote's prefix.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
}

/// How a request that failed in a way worth another try is tried again: exponential backoff
/// with jitter (a random wait between half and all of a ceiling that doubles from one retry to
/// the next), so that clients throttled together do not come back together.
#[derive(Debug, Clone, Copy)]
struct Retry {
    /// Most tries of one request in all, the first included.
    tries: u32,
    /// The ceiling of the wait before the first retry.
    first: Duration,
    /// The highest ceiling.
    most: Duration,
    /// No retry starts later than this after the first try began.
    budget: Duration,
}

/// The retry policy of every request (docs/remote.md, "Retries").
const RETRY: Retry = Retry {
    tries: 5,
    first: Duration::from_millis(250),
    most: Duration::from_secs(4),
    budget: Duration::from_secs(30),
};

impl Retry {
    /// The ceiling of the wait before retry `n` (1 for the first retry).
    fn ceiling(&self, n: u32) -> Duration {
        self.first.saturating_mul(1 << n.saturating_sub(1).min(16)).min(self.most)
    }

    /// The wait before retry `n`: between half its ceiling and all of it.
    fn wait(&self, n: u32, rng: &mut impl Rng) -> Duration {
        let c = self.ceiling(n);
        rng.gen_range(c / 2..=c)
    }
}

/// Whether a status and S3 error code say the same request may succeed later: throttling
/// (429, `SlowDown` and its kin), the store's own failures (5xx but 501, `InternalError`), a
/// body the store did not receive in time (`RequestTimeout`, a 400) and a conflicting operation
/// in progress (`OperationAborted`, a 409). Any other 4xx is an answer that will not change.
fn retryable(status: u16, code: Option<&str>) -> bool {
    let code_says = matches!(
        code,
        Some(
            "SlowDown"
                | "Throttling"
                | "ThrottlingException"
                | "RequestThrottled"
                | "RequestLimitExceeded"
                | "TooManyRequests"
                | "RequestTimeout"
                | "InternalError"
                | "ServiceUnavailable"
                | "OperationAborted"
        )
    );
    code_says || status == 429 || (status >= 500 && status != 501)
}

/// An S3 error answer's fields, from `<Error><Code>..</Code><Message>..</Message>..</Error>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ErrorBody {
    /// `Code`: letters, digits and '.', at most 64 of them.
    code: Option<String>,
    /// `Message`: printable text, at most 200 characters.
    message: Option<String>,
    /// `Region`, which some refusals name (the region the bucket is in).
    region: Option<String>,
}

/// The text of the first `<name>...</name>` in `xml`, if it is closed.
fn element<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let start = xml.find(&open)? + open.len();
    let len = xml[start..].find(&format!("</{name}>"))?;
    Some(&xml[start..start + len])
}

/// XML text made printable and short: the five predefined entities decoded, control characters
/// and runs of white space turned into one space, at most `max` characters.
fn clean(text: &str, max: usize) -> Option<String> {
    let decoded = text
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&");
    let words: Vec<&str> =
        decoded.split(|c: char| c.is_whitespace() || c.is_control()).filter(|w| !w.is_empty()).collect();
    let joined = words.join(" ");
    let short: String = joined.chars().take(max).collect();
    (!short.is_empty()).then_some(short)
}

/// Parses an S3 error answer (any bytes: at most [`MAX_ERROR_BODY`] of them are looked at);
/// `None` when there is no `<Error>` element.
fn parse_error_body(body: &[u8]) -> Option<ErrorBody> {
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX_ERROR_BODY as usize)]);
    let inner = element(&text, "Error")?;
    let code: String = element(inner, "Code")
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '.')
        .take(64)
        .collect();
    Some(ErrorBody {
        code: (!code.is_empty()).then_some(code),
        // A message that quotes the request's signature is not repeated (the signed URL is a
        // credential until it expires).
        message: element(inner, "Message")
            .and_then(|m| clean(m, 200))
            .filter(|m| !m.contains("Signature=") && !m.contains("X-Amz-")),
        region: element(inner, "Region").and_then(|r| clean(r, 64)),
    })
}

/// An error answer of the store.
#[derive(Debug, thiserror::Error)]
#[error("{}", explain(.status, .error, .bucket, .endpoint, .region_header))]
struct Refusal {
    /// The HTTP status.
    status: u16,
    /// What the answer's body said.
    error: ErrorBody,
    /// The bucket, for the explanation.
    bucket: String,
    /// The endpoint, for the explanation.
    endpoint: String,
    /// The `x-amz-bucket-region` header, which a store sends with a redirect or a refused
    /// region.
    region_header: Option<String>,
}

/// Why a request to the store failed, after the tries it was worth.
#[derive(Debug, thiserror::Error)]
enum Why {
    /// The store answered with an error (or, for a multipart upload's completion, with an error
    /// in a 200 answer).
    #[error("{0}")]
    Refused(Box<Refusal>),
    /// No answer: the connection failed, was reset or timed out.
    #[error("no answer from {endpoint} ({kind}{})", after_colon(.detail))]
    Unreachable {
        /// The endpoint.
        endpoint: String,
        /// What ureq says happened.
        kind: ureq::ErrorKind,
        /// Its message and the I/O error under it, never the request's URL.
        detail: Option<String>,
    },
    /// The answer's body could not be read to its end.
    #[error("the answer broke off: {0}")]
    BrokenAnswer(std::io::Error),
    /// A successful answer longer than the caller allows.
    #[error("the answer is larger than the {0} bytes allowed; refused")]
    TooLarge(u64),
    /// A successful answer that does not say what S3 says it must.
    #[error("the answer cannot be understood: {0}")]
    Unexpected(String),
}

impl Why {
    /// Whether the same request may succeed when tried again.
    fn worth_retrying(&self) -> bool {
        match self {
            Why::Refused(r) => retryable(r.status, r.error.code.as_deref()),
            // A refused connection (the store restarting), a reset, a timeout, a connection
            // closed before its status line.
            Why::Unreachable { kind, .. } => {
                matches!(
                    kind,
                    ureq::ErrorKind::Io | ureq::ErrorKind::ConnectionFailed | ureq::ErrorKind::BadStatus
                )
            }
            Why::BrokenAnswer(_) => true,
            Why::TooLarge(_) | Why::Unexpected(_) => false,
        }
    }

    fn status(&self) -> Option<u16> {
        match self {
            Why::Refused(r) => Some(r.status),
            _ => None,
        }
    }

    fn code(&self) -> Option<&str> {
        match self {
            Why::Refused(r) => r.error.code.as_deref(),
            _ => None,
        }
    }
}

/// What a refusal means and what to do about it, then the status, code and the store's message.
fn explain(
    status: &u16,
    e: &ErrorBody,
    bucket: &str,
    endpoint: &str,
    region_header: &Option<String>,
) -> String {
    let status = *status;
    let region = e.region.as_deref().or(region_header.as_deref());
    let in_region = region.map(|r| format!(" (the store says the bucket is in {r:?})")).unwrap_or_default();
    let why = match (e.code.as_deref(), status) {
        (Some("NoSuchBucket"), _) => {
            format!("bucket {bucket:?} does not exist at {endpoint}: check --remote (a push creates its bucket)")
        }
        (Some("NoSuchKey"), _) => "no such object".to_string(),
        (Some("AccessDenied" | "AllAccessDisabled"), _) => format!(
            "access denied: the credentials from AWS_ACCESS_KEY_ID are not allowed this request on bucket {bucket:?}"
        ),
        (Some("InvalidAccessKeyId"), _) => {
            "the store does not know the access key id in AWS_ACCESS_KEY_ID".to_string()
        }
        (Some("SignatureDoesNotMatch"), _) => "the store refused the request's signature: \
             AWS_SECRET_ACCESS_KEY is not the secret of AWS_ACCESS_KEY_ID, or --s3-region is not the store's region"
            .to_string(),
        (
            Some(
                "AuthorizationHeaderMalformed"
                | "AuthorizationQueryParametersError"
                | "IllegalLocationConstraintException"
                | "InvalidLocationConstraint",
            ),
            _,
        ) => format!("the store refused the signing region: set --s3-region to the bucket's region{in_region}"),
        (Some("PermanentRedirect" | "TemporaryRedirect" | "Redirect"), _) | (None, 301 | 307) => format!(
            "the bucket is served by another endpoint or region: check --s3-endpoint and --s3-region{in_region}"
        ),
        (Some("RequestTimeTooSkewed"), _) => "this host's clock and the store's differ by more than 15 minutes \
             (signatures carry the time): set the clock right"
            .to_string(),
        (Some("ExpiredToken" | "TokenRefreshRequired" | "InvalidToken"), _) => {
            "the credentials have expired or are not valid: renew them".to_string()
        }
        (Some("BucketAlreadyExists"), _) => {
            format!("bucket {bucket:?} exists and belongs to someone else: choose another bucket in --remote")
        }
        (Some("InvalidBucketName"), _) => format!("the store refuses the bucket name {bucket:?}"),
        (Some("NoSuchUpload"), _) => "the multipart upload is gone (aborted, or expired by the store)".to_string(),
        (Some("EntityTooSmall" | "EntityTooLarge" | "InvalidPart" | "InvalidPartOrder"), _) => {
            "the store refused the parts of the multipart upload".to_string()
        }
        (Some("MissingContentLength"), _) | (_, 411) => "the store requires a Content-Length".to_string(),
        (Some("SlowDown" | "Throttling" | "ThrottlingException" | "RequestThrottled" | "TooManyRequests"), _)
        | (None, 429) => "the store kept asking to slow down (throttling)".to_string(),
        (Some("RequestTimeout"), _) => "the store timed out waiting for the request's body".to_string(),
        (Some("QuotaExceeded" | "InsufficientStorage" | "EntityTooLargeForBucket"), _) => {
            "the store is out of space or over its quota".to_string()
        }
        // A HEAD answer has no body, so no code: only the status says what happened.
        (None, 403) => format!(
            "forbidden: the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or --s3-region are wrong, \
             or not allowed this request on bucket {bucket:?}"
        ),
        (None, 400) => "the store refused the request as malformed".to_string(),
        (_, 500..=599) => "the store failed (a server error)".to_string(),
        _ => "the store refused the request".to_string(),
    };
    let code = e.code.as_deref().map(|c| format!(" {c}")).unwrap_or_default();
    let message = e.message.as_deref().map(|m| format!(": {m:?}")).unwrap_or_default();
    format!("{why} [HTTP {status}{code}{message}]")
}

/// `": detail"`, or nothing.
fn after_colon(detail: &Option<String>) -> String {
    detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default()
}

/// `" (after N tries)"` when the request was retried.
fn tries_note(tries: &u32) -> String {
    if *tries > 1 {
        format!(" (after {tries} tries)")
    } else {
        String::new()
    }
}

/// A request to the store that did not succeed: what, on which key or bucket, where, and why.
#[derive(Debug, thiserror::Error)]
#[error("{op} {target} in {store}: {why}{}", tries_note(.tries))]
struct S3Error {
    /// The operation, in words (`PUT`, `create bucket`, `upload part 2 of`).
    op: String,
    /// The key or the bucket.
    target: String,
    /// The store's `s3://` address.
    store: String,
    /// How many times the request was sent.
    tries: u32,
    /// What went wrong the last time.
    why: Why,
}

impl From<S3Error> for Error {
    fn from(e: S3Error) -> Error {
        match e.why {
            Why::TooLarge(_) => Error::Invalid(e.to_string()),
            _ => Error::Remote(e.to_string()),
        }
    }
}

/// A successful (2xx) answer.
struct Answer {
    /// `Content-Length`, the size of the object for a HEAD.
    length: Option<u64>,
    /// `ETag`, a part's name in a multipart upload.
    etag: Option<String>,
    /// The body, at most the request's `limit`.
    body: Vec<u8>,
}

/// One request, signed afresh for each try.
struct Call<'a> {
    method: Method,
    /// For messages: the operation and its key or bucket.
    op: String,
    target: &'a str,
    /// What a PUT or POST sends: always with its Content-Length, 0 for an empty body (S3 answers
    /// 411 to a PUT without one). `None` for HEAD, GET and DELETE.
    body: Option<&'a [u8]>,
    /// Most bytes of a successful answer's body read; a longer one is refused.
    limit: u64,
}

impl<'a> Call<'a> {
    fn new(method: Method, op: impl Into<String>, target: &'a str) -> Call<'a> {
        let body = matches!(method, Method::Put | Method::Post).then_some(&[][..]);
        Call { method, op: op.into(), target, body, limit: 0 }
    }

    fn body(mut self, body: &'a [u8]) -> Call<'a> {
        self.body = Some(body);
        self
    }

    fn limit(mut self, limit: u64) -> Call<'a> {
        self.limit = limit;
        self
    }
}

/// A request that failed: why, and after how many tries.
struct Failed {
    why: Why,
    tries: u32,
}

/// A bucket and a key prefix in an S3-compatible store.
pub struct Remote {
    bucket: Bucket,
    creds: Credentials,
    prefix: String,
    agent: ureq::Agent,
    url: String,
    endpoint: String,
    manifest_key: Option<ManifestKey>,
    retry: Retry,
    part_size: usize,
}

/// Splits `s3://BUCKET/PREFIX` into the bucket and the prefix (empty, or ending in `/`).
pub fn parse_url(url: &str) -> Result<(String, String)> {
    let bad = |why: &str| Error::Invalid(format!("remote {url:?} is not s3://BUCKET[/PREFIX]: {why}"));
    let rest = url.strip_prefix("s3://").ok_or_else(|| bad("it must start with s3://"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if !bucket_ok {
        return Err(bad("a bucket name is 3-63 lowercase letters, digits, '-' or '.'"));
    }
    let prefix = prefix.trim_matches('/');
    let prefix_ok = prefix.len() <= 256
        && prefix.split('/').all(|c| {
            prefix.is_empty()
                || (!c.is_empty()
                    && c != "."
                    && c != ".."
                    && c.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)))
        });
    if !prefix_ok {
        return Err(bad("a prefix is up to 256 characters of letters, digits, '-', '_', '.' and '/'"));
    }
    let prefix = if prefix.is_empty() { String::new() } else { format!("{prefix}/") };
    Ok((bucket.to_string(), prefix))
}

/// The body of a CreateBucket request: none in us-east-1, else the region as the bucket's
/// location (S3 refuses a bucket created outside us-east-1 without it).
fn create_bucket_body(region: &str) -> String {
    if region == "us-east-1" {
        return String::new();
    }
    let escaped = region.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    format!(
        "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
         <LocationConstraint>{escaped}</LocationConstraint></CreateBucketConfiguration>"
    )
}

impl Remote {
    /// A remote from its configuration (no request is made).
    pub fn new(cfg: &RemoteConfig) -> Result<Remote> {
        let (name, prefix) = parse_url(&cfg.url)?;
        let endpoint = url::Url::parse(&cfg.endpoint)
            .map_err(|e| Error::Invalid(format!("S3 endpoint {:?} is not a URL: {e}", cfg.endpoint)))?;
        if endpoint.scheme() != "http" {
            return Err(Error::Invalid(format!(
                "S3 endpoint {:?}: only http:// endpoints are supported (a store on this host or a private network)",
                cfg.endpoint
            )));
        }
        let bucket = Bucket::new(endpoint, UrlStyle::Path, name, cfg.region.clone())
            .map_err(|e| Error::Invalid(format!("S3 endpoint {:?}: {e}", cfg.endpoint)))?;
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10))
            .timeout_read(Duration::from_secs(120))
            .timeout_write(Duration::from_secs(120))
            // A presigned URL is for one host; a redirect is reported (it names a wrong
            // endpoint or region), not followed.
            .redirects(0)
            .build();
        Ok(Remote {
            bucket,
            creds: Credentials::new(cfg.access_key.clone(), cfg.secret_key.clone()),
            prefix,
            agent,
            url: cfg.url.clone(),
            endpoint: cfg.endpoint.clone(),
            manifest_key: cfg.manifest_key.clone(),
            retry: RETRY,
            part_size: PART_SIZE,
        })
    }

    /// This remote with bodies larger than `bytes` written as multipart uploads in parts of
    /// `bytes` (default [`PART_SIZE`]); S3 takes parts of [`MIN_PART_SIZE`] to 5 GiB.
    pub fn with_part_size(mut self, bytes: usize) -> Result<Remote> {
        if !(MIN_PART_SIZE..=MAX_PART_SIZE).contains(&bytes) {
            return Err(Error::Invalid(format!(
                "a multipart upload's part is {MIN_PART_SIZE} to {MAX_PART_SIZE} bytes, not {bytes}"
            )));
        }
        self.part_size = bytes;
        Ok(self)
    }

    /// The `s3://` address, for messages.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The key this remote's manifests are signed and checked with, if any.
    pub fn manifest_key(&self) -> Option<&ManifestKey> {
        self.manifest_key.as_ref()
    }

    fn key(&self, rel: &str) -> String {
        format!("{}{rel}", self.prefix)
    }

    fn error(&self, call: &Call<'_>, f: Failed) -> S3Error {
        S3Error {
            op: call.op.clone(),
            target: call.target.to_string(),
            store: self.url.clone(),
            tries: f.tries,
            why: f.why,
        }
    }

    /// Sends `call` (signed by `sign` for each try) until it succeeds, fails in a way not worth
    /// another try, or [`Retry`] says to stop. Every request here is idempotent: chunks are
    /// named by their content, a manifest or lease is written whole, a part number names its
    /// part.
    fn send(&self, call: &Call<'_>, sign: &dyn Fn() -> url::Url) -> std::result::Result<Answer, Failed> {
        let started = Instant::now();
        let mut rng = rand::thread_rng();
        let mut tries = 0;
        loop {
            tries += 1;
            let why = match self.try_once(call, &sign()) {
                Ok(answer) => return Ok(answer),
                Err(why) => why,
            };
            if !why.worth_retrying() || tries >= self.retry.tries {
                return Err(Failed { why, tries });
            }
            let wait = self.retry.wait(tries, &mut rng);
            if started.elapsed() + wait > self.retry.budget {
                return Err(Failed { why, tries });
            }
            std::thread::sleep(wait);
        }
    }

    fn try_once(&self, call: &Call<'_>, url: &url::Url) -> std::result::Result<Answer, Why> {
        let request = self.agent.request_url(call.method.to_str(), url);
        let sent = match call.body {
            Some(body) => request.send_bytes(body),
            None => request.call(),
        };
        let response = match sent {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            // Not the transport error's own text: it carries the presigned URL, a credential
            // for this request until it expires.
            Err(ureq::Error::Transport(t)) => {
                let io = std::error::Error::source(&t)
                    .and_then(|s| s.downcast_ref::<std::io::Error>())
                    .map(|e| e.to_string());
                let detail = match (t.message(), io) {
                    (Some(m), Some(io)) => Some(format!("{m}: {io}")),
                    (m, io) => m.map(str::to_string).or(io),
                };
                return Err(Why::Unreachable { endpoint: self.endpoint.clone(), kind: t.kind(), detail });
            }
        };
        let status = response.status();
        let header = |name: &str| response.header(name).map(str::to_string);
        let (length, etag, region_header) = (
            header("Content-Length").and_then(|v| v.parse().ok()),
            header("ETag"),
            header("x-amz-bucket-region"),
        );
        if !(200..300).contains(&status) {
            let mut body = Vec::new();
            let _ = response.into_reader().take(MAX_ERROR_BODY).read_to_end(&mut body);
            return Err(self.refused(status, &body, region_header));
        }
        let mut body = Vec::new();
        response.into_reader().take(call.limit + 1).read_to_end(&mut body).map_err(Why::BrokenAnswer)?;
        if body.len() as u64 > call.limit {
            return Err(Why::TooLarge(call.limit));
        }
        // CompleteMultipartUpload may fail after its 200 has been sent: the error is in the body.
        if call.method == Method::Post
            && body.len() as u64 <= MAX_ERROR_BODY
            && parse_error_body(&body).is_some()
        {
            return Err(self.refused(status, &body, region_header));
        }
        Ok(Answer { length, etag, body })
    }

    fn refused(&self, status: u16, body: &[u8], region_header: Option<String>) -> Why {
        Why::Refused(Box::new(Refusal {
            status,
            error: parse_error_body(body).unwrap_or_default(),
            bucket: self.bucket.name().to_string(),
            endpoint: self.endpoint.clone(),
            region_header: region_header.and_then(|r| clean(&r, 64)),
        }))
    }

    /// The size of an object, or `None` when there is none.
    pub fn head(&self, rel: &str) -> Result<Option<u64>> {
        self.head_key(&self.key(rel))
    }

    fn head_key(&self, key: &str) -> Result<Option<u64>> {
        let call = Call::new(Method::Head, "HEAD", key);
        match self.send(&call, &|| self.bucket.head_object(Some(&self.creds), key).sign(SIGN_TTL)) {
            Ok(answer) => Ok(Some(answer.length.unwrap_or(0))),
            Err(f) if f.why.status() == Some(404) => Ok(None),
            Err(f) => Err(self.error(&call, f).into()),
        }
    }

    /// Writes an object: in one PUT up to the part size, else as a multipart upload.
    pub fn put(&self, rel: &str, body: &[u8]) -> Result<()> {
        let key = self.key(rel);
        if body.len() > self.part_size {
            return self.put_multipart(&key, body);
        }
        let call = Call::new(Method::Put, "PUT", &key).body(body);
        self.send(&call, &|| self.bucket.put_object(Some(&self.creds), &key).sign(SIGN_TTL))
            .map_err(|f| self.error(&call, f))?;
        Ok(())
    }

    /// Writes `body` as a multipart upload: CreateMultipartUpload, an UploadPart for each part
    /// (each retried on its own), CompleteMultipartUpload; on any failure the upload is aborted
    /// so that the store drops the parts sent.
    fn put_multipart(&self, key: &str, body: &[u8]) -> Result<()> {
        let call = Call::new(Method::Post, "start a multipart upload of", key).limit(MAX_ERROR_BODY);
        let answer = self
            .send(&call, &|| self.bucket.create_multipart_upload(Some(&self.creds), key).sign(SIGN_TTL))
            .map_err(|f| self.error(&call, f))?;
        let upload = CreateMultipartUpload::parse_response(&answer.body).map_err(|e| {
            self.error(&call, Failed { why: Why::Unexpected(format!("no upload id: {e}")), tries: 1 })
        })?;
        let upload_id = upload.upload_id();
        let sent = self.upload_parts(key, upload_id, body);
        if sent.is_err() {
            // Best effort: the error that stopped the upload is the one to report.
            let call = Call::new(Method::Delete, "abort the multipart upload of", key);
            let _ = self.send(&call, &|| {
                self.bucket.abort_multipart_upload(Some(&self.creds), key, upload_id).sign(SIGN_TTL)
            });
        }
        sent
    }

    fn upload_parts(&self, key: &str, upload_id: &str, body: &[u8]) -> Result<()> {
        // S3 takes at most 10,000 parts: a body that would need more gets larger parts.
        let part_size = self.part_size.max(body.len().div_ceil(MAX_PARTS));
        let mut etags = Vec::new();
        for (i, part) in body.chunks(part_size).enumerate() {
            let number =
                u16::try_from(i + 1).map_err(|_| Error::Invalid(format!("{key}: too many parts")))?;
            let call = Call::new(Method::Put, format!("upload part {number} of"), key).body(part);
            let answer = self
                .send(&call, &|| {
                    self.bucket.upload_part(Some(&self.creds), key, number, upload_id).sign(SIGN_TTL)
                })
                .map_err(|f| self.error(&call, f))?;
            let etag = answer.etag.ok_or_else(|| {
                self.error(&call, Failed { why: Why::Unexpected("the answer has no ETag".into()), tries: 1 })
            })?;
            etags.push(etag);
        }
        let complete = || {
            self.bucket.complete_multipart_upload(
                Some(&self.creds),
                key,
                upload_id,
                etags.iter().map(String::as_str),
            )
        };
        let xml = complete().body();
        let call = Call::new(Method::Post, "complete the multipart upload of", key)
            .body(xml.as_bytes())
            .limit(MAX_ERROR_BODY);
        let Err(f) = self.send(&call, &|| complete().sign(SIGN_TTL)) else { return Ok(()) };
        // A retried completion whose first try completed the upload after all: the object is
        // there, whole.
        if f.tries > 1
            && f.why.code() == Some("NoSuchUpload")
            && self.head_key(key)? == Some(body.len() as u64)
        {
            return Ok(());
        }
        Err(self.error(&call, f).into())
    }

    /// Reads an object of at most `limit` bytes; `None` when there is none. A larger object
    /// is refused without reading past the limit.
    pub fn get(&self, rel: &str, limit: u64) -> Result<Option<Vec<u8>>> {
        let key = self.key(rel);
        let call = Call::new(Method::Get, "GET", &key).limit(limit);
        match self.send(&call, &|| self.bucket.get_object(Some(&self.creds), &key).sign(SIGN_TTL)) {
            Ok(answer) => Ok(Some(answer.body)),
            Err(f) if f.why.status() == Some(404) && f.why.code() != Some("NoSuchBucket") => Ok(None),
            Err(f) => Err(self.error(&call, f).into()),
        }
    }

    /// Deletes an object (absent is fine; a missing bucket is not).
    pub fn delete(&self, rel: &str) -> Result<()> {
        let key = self.key(rel);
        let call = Call::new(Method::Delete, "DELETE", &key);
        match self.send(&call, &|| self.bucket.delete_object(Some(&self.creds), &key).sign(SIGN_TTL)) {
            Ok(_) => Ok(()),
            Err(f) if f.why.status() == Some(404) && f.why.code() != Some("NoSuchBucket") => Ok(()),
            Err(f) => Err(self.error(&call, f).into()),
        }
    }

    /// Creates the bucket when it does not exist (outside us-east-1, in the configured region).
    pub fn ensure_bucket(&self) -> Result<()> {
        let name = self.bucket.name();
        let call = Call::new(Method::Head, "HEAD bucket", name);
        match self.send(&call, &|| self.bucket.head_bucket(Some(&self.creds)).sign(SIGN_TTL)) {
            Ok(_) => return Ok(()),
            Err(f) if f.why.status() == Some(404) => {}
            Err(f) => return Err(self.error(&call, f).into()),
        }
        let body = create_bucket_body(self.bucket.region());
        let call = Call::new(Method::Put, "create bucket", name).body(body.as_bytes());
        match self.send(&call, &|| self.bucket.create_bucket(&self.creds).sign(SIGN_TTL)) {
            Ok(_) => Ok(()),
            // Created meanwhile, by another push or this request's earlier try.
            Err(f)
                if f.why.status() == Some(409)
                    && matches!(
                        f.why.code(),
                        None | Some("BucketAlreadyOwnedByYou" | "BucketAlreadyExists")
                    ) =>
            {
                Ok(())
            }
            Err(f) => Err(self.error(&call, f).into()),
        }
    }

    /// Every object under `rel_prefix` (relative to the remote's prefix), page by page.
    pub fn list(&self, rel_prefix: &str) -> Result<Vec<Listed>> {
        let full = self.key(rel_prefix);
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let call = Call::new(Method::Get, "LIST", &full).limit(MAX_LIST_PAGE);
            let sign = || {
                let mut action = self.bucket.list_objects_v2(Some(&self.creds));
                action.with_prefix(full.as_str());
                if let Some(t) = &token {
                    action.with_continuation_token(t.as_str());
                }
                action.sign(SIGN_TTL)
            };
            let answer = self.send(&call, &sign).map_err(|f| self.error(&call, f))?;
            let page = rusty_s3::actions::ListObjectsV2::parse_response(&answer.body).map_err(|e| {
                self.error(&call, Failed { why: Why::Unexpected(format!("not a listing: {e}")), tries: 1 })
            })?;
            for c in page.contents {
                if let Some(rel) = c.key.strip_prefix(&self.prefix) {
                    out.push(Listed { key: rel.to_string(), size: c.size });
                }
            }
            match page.next_continuation_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => return Ok(out),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_error_body, parse_url, retryable, ErrorBody, Remote, RemoteConfig, Retry};
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;
    use std::time::Duration;

    fn config(endpoint: &str) -> RemoteConfig {
        RemoteConfig {
            url: "s3://snaps/p".into(),
            endpoint: endpoint.into(),
            region: "us-east-1".into(),
            access_key: "key-id".into(),
            secret_key: "secret".into(),
            manifest_key: None,
        }
    }

    /// A remote whose retries wait a millisecond or two, so that tests of them take no time.
    fn quick(cfg: &RemoteConfig) -> Remote {
        let mut r = Remote::new(cfg).unwrap();
        r.retry = Retry {
            tries: 5,
            first: Duration::from_millis(1),
            most: Duration::from_millis(2),
            budget: Duration::from_secs(30),
        };
        r
    }

    #[test]
    fn errors_do_not_print_the_signed_url() {
        // Nothing listens on port 1: the connection is refused, every time.
        let err = quick(&config("http://127.0.0.1:1")).head("chunks/x").unwrap_err().to_string();
        assert!(err.contains("chunks/x") && err.contains("127.0.0.1:1"), "{err}");
        assert!(!err.contains("X-Amz") && !err.contains("key-id"), "{err}");
        assert!(err.contains("after 5 tries"), "a refused connection is retried: {err}");
    }

    #[test]
    fn throttling_server_errors_and_timeouts_are_retried_and_other_refusals_are_not() {
        for (status, code) in [
            (503, Some("SlowDown")),
            (503, None),
            (500, Some("InternalError")),
            (502, None),
            (504, None),
            (429, None),
            (400, Some("RequestTimeout")),
            (400, Some("ThrottlingException")),
            (409, Some("OperationAborted")),
            // CompleteMultipartUpload's error inside a 200.
            (200, Some("InternalError")),
        ] {
            assert!(retryable(status, code), "{status} {code:?} is not retried");
        }
        for (status, code) in [
            (400, None),
            (400, Some("InvalidArgument")),
            (403, Some("AccessDenied")),
            (403, Some("SignatureDoesNotMatch")),
            (403, Some("InvalidAccessKeyId")),
            (403, Some("RequestTimeTooSkewed")),
            (403, None),
            (404, Some("NoSuchBucket")),
            (404, None),
            (409, Some("BucketAlreadyExists")),
            (411, Some("MissingContentLength")),
            (501, Some("NotImplemented")),
            (301, Some("PermanentRedirect")),
        ] {
            assert!(!retryable(status, code), "{status} {code:?} is retried");
        }
    }

    #[test]
    fn backoff_waits_grow_to_a_ceiling_with_jitter_and_fit_the_budget() {
        use rand::SeedableRng;
        let r = super::RETRY;
        let ms = Duration::from_millis;
        let ceilings: Vec<Duration> = (1..r.tries).map(|n| r.ceiling(n)).collect();
        assert_eq!(ceilings, [ms(250), ms(500), ms(1000), ms(2000)]);
        assert_eq!(r.ceiling(9), r.most);
        assert_eq!(r.ceiling(u32::MAX), r.most, "no overflow");
        // The longest the waits of one request can add up to is under its time budget.
        assert!(ceilings.iter().sum::<Duration>() < r.budget);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for n in 1..r.tries {
            let waits: Vec<Duration> = (0..500).map(|_| r.wait(n, &mut rng)).collect();
            let c = r.ceiling(n);
            assert!(waits.iter().all(|w| *w >= c / 2 && *w <= c), "retry {n}: {waits:?}");
            // Jittered: not all the same.
            assert!(waits.iter().any(|w| *w != waits[0]), "retry {n}: {waits:?}");
        }
    }

    #[test]
    fn error_answers_are_read_with_their_entities_and_bounds() {
        let body = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>NoSuchBucket</Code>\
            <Message>The specified bucket &amp; &lt;key&gt;\n does not exist</Message>\
            <BucketName>snaps</BucketName><RequestId>1</RequestId></Error>";
        assert_eq!(
            parse_error_body(body),
            Some(ErrorBody {
                code: Some("NoSuchBucket".into()),
                message: Some("The specified bucket & <key> does not exist".into()),
                region: None,
            })
        );
        let region = b"<Error><Code>AuthorizationHeaderMalformed</Code><Region>eu-west-1</Region></Error>";
        assert_eq!(parse_error_body(region).unwrap().region.as_deref(), Some("eu-west-1"));
        // Not an error answer, or one cut short.
        assert_eq!(parse_error_body(b"<ListBucketResult></ListBucketResult>"), None);
        assert_eq!(parse_error_body(b"<Error><Code>SlowDown</Co"), None);
        assert_eq!(parse_error_body(b""), None);
        // Past the bound nothing is looked at.
        let mut long = vec![b' '; super::MAX_ERROR_BODY as usize];
        long.extend_from_slice(b"<Error><Code>SlowDown</Code></Error>");
        assert_eq!(parse_error_body(&long), None);
        // A hostile code keeps only what a code is made of; a message quoting the signature is
        // dropped.
        let hostile =
            b"<Error><Code>Slow\x1b[31mDown</Code><Message>bad X-Amz-Signature=abc</Message></Error>";
        let e = parse_error_body(hostile).unwrap();
        assert_eq!((e.code.as_deref(), e.message), (Some("Slow31mDown"), None));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_without_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..5000)) {
            let _ = parse_error_body(&bytes);
        }

        #[test]
        fn parsed_fields_are_short_and_printable(code in ".{0,300}", message in ".{0,600}") {
            let body = format!("<Error><Code>{code}</Code><Message>{message}</Message></Error>");
            let e = parse_error_body(body.as_bytes()).unwrap();
            let c = e.code.unwrap_or_default();
            proptest::prop_assert!(c.len() <= 64 && c.chars().all(|c| c.is_ascii_alphanumeric() || c == '.'));
            let m = e.message.unwrap_or_default();
            proptest::prop_assert!(m.chars().count() <= 200 && !m.chars().any(char::is_control), "{m:?}");
        }
    }

    #[test]
    fn refusals_say_what_they_mean_and_name_the_bucket() {
        let why = |status: u16, code: Option<&str>| {
            super::Refusal {
                status,
                error: ErrorBody {
                    code: code.map(str::to_string),
                    message: Some("the store's words".into()),
                    region: None,
                },
                bucket: "snaps".into(),
                endpoint: "http://127.0.0.1:9".into(),
                region_header: None,
            }
            .to_string()
        };
        for (status, code, says) in [
            (404, Some("NoSuchBucket"), "bucket \"snaps\" does not exist at http://127.0.0.1:9"),
            (403, Some("AccessDenied"), "not allowed this request on bucket \"snaps\""),
            (403, Some("InvalidAccessKeyId"), "does not know the access key id in AWS_ACCESS_KEY_ID"),
            (
                403,
                Some("SignatureDoesNotMatch"),
                "AWS_SECRET_ACCESS_KEY is not the secret of AWS_ACCESS_KEY_ID",
            ),
            (503, Some("SlowDown"), "slow down"),
            (403, Some("RequestTimeTooSkewed"), "clock"),
            (409, Some("BucketAlreadyExists"), "belongs to someone else"),
            (400, Some("AuthorizationHeaderMalformed"), "--s3-region"),
            (301, None, "--s3-endpoint"),
            (403, None, "forbidden"),
            (500, Some("InternalError"), "server error"),
        ] {
            let m = why(status, code);
            assert!(m.contains(says), "{status} {code:?}: {m}");
            assert!(m.contains(&format!("[HTTP {status}")) && m.contains("the store's words"), "{m}");
        }
    }

    /// What the scripted server answers to one request.
    enum Reply {
        /// A status, header lines (each ending in CRLF) and a body.
        Answer(u16, &'static str, Vec<u8>),
        /// The connection closed without an answer.
        Hangup,
    }

    fn answer(status: u16, body: &str) -> Reply {
        Reply::Answer(status, "", body.as_bytes().to_vec())
    }

    /// One request as the scripted server read it.
    #[derive(Debug)]
    struct Seen {
        /// The request line.
        line: String,
        /// The header lines, names lowercased.
        headers: Vec<String>,
        body: Vec<u8>,
    }

    impl Seen {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers.iter().find_map(|h| h.strip_prefix(name)?.strip_prefix(": "))
        }
    }

    /// A loopback HTTP server that answers the requests it gets with `replies`, one connection
    /// each, in order, and tells each request it read to the channel before answering it.
    fn scripted(replies: Vec<Reply>) -> (String, mpsc::Receiver<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for reply in replies {
                let Ok((conn, _)) = listener.accept() else { return };
                conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut reader = BufReader::new(conn);
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let mut headers = Vec::new();
                loop {
                    let mut h = String::new();
                    reader.read_line(&mut h).unwrap();
                    let h = h.trim_end().to_string();
                    if h.is_empty() {
                        break;
                    }
                    let (name, value) = h.split_once(':').unwrap();
                    headers.push(format!("{}: {}", name.to_ascii_lowercase(), value.trim()));
                }
                let len: usize = headers
                    .iter()
                    .find_map(|h| h.strip_prefix("content-length: "))
                    .map_or(0, |v| v.parse().unwrap());
                let mut body = vec![0; len];
                reader.read_exact(&mut body).unwrap();
                tx.send(Seen { line: line.trim_end().to_string(), headers, body }).unwrap();
                let mut conn = reader.into_inner();
                if let Reply::Answer(status, extra, body) = reply {
                    let length = if extra.to_ascii_lowercase().contains("content-length") {
                        String::new()
                    } else {
                        format!("Content-Length: {}\r\n", body.len())
                    };
                    let head =
                        format!("HTTP/1.1 {status} Scripted\r\n{length}Connection: close\r\n{extra}\r\n");
                    conn.write_all(head.as_bytes()).unwrap();
                    conn.write_all(&body).unwrap();
                }
            }
        });
        (endpoint, rx)
    }

    const SLOW_DOWN: &str =
        "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";

    #[test]
    fn create_bucket_and_every_put_send_their_content_length() {
        let (endpoint, seen) =
            scripted(vec![answer(404, ""), answer(200, ""), answer(200, ""), answer(200, "")]);
        let remote = quick(&config(&endpoint));
        remote.ensure_bucket().unwrap();
        remote.put("chunks/a", b"abc").unwrap();
        remote.put("leases/empty", b"").unwrap();
        let seen: Vec<Seen> = seen.try_iter().collect();
        let lines: Vec<&str> = seen.iter().map(|s| s.line.split('?').next().unwrap()).collect();
        assert_eq!(
            lines,
            ["HEAD /snaps/", "PUT /snaps/", "PUT /snaps/p/chunks/a", "PUT /snaps/p/leases/empty"]
        );
        let lengths: Vec<Option<&str>> = seen.iter().map(|s| s.header("content-length")).collect();
        assert_eq!(lengths, [None, Some("0"), Some("3"), Some("0")]);
        assert_eq!(seen[2].body, b"abc");
        assert!(seen.iter().all(|s| s.header("transfer-encoding").is_none()), "{seen:?}");
    }

    #[test]
    fn a_bucket_outside_us_east_1_is_created_with_its_location() {
        let (endpoint, seen) = scripted(vec![answer(404, ""), answer(200, "")]);
        let mut cfg = config(&endpoint);
        cfg.region = "eu-west-1".into();
        quick(&cfg).ensure_bucket().unwrap();
        let create = seen.try_iter().nth(1).unwrap();
        let body = String::from_utf8(create.body.clone()).unwrap();
        assert!(body.contains("<LocationConstraint>eu-west-1</LocationConstraint>"), "{body}");
        assert_eq!(create.header("content-length"), Some(body.len().to_string().as_str()));
    }

    #[test]
    fn throttling_a_server_error_and_a_dropped_connection_are_retried_until_it_works() {
        let (endpoint, seen) = scripted(vec![
            answer(503, SLOW_DOWN),
            answer(200, ""),
            answer(500, "<Error><Code>InternalError</Code></Error>"),
            answer(200, "chunk bytes"),
            Reply::Hangup,
            Reply::Answer(200, "Content-Length: 11\r\n", Vec::new()),
            // An answer that breaks off before its Content-Length.
            Reply::Answer(200, "Content-Length: 20\r\n", b"cut short".to_vec()),
            answer(200, "whole"),
        ]);
        let remote = quick(&config(&endpoint));
        remote.put("chunks/a", b"abc").unwrap();
        assert_eq!(remote.get("chunks/a", 100).unwrap().as_deref(), Some(&b"chunk bytes"[..]));
        assert_eq!(remote.head("chunks/a").unwrap(), Some(11));
        assert_eq!(remote.get("chunks/b", 100).unwrap().as_deref(), Some(&b"whole"[..]));
        let seen: Vec<Seen> = seen.try_iter().collect();
        let methods: Vec<&str> = seen.iter().map(|s| s.line.split(' ').next().unwrap()).collect();
        assert_eq!(methods, ["PUT", "PUT", "GET", "GET", "HEAD", "HEAD", "GET", "GET"]);
        // The retried PUT sent the same body again.
        assert_eq!((&seen[0].body[..], &seen[1].body[..]), (&b"abc"[..], &b"abc"[..]));
    }

    #[test]
    fn a_refusal_is_not_retried_and_retries_end_after_the_last_try() {
        let denied = "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>";
        let (endpoint, seen) = scripted(vec![answer(403, denied)]);
        let err = quick(&config(&endpoint)).put("chunks/a", b"abc").unwrap_err().to_string();
        assert_eq!(seen.try_iter().count(), 1, "a 403 was retried");
        assert!(err.starts_with("PUT p/chunks/a in s3://snaps/p: access denied"), "{err}");
        assert!(
            err.contains("bucket \"snaps\"") && err.contains("[HTTP 403 AccessDenied: \"Access Denied\"]"),
            "{err}"
        );
        assert!(!err.contains("X-Amz") && !err.contains("tries"), "{err}");

        let (endpoint, seen) = scripted((0..5).map(|_| answer(503, SLOW_DOWN)).collect());
        let err = quick(&config(&endpoint)).get("chunks/a", 10).unwrap_err().to_string();
        assert_eq!(seen.try_iter().count(), 5);
        assert!(err.contains("slow down") && err.ends_with("(after 5 tries)"), "{err}");
    }

    #[test]
    fn a_missing_bucket_is_an_error_where_a_missing_object_is_none() {
        let no_bucket =
            "<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message></Error>";
        let (endpoint, _seen) = scripted(vec![
            answer(404, "<Error><Code>NoSuchKey</Code></Error>"),
            answer(404, no_bucket),
            answer(404, no_bucket),
        ]);
        let remote = quick(&config(&endpoint));
        assert_eq!(remote.get("manifests/x.json", 10).unwrap(), None);
        let err = remote.get("manifests/x.json", 10).unwrap_err().to_string();
        assert!(err.contains("bucket \"snaps\" does not exist"), "{err}");
        let err = remote.list("chunks/").unwrap_err().to_string();
        assert!(err.starts_with("LIST p/chunks/ in s3://snaps/p: bucket \"snaps\" does not exist"), "{err}");
    }

    const INITIATED: &str = "<InitiateMultipartUploadResult><Bucket>snaps</Bucket><Key>p/big</Key>\
        <UploadId>up-1</UploadId></InitiateMultipartUploadResult>";

    #[test]
    fn a_multipart_upload_that_fails_is_aborted() {
        let (endpoint, seen) = scripted(vec![
            answer(200, INITIATED),
            Reply::Answer(200, "ETag: \"e1\"\r\n", Vec::new()),
            answer(403, "<Error><Code>AccessDenied</Code></Error>"),
            answer(204, ""),
        ]);
        let mut remote = quick(&config(&endpoint));
        remote.part_size = 4;
        let err = remote.put("big", b"0123456789").unwrap_err().to_string();
        assert!(err.starts_with("upload part 2 of p/big in s3://snaps/p: access denied"), "{err}");
        let seen: Vec<Seen> = seen.try_iter().collect();
        // The POST that starts the upload has no body, and says so.
        assert_eq!(seen[0].header("content-length"), Some("0"));
        let lines: Vec<&str> = seen.iter().map(|s| s.line.as_str()).collect();
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(lines[0].starts_with("POST /snaps/p/big?") && lines[0].contains("uploads"), "{lines:?}");
        assert!(lines[1].starts_with("PUT /snaps/p/big?") && lines[1].contains("partNumber=1"), "{lines:?}");
        assert!(lines[2].contains("partNumber=2") && lines[2].contains("uploadId=up-1"), "{lines:?}");
        assert!(
            lines[3].starts_with("DELETE /snaps/p/big?") && lines[3].contains("uploadId=up-1"),
            "{lines:?}"
        );
    }

    #[test]
    fn a_multipart_completion_that_fails_inside_its_200_is_retried() {
        let part = |etag: &'static str| Reply::Answer(200, etag, Vec::new());
        let (endpoint, seen) = scripted(vec![
            answer(200, INITIATED),
            part("ETag: \"e1\"\r\n"),
            part("ETag: \"e2\"\r\n"),
            part("ETag: \"e3\"\r\n"),
            answer(200, "<Error><Code>InternalError</Code><Message>try again</Message></Error>"),
            answer(200, "<CompleteMultipartUploadResult><Key>p/big</Key></CompleteMultipartUploadResult>"),
        ]);
        let mut remote = quick(&config(&endpoint));
        remote.part_size = 4;
        remote.put("big", b"0123456789").unwrap();
        let seen: Vec<Seen> = seen.try_iter().collect();
        assert_eq!(seen.len(), 6, "{seen:?}");
        let parts: Vec<&[u8]> = seen[1..4].iter().map(|s| &s.body[..]).collect();
        assert_eq!(parts, [&b"0123"[..], b"4567", b"89"]);
        for complete in &seen[4..] {
            assert!(
                complete.line.starts_with("POST /snaps/p/big?") && complete.line.contains("uploadId=up-1")
            );
            let xml = String::from_utf8_lossy(&complete.body);
            let (e1, e2, e3) = (xml.find("e1").unwrap(), xml.find("e2").unwrap(), xml.find("e3").unwrap());
            assert!(e1 < e2 && e2 < e3 && xml.contains("<PartNumber>3</PartNumber>"), "{xml}");
        }
    }

    #[test]
    fn flags_win_over_the_environment_which_fills_what_they_leave_out() {
        use super::StoreSettings;
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (flag_key, env_key) = (dir.path().join("flag.key"), dir.path().join("env.key"));
        for (p, byte) in [(&flag_key, 1u8), (&env_key, 2u8)] {
            std::fs::write(p, [byte; 32]).unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        // Only this test sets these variables in this test binary.
        std::env::set_var("BRANCHBOX_REMOTE", "s3://from-env");
        std::env::set_var("BRANCHBOX_S3_ENDPOINT", "http://127.0.0.1:9");
        std::env::set_var("BRANCHBOX_S3_REGION", "env-region");
        std::env::set_var("BRANCHBOX_MANIFEST_KEY_FILE", &env_key);
        std::env::set_var("AWS_ACCESS_KEY_ID", "id");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "secret");
        let flags = StoreSettings {
            remote: Some("s3://from-flag".into()),
            s3_endpoint: Some("http://127.0.0.1:8".into()),
            s3_region: Some("flag-region".into()),
            manifest_key_file: Some(flag_key),
        };
        let c = RemoteConfig::from_env(&flags).unwrap();
        assert_eq!(
            (c.url.as_str(), c.endpoint.as_str(), c.region.as_str()),
            ("s3://from-flag", "http://127.0.0.1:8", "flag-region")
        );
        assert_eq!(c.manifest_key.unwrap().id(), crate::signing::ManifestKey::new([1; 32]).id());
        let c = RemoteConfig::from_env(&StoreSettings::default()).unwrap();
        assert_eq!(
            (c.url.as_str(), c.endpoint.as_str(), c.region.as_str()),
            ("s3://from-env", "http://127.0.0.1:9", "env-region")
        );
        assert_eq!(c.manifest_key.unwrap().id(), crate::signing::ManifestKey::new([2; 32]).id());
        // A key file others may read stops the configuration, whichever way it was named.
        std::fs::set_permissions(&env_key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = RemoteConfig::from_env(&StoreSettings::default()).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        for k in [
            "BRANCHBOX_REMOTE",
            "BRANCHBOX_S3_ENDPOINT",
            "BRANCHBOX_S3_REGION",
            "BRANCHBOX_MANIFEST_KEY_FILE",
        ] {
            std::env::remove_var(k);
        }
        let c = RemoteConfig::from_env(&StoreSettings {
            remote: Some("s3://x-y".into()),
            s3_endpoint: Some("http://h:1".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.region, "us-east-1");
        assert!(c.manifest_key.is_none());
    }

    #[test]
    fn remote_urls_are_checked() {
        assert_eq!(parse_url("s3://snaps").unwrap(), ("snaps".into(), String::new()));
        assert_eq!(parse_url("s3://snaps/a/b/").unwrap(), ("snaps".into(), "a/b/".into()));
        for bad in ["snaps", "s3://", "s3://UP", "s3://ok/../x", "s3://ok/a//b", "s3://ok/a?b", "http://x/y"]
        {
            assert!(parse_url(bad).is_err(), "{bad} accepted");
        }
    }
}
