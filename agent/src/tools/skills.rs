//! Skills: folders the operator provides, each a `SKILL.md` (a `name` and a `description`
//! in its front matter, then instructions) beside the files those instructions use. The
//! [`SkillLibrary`] indexes them once, at the process's start; the `load_skill` tool lists
//! every skill's name and description in its own description (so a session that may use
//! it sees them without a call) and reads a skill's instructions, or one of its files, on
//! demand, under the file tools' path rules (nothing outside the skill's folder, symlinks
//! included) and read limit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::fs::{Args, is_binary};
use super::workspace::{LocalWorkspace, Workspace};
use super::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};

/// The tool's name, which the policy's `tools` allows like any other.
pub const NAME: &str = "load_skill";
/// Most skills one library holds: their list is part of every request's tool list.
pub const MAX_SKILLS: usize = 100;
/// Longest description, in bytes.
pub const MAX_DESCRIPTION: usize = 1024;
/// Longest name, in bytes (`[a-z0-9-]`).
pub const MAX_NAME: usize = 64;
/// Bytes of a `SKILL.md` read to find its front matter.
const FRONT_MATTER_MAX: usize = 16 * 1024;
/// Files of one skill listed at most (a walk past it says the list is incomplete).
const MAX_LISTED: usize = 200;

/// One skill: its name and description, and its folder (canonical).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub dir: PathBuf,
}

/// The skills of a process, by name.
#[derive(Debug, Clone, Default)]
pub struct SkillLibrary {
    skills: BTreeMap<String, Skill>,
}

impl SkillLibrary {
    /// Every folder holding a `SKILL.md` directly under each of `dirs`. A skill that
    /// cannot be read or whose front matter is wrong is an error naming its file: an
    /// operator's typo should stop the start, not hide a skill.
    pub fn load(dirs: &[PathBuf]) -> Result<Self, String> {
        let mut skills = BTreeMap::new();
        for dir in dirs {
            let entries = std::fs::read_dir(dir)
                .map_err(|e| format!("skills folder {}: {e}", dir.display()))?;
            let mut folders: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.join("SKILL.md").is_file())
                .collect();
            folders.sort();
            for folder in folders {
                let skill = read_skill(&folder)?;
                if let Some(seen) = skills.get(&skill.name) {
                    let seen: &Skill = seen;
                    return Err(format!(
                        "skill `{}` is defined twice: {} and {}",
                        skill.name,
                        seen.dir.display(),
                        skill.dir.display()
                    ));
                }
                skills.insert(skill.name.clone(), skill);
                if skills.len() > MAX_SKILLS {
                    return Err(format!(
                        "more than {MAX_SKILLS} skills under {}",
                        dir.display()
                    ));
                }
            }
        }
        Ok(SkillLibrary { skills })
    }

    pub fn is_empty(&self) -> bool {
        self.skills.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&Skill> {
        self.skills.get(name)
    }

    pub fn names(&self) -> Vec<&str> {
        self.skills.keys().map(String::as_str).collect()
    }
}

/// The skill in `folder`, from its `SKILL.md`'s front matter.
fn read_skill(folder: &Path) -> Result<Skill, String> {
    let file = folder.join("SKILL.md");
    let at = || file.display().to_string();
    let dir = std::fs::canonicalize(folder).map_err(|e| format!("{}: {e}", at()))?;
    let mut head = Vec::new();
    {
        use std::io::Read;
        let f = std::fs::File::open(&file).map_err(|e| format!("{}: {e}", at()))?;
        f.take(FRONT_MATTER_MAX as u64)
            .read_to_end(&mut head)
            .map_err(|e| format!("{}: {e}", at()))?;
    }
    let text = String::from_utf8_lossy(&head);
    let (name, description) = front_matter(&text).map_err(|e| format!("{}: {e}", at()))?;
    Ok(Skill {
        name,
        description,
        dir,
    })
}

