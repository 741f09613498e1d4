//! `agentq keys create | list | revoke`: API keys in the configured store (Postgres when
//! a database URL is configured, else the embedded SQLite file, as `agentq dev` uses).
//! A new key is printed once, as the last line of stdout; only its hash is stored, so a
//! lost key cannot be shown again (revoke it and create another).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use chrono::{DateTime, NaiveDate, Utc};
use clap::{Args, Subcommand};

use agentq_core::auth::{self, ApiKey, Scope};
use agentq_core::config::Settings;
use agentq_core::pg::PgStore;
use agentq_core::sqlite::SqliteStore;
use agentq_core::{Error, Store};

#[derive(Args, Debug)]
pub struct KeysArgs {
    #[command(subcommand)]
    pub command: KeysCommand,
    /// Configuration file (default: ./agentq.toml when present).
    #[arg(long, env = "AGENTQ_CONFIG", global = true)]
    pub config: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Create a key and print it (once, as the last line).
    #[command(after_help = "Examples:
  agentq keys create --tenant acme --scopes sessions:read,sessions:write --label ci
  agentq keys create --tenant ops --scopes admin --expires 2027-01-31")]
    Create(CreateArgs),
    /// List the keys (never their secrets).
    #[command(after_help = "Examples:
  agentq keys list")]
    List,
    /// Revoke a key by its id (schedulers refuse it once their key cache has expired,
    /// `key_cache_secs`).
    #[command(after_help = "Examples:
  agentq keys revoke KEY_ID                     # the id `agentq keys list` shows")]
    Revoke { id: String },
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The tenant whose sessions the key creates and sees.
    #[arg(long)]
    pub tenant: String,
    /// Comma-separated: sessions:write, sessions:read, approvals:write, admin.
    #[arg(long)]
    pub scopes: String,
    /// A note for listings (who or what uses the key).
    #[arg(long)]
    pub label: Option<String>,
    /// When the key stops working: a date (YYYY-MM-DD, midnight UTC) or an RFC 3339 time.
    #[arg(long)]
    pub expires: Option<String>,
}

/// The store the keys live in (see the module docs).
async fn open_store(config: Option<&std::path::Path>) -> anyhow::Result<Arc<dyn Store>> {
    let cfg = Settings::resolve(config, |k| std::env::var(k).ok(), |_| {})?;
    open_configured(&cfg, None).await
}

/// The configured store (see the module docs), its blobs' bytes in `objects` when given
/// (`[workspace] blob_store = "s3"`: what deletes a content must delete its object too).
pub(crate) async fn open_configured(
    cfg: &Settings,
    objects: Option<Arc<agentq_core::blob::s3::S3Blobs>>,
) -> anyhow::Result<Arc<dyn Store>> {
    let store: Arc<dyn Store> = match cfg.database_url.as_deref() {
        Some(_) => {
            let shards = crate::stack::open_shards(&cfg.database_urls(), objects, |u| async move {
                PgStore::connect(&u, 2).await
            })
            .await?;
            let store = crate::stack::one_store(shards).await?;
            match store.check_schema().await {
                Ok(()) => {}
                Err(e @ Error::SchemaBehind { .. }) => return Err(anyhow!(e)),
                Err(e) => return Err(anyhow!(e).context("cannot check the database schema")),
            }
            store
        }
        None => {
            let path = &cfg.sqlite_path;
            let mut store = SqliteStore::open(path)
                .await
                .with_context(|| format!("cannot open the database {}", path.display()))?;
            store
                .migrate()
                .await
                .with_context(|| format!("cannot migrate the database {}", path.display()))?;
            if let Some(o) = objects {
                store = store.with_objects(o);
            }
            Arc::new(store)
        }
    };
    Ok(store)
}

