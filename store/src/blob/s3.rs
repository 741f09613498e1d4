//! The bytes of blobs in an S3-compatible bucket (`[workspace] blob_store = "s3"`): one
//! object per content, its key the configured prefix and the content's SHA-256 in hex.
//! Requests are SigV4-presigned (`rusty-s3`) and sent with `reqwest`, with bounded
//! timeouts and no redirects (a redirect could send the credentials' signature or a
//! content elsewhere).
//!
//! The bucket is outside the trust boundary: a content read back is hashed and refused
//! unless it is the content its key names, so a changed object is an error, never served.
//! The database stores keep the index (see `PgStore::with_objects`); this type only moves
//! bytes.

use std::time::Duration;

use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};

use crate::config::S3Section;
use crate::error::{Error, Result};
use crate::workspace::sha256_hex;

/// How long a presigned request stays valid: long enough for the slowest transfer the
/// request timeout allows.
const SIGN_FOR: Duration = Duration::from_secs(15 * 60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Per request, body included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Requests of one batch in flight at once.
const PARALLEL: usize = 8;
/// Sends of one request the service answers with its own trouble (5xx, throttling, a
/// request timeout): such an answer is transient by the protocol's own account, and one
/// failed upload would otherwise fail a whole checkpoint. Transport errors are not sent
/// again here: an unreachable service is an outage, which the caller's retry outlasts.
const SENDS: u32 = 3;
/// The wait before the second send, doubled before each later one.
const FIRST_WAIT: Duration = Duration::from_millis(100);

pub struct S3Blobs {
    bucket: Bucket,
    credentials: Credentials,
    prefix: String,
    http: reqwest::Client,
    first_wait: Duration,
}

impl std::fmt::Debug for S3Blobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credentials.
        f.debug_struct("S3Blobs")
            .field("bucket", &self.bucket.name())
            .field("endpoint", &self.bucket.base_url().as_str())
            .field("prefix", &self.prefix)
            .finish()
    }
}

fn fatal(message: impl Into<String>) -> Error {
    Error::ObjectStore {
        retryable: false,
        message: message.into(),
    }
}

fn transport(what: &str, e: &reqwest::Error) -> Error {
    Error::ObjectStore {
        retryable: true,
        message: format!("{what}: {e}"),
    }
}

/// A refusal is final (bad credentials, a missing bucket, a refused request); the
/// service's own trouble, throttling and timeouts are worth another try.
fn transient(status: reqwest::StatusCode) -> bool {
    status.is_server_error()
        || status == reqwest::StatusCode::TOO_MANY_REQUESTS
        || status == reqwest::StatusCode::REQUEST_TIMEOUT
}

fn status_error(what: &str, status: reqwest::StatusCode) -> Error {
    Error::ObjectStore {
        retryable: transient(status),
        message: format!("{what}: HTTP {status}"),
    }
}

/// The object store `[workspace]` configures: `None` for `blob_store = "database"`.
pub fn from_workspace(
    w: &crate::config::WorkspaceSection,
) -> Result<Option<std::sync::Arc<S3Blobs>>> {
    match w.blob_store {
        crate::config::BlobStoreKind::Database => Ok(None),
        crate::config::BlobStoreKind::S3 => {
            Ok(Some(std::sync::Arc::new(S3Blobs::from_settings(&w.s3)?)))
        }
    }
}

impl S3Blobs {
    /// From validated settings, with the credentials read from the variables they name.
    pub fn from_settings(s: &S3Section) -> Result<Self> {
        let read = |name: &str, key: &str| {
            std::env::var(name).map_err(|_| {
                Error::Config(format!(
                    "`workspace.{key}`: the environment variable {name} is not set"
                ))
            })
        };
        let access = read(&s.access_key_env, "s3.access_key_env")?;
        let secret = read(&s.secret_key_env, "s3.secret_key_env")?;
        Self::new(s, access, secret)
    }