/// `name` and `description` from the `---` block that opens a `SKILL.md`.
pub fn front_matter(text: &str) -> Result<(String, String), String> {
    let mut lines = text.lines();
    if lines.next().map(str::trim_end) != Some("---") {
        return Err("does not start with a `---` front matter block".into());
    }
    let (mut name, mut description) = (None, None);
    let mut closed = false;
    for line in lines {
        let line = line.trim_end();
        if line == "---" {
            closed = true;
            break;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim().trim_matches('"').to_string();
        match key.trim() {
            "name" => name = Some(value),
            "description" => description = Some(value),
            _ => {}
        }
    }
    if !closed {
        return Err("its front matter has no closing `---`".into());
    }
    let name = name.ok_or("its front matter has no `name`")?;
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !valid {
        return Err(format!(
            "name `{name}` must be 1 to {MAX_NAME} of a-z, 0-9 and -"
        ));
    }
    let description = description.ok_or("its front matter has no `description`")?;
    if description.is_empty() || description.len() > MAX_DESCRIPTION {
        return Err(format!("description must be 1 to {MAX_DESCRIPTION} bytes"));
    }
    Ok((name, description))
}

/// The `load_skill` tool over a library.
pub struct LoadSkill {
    library: Arc<SkillLibrary>,
    description: String,
}

impl LoadSkill {
    pub fn new(library: Arc<SkillLibrary>) -> Self {
        let mut description = String::from(
            "Load a skill: its instructions (SKILL.md) and the list of its files. Pass \
             `file` to read one of those files. Load a skill when its description fits \
             the task, and follow its instructions.\n\nSkills:",
        );
        for s in library.skills.values() {
            description.push_str(&format!("\n- {}: {}", s.name, s.description));
        }
        LoadSkill {
            library,
            description,
        }
    }
}

#[async_trait]
impl Tool for LoadSkill {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": self.library.names(), "description": "The skill."},
                "file": {"type": "string", "description": "A file of the skill, as its listing names it. Leave out for the instructions."}
            },
            "required": ["name"],
            "additionalProperties": false
        })
    }

    /// Only reads the operator's folders.
    fn side_effect(&self, _args: &Value) -> SideEffect {
        SideEffect::Pure
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let a = Args::parse(&args, &["name", "file"])?;
        let name = a.str("name")?;
        let skill = self.library.get(name).ok_or_else(|| {
            ToolError::InvalidArguments(format!(
                "field `name`: no skill `{name}` (skills: {})",
                self.library.names().join(", ")
            ))
        })?;
        // The skill's folder under the same rules as a workspace: a path that leaves it,
        // through `..` or a symlink, is refused.
        let folder = LocalWorkspace::new(&skill.dir)
            .map_err(|e| ToolError::Failed(format!("skill `{name}` cannot be read: {e}")))?;
        let cap = ctx.settings.read_max_bytes;
        match a.opt_str("file")? {
            None => {
                let text = read_text(&folder, "SKILL.md", cap).await?;
                let listing = folder.walk("", MAX_LISTED).await?;
                let mut out = text;
                out.push_str(&format!(
                    "\n\nFiles of skill `{name}` (read one with `load_skill` and `file`):"
                ));
                for f in listing.files.iter().filter(|f| f.as_str() != "SKILL.md") {
                    out.push_str(&format!("\n- {f}"));
                }
                if listing.truncated {
                    out.push_str(&format!("\n(the first {MAX_LISTED} only)"));
                }
                Ok(ToolOutput::ok(out))
            }
            Some(file) => Ok(ToolOutput::ok(read_text(&folder, file, cap).await?)),
        }
    }
}

/// A text file of the folder, at most `cap` bytes (said when cut); a binary file is
/// refused, as `read_file` does.
async fn read_text(folder: &LocalWorkspace, path: &str, cap: usize) -> Result<String, ToolError> {
    let mut data = folder.read(path, cap.saturating_add(1)).await?;
    let cut = data.len() > cap;
    data.truncate(cap);
    if is_binary(&data) {
        return Err(ToolError::Failed(format!(
            "{path} is a binary file; load_skill reads text only"
        )));
    }
    let mut text = String::from_utf8_lossy(&data).into_owned();
    if cut {
        text.push_str(&format!("\n[cut at {cap} bytes]"));
    }
    Ok(text)
}
