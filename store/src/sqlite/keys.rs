//! API keys in the SQLite file: storing, listing, revoking and reading them (`api_keys`).

use async_trait::async_trait;

use crate::auth::{ApiKey, NewApiKey, Scope};
use crate::error::{Error, Result};
use crate::rowconv::unique_as_conflict;
use crate::sql::read;
use crate::sql::record::KeyRecord;
use crate::sql::statements::SQLITE as SQL;
use crate::store::KeyStore;

use super::SqliteStore;
use super::tx::now_us;

#[async_trait]
impl KeyStore for SqliteStore {
    async fn create_key(&self, key: &NewApiKey) -> Result<ApiKey> {
        let rec: Option<KeyRecord> = sqlx::query_as(&SQL.insert_key)
            .bind(&key.id)
            .bind(&key.tenant)
            .bind(Scope::join(&key.scopes))
            .bind(key.label.as_deref())
            .bind(&key.secret_hash)
            .bind(key.expires_at.map(|t| t.timestamp_micros()))
            .bind(now_us())
            .fetch_all(&self.writer)
            .await
            .map_err(|e| unique_as_conflict(e, &format!("api key {}", key.id)))?
            .pop();
        rec.ok_or_else(|| Error::Conflict(format!("api key {} was not stored", key.id)))?
            .into_key()
    }

    async fn list_keys(&self) -> Result<Vec<ApiKey>> {
        read::keys(&self.readers, &SQL).await
    }

    async fn revoke_key(&self, id: &str) -> Result<Option<ApiKey>> {
        let rec: Option<KeyRecord> = sqlx::query_as(&SQL.revoke_key)
            .bind(id)
            .bind(now_us())
            .fetch_all(&self.writer)
            .await?
            .pop();
        rec.map(KeyRecord::into_key).transpose()
    }

    async fn key(&self, id: &str) -> Result<Option<ApiKey>> {
        read::key(&self.readers, &SQL, id).await
    }
}
