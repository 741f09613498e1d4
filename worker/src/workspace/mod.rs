//! A tree's durable workspace on this worker: its local directory
//! (`workspace_root/<root_id>`) is only a cache of the tree's committed manifest. On claim
//! the directory is made to match the manifest ([`materialise`]: fetch what is missing or
//! different, delete what the manifest does not hold, so a change whose commit never
//! happened is undone); at each checkpoint the changes made since the last one are found
//! ([`TreeSync::collect`]: the paths the file tools wrote, and after a `shell` command a
//! rescan of the whole tree), their blobs uploaded, and they ride on that checkpoint.
//!
//! A local index beside the directory (`workspace_root/.index/<root_id>.json`) records
//! each file's size, modification time and hash as last committed or materialised, so a
//! warm cache is checked by `stat` alone and a rescan hashes only the files whose size or
//! time changed.
//!
//! Sessions of one tree share its workspace. On one worker they share the directory (a
//! claim does not rebuild a directory another session of the tree is using here); on two
//! workers each claim starts from the latest committed manifest, a running session brings
//! in what the others committed when a sub-agent's result reaches it
//! ([`TreeSync::refresh`], which leaves uncommitted local changes alone), and each commit
//! replaces the paths it changed: the last writer of a path wins.
//!
//! One file per part: `index` (the local index and the process's cache of each tree),
//! `materialise` (the directory made to match the manifest), `fetch` (committed contents
//! placed on disk), `refresh` (others' commits brought in), `changes` (what changed since
//! the last commit), `upload` (the contents a commit needs), `sync` (a session's side of
//! it all), `disk` (the filesystem work they share), `error`.

mod changes;
mod disk;
mod error;
mod fetch;
mod index;
mod materialise;
mod refresh;
mod sync;
mod upload;

pub use error::Error;
pub use index::TreeCache;
pub use materialise::{Materialised, materialise};
pub use refresh::Refreshed;
pub use sync::{Pending, TreeSync};
