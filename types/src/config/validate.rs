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
    /// Every rule the settings must follow, checked once after all the layers; the error
    /// names the setting with its variable and flag.
    pub fn validate(&self) -> Result<()> {
        process::worker_timings(&self.worker)?;
        process::worker_limits(&self.worker)?;
        process::scheduler(&self.scheduler)?;
        process::scheduling(&self.scheduling)?;
        process::redis(&self.redis, self.redis_url.as_deref())?;
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
