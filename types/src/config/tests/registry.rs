//! The registry of settings against the fields of the tree and `agentq.example.toml`.

use std::collections::BTreeSet;

use crate::config::*;

/// The dotted keys of every field of the settings (secrets are never serialised).
fn keys(v: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    let serde_json::Value::Object(map) = v else {
        return;
    };
    for (k, v) in map {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if v.is_object() {
            keys(v, &key, out);
        } else {
            out.insert(key);
        }
    }
}

const EXAMPLE: &str = include_str!("../../../../agentq.example.toml");

/// `agentq.example.toml` at the repository root lists every setting (the ones whose
/// default is "unset" as a commented line), and what it sets is exactly the defaults.
#[test]
fn the_example_file_is_every_setting_at_its_default() {
    let example = Settings::from_toml(EXAMPLE).unwrap();
    assert_eq!(example, Settings::default());

    let mut fields = BTreeSet::new();
    keys(
        &serde_json::to_value(Settings::default()).unwrap(),
        "",
        &mut fields,
    );
    let registry: BTreeSet<String> = SETTINGS.iter().map(|s| s.key.to_string()).collect();
    assert_eq!(fields, registry, "SETTINGS must name every field");

    // Uncomment the `# key = value` lines: that file must still parse (no misspelt key)
    // and then hold every setting.
    let mut section = String::new();
    let mut listed = BTreeSet::new();
    let mut uncommented = String::new();
    for line in EXAMPLE.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
            section = name.to_string();
            uncommented.push_str(line);
        } else if let Some((k, _)) = t.trim_start_matches("# ").split_once(" = ")
            && !k.contains(' ')
        {
            listed.insert(if section.is_empty() {
                k.to_string()
            } else {
                format!("{section}.{k}")
            });
            uncommented.push_str(t.trim_start_matches("# "));
        }
        uncommented.push('\n');
    }
    assert_eq!(
        listed, registry,
        "agentq.example.toml must list every setting"
    );
    let all = Settings::from_toml(&uncommented).unwrap();
    let mut set = BTreeSet::new();
    keys(&serde_json::to_value(&all).unwrap(), "", &mut set);
    assert_eq!(set, registry);
    all.validate().unwrap();
}