/// `--expires`: a date (midnight UTC) or an RFC 3339 time, in the future.
pub fn parse_expiry(v: &str, now: DateTime<Utc>) -> anyhow::Result<DateTime<Utc>> {
    let at = if let Ok(t) = DateTime::parse_from_rfc3339(v) {
        t.with_timezone(&Utc)
    } else if let Ok(d) = NaiveDate::parse_from_str(v, "%Y-%m-%d") {
        d.and_hms_opt(0, 0, 0)
            .map(|t| t.and_utc())
            .ok_or_else(|| anyhow!("--expires: {v:?} is not a date"))?
    } else {
        bail!("--expires: {v:?} is neither a date (2027-01-31) nor an RFC 3339 time");
    };
    if at <= now {
        bail!("--expires: {v:?} is in the past");
    }
    Ok(at)
}

fn time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "-".to_string(),
        |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    )
}

fn row(k: &ApiKey) -> [String; 7] {
    [
        k.id.clone(),
        k.tenant.clone(),
        Scope::join(&k.scopes),
        k.label.clone().unwrap_or_else(|| "-".into()),
        time(Some(k.created_at)),
        time(k.expires_at),
        time(k.revoked_at),
    ]
}

pub async fn keys(args: KeysArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        KeysCommand::Create(c) => {
            let scopes = Scope::parse_list(&c.scopes).map_err(|e| match Error::from(e) {
                Error::Invalid { message, .. } => anyhow!("--scopes: {message}"),
                e => anyhow!(e),
            })?;
            if !auth::valid_tenant(&c.tenant) {
                bail!(
                    "--tenant: {:?} is not a tenant name (1 to {} of A-Z a-z 0-9 _ . -)",
                    c.tenant,
                    auth::MAX_TENANT
                );
            }
            let expires = c
                .expires
                .as_deref()
                .map(|v| parse_expiry(v, Utc::now()))
                .transpose()?;
            let store = open_store(args.config.as_deref()).await?;
            let (new, key) = auth::generate(&c.tenant, scopes, c.label, expires)?;
            let stored = store
                .create_key(&new)
                .await
                .context("cannot store the key")?;
            println!(
                "created key {} for tenant {} with scopes {} (expires {})",
                stored.id,
                stored.tenant,
                Scope::join(&stored.scopes),
                time(stored.expires_at)
            );
            println!("the key is shown once; store it now:");
            println!("{key}");
        }
        KeysCommand::List => {
            let store = open_store(args.config.as_deref()).await?;
            let keys = store.list_keys().await.context("cannot list the keys")?;
            let header = [
                "ID", "TENANT", "SCOPES", "LABEL", "CREATED", "EXPIRES", "REVOKED",
            ];
            let rows: Vec<[String; 7]> = keys.iter().map(row).collect();
            let mut widths = header.map(str::len);
            for r in &rows {
                for (w, cell) in widths.iter_mut().zip(r) {
                    *w = (*w).max(cell.chars().count());
                }
            }
            let line = |cells: &[String]| {
                cells
                    .iter()
                    .zip(widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect::<Vec<_>>()
                    .join("  ")
                    .trim_end()
                    .to_string()
            };
            println!("{}", line(&header.map(str::to_string)));
            for r in &rows {
                println!("{}", line(r));
            }
        }
        KeysCommand::Revoke { id } => {
            let store = open_store(args.config.as_deref()).await?;
            match store
                .revoke_key(&id)
                .await
                .context("cannot revoke the key")?
            {
                Some(k) => println!(
                    "revoked key {} (tenant {}) at {}",
                    k.id,
                    k.tenant,
                    time(k.revoked_at)
                ),
                None => {
                    eprintln!("agentq: no key with id {id:?} (see `agentq keys list`)");
                    return Ok(ExitCode::from(1));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn expiry_forms() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            parse_expiry("2026-02-01", now).unwrap().to_rfc3339(),
            "2026-02-01T00:00:00+00:00"
        );
        assert!(parse_expiry("2026-01-01T12:00:00+02:00", now).is_ok());
        let past = parse_expiry("2025-12-31", now).unwrap_err().to_string();
        assert!(
            past.contains("--expires") && past.contains("past"),
            "{past}"
        );
        assert!(
            parse_expiry("next week", now)
                .unwrap_err()
                .to_string()
                .contains("--expires")
        );
    }
}
