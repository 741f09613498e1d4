//! The rules every setting must follow, checked once, after all the layers, by
//! [`Settings::validate`]: each error names the setting with its variable and flag. Each
//! submodule holds the rules of a group of sections; `rules` the shapes they share.

use crate::config::settings::Settings;
use crate::error::Result;

mod endpoints;
mod hooks;
mod mcp;
mod policy;
mod process;
mod retention;
mod rules;
mod schedules;
mod webhooks;

impl Settings {
    /// The Postgres URLs of `database_url`, one per shard (the control shard first);
    /// empty without one. Checked by [`Settings::validate`].
    pub fn database_urls(&self) -> Vec<String> {
        self.database_url
            .as_deref()
            .map(|u| u.split(',').map(|s| s.trim().to_string()).collect())
            .unwrap_or_default()
    }

    /// Every rule the settings must follow, checked once after all the layers; the error
    /// names the setting with its variable and flag.
    pub fn validate(&self) -> Result<()> {
        process::worker_timings(&self.worker)?;
        process::worker_limits(&self.worker)?;
        process::scheduler(&self.scheduler)?;
        process::scheduling(&self.scheduling)?;
        process::redis(&self.redis, self.redis_url.as_deref())?;
        process::database(self.database_url.as_deref())?;
        policy::policy(&self.policy, &self.worker, self.default_provider())?;
        for (i, hook) in self.hooks.iter().enumerate() {
            hooks::hook_rules(i, hook)?;
        }
        hooks::guardian(&self.guardian)?;
        mcp::mcp(&self.mcp)?;
        for (i, l) in self.limits.iter().enumerate() {
            endpoints::limit_rules(i, l)?;
        }
        endpoints::workspace(&self.workspace, &self.worker)?;
        endpoints::providers(&self.providers)?;
        webhooks::webhooks(&self.webhooks)?;
        retention::retention(&self.retention, &self.workspace)?;
        schedules::schedules(&self.schedules)?;
        policy::prices(&self.prices)?;
        policy::budgets(&self.budgets)?;
        for (key, addr) in [
            ("api_addr", &self.api_addr),
            ("metrics_addr", &self.metrics_addr),
            ("api_url", &self.api_url),
        ] {
            if addr.trim().is_empty() {
                return Err(rules::invalid(key, "must not be empty"));
            }
        }
        Ok(())
    }
}
