//! What the API does to one session, shared by the REST routes (`routes/`) and the MCP
//! tools (`routes/mcp/`): each function takes the caller, makes every check the REST
//! route makes (the caller's tenant only, another tenant's session the same 404 as a
//! missing one), and answers the API type; a route wraps the answer in HTTP, a tool in a
//! tool result. The scope a caller needs is checked before, by the auth layer for a route
//! and by the tool for `/mcp`.

mod approval_list;
mod approvals;
mod create;
mod files;
mod read;

pub(crate) use approval_list::{ApprovalQuery, list_approvals};
pub(crate) use approvals::{decide_approval, pending_approvals};
pub(crate) use create::{
    Created, check_repeat, create_session, enqueue, known_queues, limits, new_session, request_hash,
};
pub(crate) use files::{ANY_PATH, FileRead, list_files, read_file};
pub(crate) use read::{cancel_session, detail_of, session_detail};
