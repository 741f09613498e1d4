//! A session's files: those a request brings in (`files` of `CreateSession`) and
//! those its tree's workspace holds (`GET /v1/sessions/{id}/files`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use agentq_types::workspace::FileEntry;

/// One file of a request's `files`, keyed by its path: text as a JSON string, anything
/// else (bytes that are not UTF-8, or hold NUL) as `{"base64": "…"}` (standard alphabet,
/// padded; white space is ignored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum FileContent {
    Text(String),
    Base64 { base64: String },
}

/// `GET /v1/sessions/{id}/files`: every committed file of the session's tree, sorted by
/// path (with `?format=tar`, a tar of them instead). A sub-agent shares its tree's
/// workspace, so it answers the same list as its root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FileList {
    pub files: Vec<FileEntry>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn contents_and_lists() {
        let t: FileContent = serde_json::from_value(json!("hello")).unwrap();
        assert_eq!(t, FileContent::Text("hello".into()));
        let b: FileContent = serde_json::from_value(json!({"base64": "AAE="})).unwrap();
        assert_eq!(
            b,
            FileContent::Base64 {
                base64: "AAE=".into()
            }
        );
        assert_eq!(serde_json::to_value(&b).unwrap(), json!({"base64": "AAE="}));
        let wire = json!({"files": [{"path": "a/b.txt", "size": 3, "sha256": "ab",
                                     "modified_at_seq": 0}]});
        let l: FileList = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(l.files[0].path, "a/b.txt");
        assert_eq!(serde_json::to_value(&l).unwrap(), wire);
    }
}