    /// With the credentials given (tests, and callers that read them elsewhere).
    pub fn new(s: &S3Section, access_key: String, secret_key: String) -> Result<Self> {
        let credentials = Credentials::new(access_key, secret_key);
        let endpoint = s.endpoint.parse().map_err(|e| {
            Error::Config(format!(
                "`workspace.s3.endpoint`: {:?} is not a URL ({e})",
                s.endpoint
            ))
        })?;
        let bucket = Bucket::new(endpoint, UrlStyle::Path, s.bucket.clone(), s.region.clone())
            .map_err(|e| Error::Config(format!("`workspace.s3.bucket`: {e}")))?;
        // HTTP/1.1, a connection per transfer in flight: one HTTP/2 connection would queue
        // a worker's transfers past the server's stream limit.
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .http1_only()
            .build()
            .map_err(|e| Error::Config(format!("object store client: {e}")))?;
        Ok(S3Blobs {
            bucket,
            credentials,
            prefix: s.prefix.clone(),
            http,
            first_wait: FIRST_WAIT,
        })
    }

    /// The same store waiting `first_wait` (doubled each time) before sending a request
    /// again after a transient answer.
    pub fn with_first_wait(mut self, first_wait: Duration) -> Self {
        self.first_wait = first_wait;
        self
    }

    /// The answer to the request `build` makes, sent again (up to `SENDS` in all) while
    /// the service answers with a transient status. Every request here is idempotent: a
    /// content's object holds the same bytes whoever writes it, and a delete of an absent
    /// object is no error.
    async fn send(
        &self,
        what: &str,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response> {
        let mut wait = self.first_wait;
        let mut sent = 1;
        loop {
            let resp = build().send().await.map_err(|e| transport(what, &e))?;
            if !transient(resp.status()) || sent >= SENDS {
                return Ok(resp);
            }
            tracing::debug!(what, status = %resp.status(), ?wait, "object store answer is transient; sending again");
            drop(resp);
            tokio::time::sleep(wait).await;
            wait = wait.saturating_mul(2);
            sent += 1;
        }
    }

    fn object(&self, key: &str) -> Result<String> {
        // Only a hash names an object: nothing else may reach a key of the bucket.
        if key.len() != 64 || !key.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(Error::invalid("blob", format!("{key:?} is not a SHA-256")));
        }
        Ok(format!("{}{key}", self.prefix))
    }

    /// Store `data` as the retention export `name` (`retention/<name>` under the prefix):
    /// the one object of the bucket not named by a hash, its name made only of
    /// `[a-z0-9._-]` by the caller's own choosing, never from input.
    pub async fn put_export(&self, name: &str, data: Vec<u8>) -> Result<()> {
        if name.is_empty()
            || !name
                .bytes()
                .all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'))
        {
            return Err(Error::invalid(
                "export",
                format!("{name:?} is not an export name"),
            ));
        }
        self.put_object(&format!("{}retention/{name}", self.prefix), data)
            .await
    }

    /// Store `data` as the object of `key` (its SHA-256, checked by the caller). An
    /// object of that key holds the same bytes already, so writing it again is harmless.
    pub async fn put(&self, key: &str, data: Vec<u8>) -> Result<()> {
        let object = self.object(key)?;
        self.put_object(&object, data).await
    }

    async fn put_object(&self, object: &str, data: Vec<u8>) -> Result<()> {
        let url = self
            .bucket
            .put_object(Some(&self.credentials), object)
            .sign(SIGN_FOR);
        let what = format!("PUT {object}");
        let data = bytes::Bytes::from(data);
        let resp = self
            .send(&what, || self.http.put(url.clone()).body(data.clone()))
            .await?;
        if !resp.status().is_success() {
            return Err(status_error(&what, resp.status()));
        }
        Ok(())
    }

