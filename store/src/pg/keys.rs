//! API keys on Postgres: storing, listing, revoking and reading them (`api_keys`).

use async_trait::async_trait;

use crate::auth::{ApiKey, NewApiKey, Scope};
use crate::error::Result;
use crate::rowconv::unique_as_conflict;
use crate::sql::read;
use crate::sql::record::KeyRecord;
use crate::sql::statements::POSTGRES as SQL;
use crate::store::KeyStore;

use super::PgStore;

#[async_trait]
impl KeyStore for PgStore {
    async fn create_key(&self, key: &NewApiKey) -> Result<ApiKey> {
        let rec: KeyRecord = sqlx::query_as(&SQL.insert_key)
            .bind(&key.id)
            .bind(&key.tenant)
            .bind(Scope::join(&key.scopes))
            .bind(key.label.as_deref())
            .bind(&key.secret_hash)
            .bind(key.expires_at)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| unique_as_conflict(e, &format!("api key {}", key.id)))?;
        rec.into_key()
    }

    async fn list_keys(&self) -> Result<Vec<ApiKey>> {
        read::keys(&self.pool, &SQL).await
    }

    async fn revoke_key(&self, id: &str) -> Result<Option<ApiKey>> {
        let rec: Option<KeyRecord> = sqlx::query_as(&SQL.revoke_key)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        rec.map(KeyRecord::into_key).transpose()
    }

    async fn key(&self, id: &str) -> Result<Option<ApiKey>> {
        read::key(&self.pool, &SQL, id).await
    }
}