    /// The bytes of `key`, verified against it; `None` when there is no such object.
    /// `size`: the content's size as the index records it; an object that is larger is
    /// refused as soon as it is (a changed object cannot make us hold more than that).
    pub async fn get(&self, key: &str, size: u64) -> Result<Option<Vec<u8>>> {
        let object = self.object(key)?;
        let url = self
            .bucket
            .get_object(Some(&self.credentials), &object)
            .sign(SIGN_FOR);
        let what = format!("GET {object}");
        let mut resp = self.send(&what, || self.http.get(url.clone())).await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !resp.status().is_success() {
            return Err(status_error(&what, resp.status()));
        }
        let changed = || {
            fatal(format!(
                "{what}: the object's content is not the content its key names \
                 (changed in the bucket?); refused"
            ))
        };
        if resp.content_length().is_some_and(|n| n > size) {
            return Err(changed());
        }
        let mut data = Vec::with_capacity(usize::try_from(size.min(1 << 20)).unwrap_or(0));
        while let Some(chunk) = resp.chunk().await.map_err(|e| transport(&what, &e))? {
            if (data.len() as u64).saturating_add(chunk.len() as u64) > size {
                return Err(changed());
            }
            data.extend_from_slice(&chunk);
        }
        if sha256_hex(&data) != key {
            return Err(changed());
        }
        Ok(Some(data))
    }

    /// Whether the object of `key` exists.
    pub async fn exists(&self, key: &str) -> Result<bool> {
        let object = self.object(key)?;
        let url = self
            .bucket
            .head_object(Some(&self.credentials), &object)
            .sign(SIGN_FOR);
        let what = format!("HEAD {object}");
        let resp = self.send(&what, || self.http.head(url.clone())).await?;
        match resp.status() {
            s if s.is_success() => Ok(true),
            reqwest::StatusCode::NOT_FOUND => Ok(false),
            s => Err(status_error(&what, s)),
        }
    }

    /// Delete the object of `key`; an absent one is no error.
    pub async fn delete(&self, key: &str) -> Result<()> {
        let object = self.object(key)?;
        let url = self
            .bucket
            .delete_object(Some(&self.credentials), &object)
            .sign(SIGN_FOR);
        let what = format!("DELETE {object}");
        let resp = self.send(&what, || self.http.delete(url.clone())).await?;
        let s = resp.status();
        if s.is_success() || s == reqwest::StatusCode::NOT_FOUND {
            Ok(())
        } else {
            Err(status_error(&what, s))
        }
    }

    /// Store every `(key, bytes)`, a few at a time, each key once: two writes of one
    /// object at once are one too many, and a service may refuse the race.
    pub async fn put_all(&self, blobs: &[(String, Vec<u8>)]) -> Result<()> {
        let mut seen = std::collections::HashSet::with_capacity(blobs.len());
        let unique: Vec<&(String, Vec<u8>)> = blobs
            .iter()
            .filter(|(k, _)| seen.insert(k.as_str()))
            .collect();
        for chunk in unique.chunks(PARALLEL) {
            futures::future::try_join_all(chunk.iter().map(|(k, d)| self.put(k, d.clone())))
                .await?;
        }
        Ok(())
    }

    /// Delete the objects of `keys`, each tried once; the first failure is returned after
    /// every key was tried.
    pub async fn delete_all(&self, keys: &[String]) -> Result<()> {
        let mut first = None;
        for chunk in keys.chunks(PARALLEL) {
            let results = futures::future::join_all(chunk.iter().map(|k| self.delete(k))).await;
            for (k, r) in chunk.iter().zip(results) {
                if let Err(e) = r {
                    tracing::warn!(key = %k, error = %e, "deleting a collected content's object failed");
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Create the bucket (tests and first setup).
    pub async fn create_bucket(&self) -> Result<()> {
        let url = self.bucket.create_bucket(&self.credentials).sign(SIGN_FOR);
        let resp = self
            .http
            .put(url)
            .header(reqwest::header::CONTENT_LENGTH, "0")
            .send()
            .await
            .map_err(|e| transport("create bucket", &e))?;
        if !resp.status().is_success() {
            return Err(status_error("create bucket", resp.status()));
        }
        Ok(())
    }
}
