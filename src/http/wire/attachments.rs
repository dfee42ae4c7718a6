//! Attachment bodies (docs/api.md §10, §17.7).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{present, Text};
use crate::actors::change_log::AttachmentCommit;
use crate::db::attachments::AttachmentRow;
use crate::domain::time;

/// `POST /attachments`: the file in the part `file` (or the only part with a filename); the id
/// from `attachment_id`, else from that filename.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct AttachmentUpload {
    #[schema(value_type = String, format = Binary)]
    file: Vec<u8>,
    attachment_id: Option<String>,
}

/// What an upload stored; `created` is false when the same bytes were already there (a retry).
#[derive(Serialize, ToSchema)]
pub struct UploadAnswer {
    pub attachment_id: String,
    pub change_id: i64,
    pub content_type: String,
    pub created: bool,
    #[schema(format = DateTime)]
    pub created_at: String,
    pub repository_generation: i64,
    pub sha256: String,
    pub size: i64,
    pub status: &'static str,
}

impl UploadAnswer {
    pub fn new(commit: &AttachmentCommit, repository_generation: i64) -> Self {
        let row = &commit.row;
        UploadAnswer {
            attachment_id: row.id.clone(),
            change_id: row.change_id,
            content_type: row.content_type.clone(),
            created: commit.created,
            created_at: time::format(row.created_at),
            repository_generation,
            sha256: row.sha256.clone(),
            size: row.size,
            status: "success",
        }
    }
}

/// `GET /attachments/manifest`: uploads after the cursor, in change order.
#[derive(Serialize, ToSchema)]
pub struct Manifest {
    pub change_cutoff: i64,
    pub operations: Vec<ManifestOperation>,
    pub repository_generation: i64,
}

#[derive(Serialize, ToSchema)]
pub struct ManifestOperation {
    pub attachment_id: String,
    pub change_id: i64,
    /// Absent for a `delete` (an attachment deleted on the Go server before an import, §19.2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// `upload`, or `delete`.
    pub operation: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
}

impl From<&AttachmentRow> for ManifestOperation {
    fn from(r: &AttachmentRow) -> Self {
        ManifestOperation {
            attachment_id: r.id.clone(),
            change_id: r.change_id,
            content_type: (!r.deleted).then(|| r.content_type.clone()),
            operation: if r.deleted { "delete" } else { "upload" },
            size: (!r.deleted).then_some(r.size),
        }
    }
}

/// `POST /attachments/manifest` (the Synkronus 1.0 shape). `client_id` is required in one of
/// its spellings; `since_version` (or `sinceVersion`) is a change_id >= 0, default 0.
#[derive(Deserialize, ToSchema)]
pub struct ManifestRequest {
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub client_id: Text,
    #[serde(default, rename = "clientId")]
    #[schema(value_type = Option<String>)]
    pub client_id_camel: Text,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<i64>)]
    pub since_version: Option<Value>,
    #[serde(default, rename = "sinceVersion", deserialize_with = "present")]
    #[schema(value_type = Option<i64>)]
    pub since_version_camel: Option<Value>,
}

/// The Synkronus 1.0 manifest Formulus reads: downloads with absolute URLs.
#[derive(Serialize, ToSchema)]
pub struct DownloadManifest {
    pub current_version: i64,
    pub operation_count: OperationCount,
    pub operations: Vec<DownloadOperation>,
    pub repository_generation: i64,
    pub total_download_size: i64,
}

#[derive(Serialize, ToSchema)]
pub struct OperationCount {
    pub delete: usize,
    pub download: usize,
}

/// A `download`, or a `delete` (an attachment deleted on the Go server before an import,
/// docs/api.md §19.2), which carries no URL, size or type, as the Go server sends it.
#[derive(Serialize, ToSchema)]
pub struct DownloadOperation {
    pub attachment_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub download_url: Option<String>,
    pub operation: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    pub version: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::wire::tests::assert_map_order;

    #[test]
    fn fields_are_in_map_order() {
        let row = AttachmentRow {
            id: "a".into(),
            sha256: "h".into(),
            size: 1,
            content_type: "image/png".into(),
            uploaded_by: "u".into(),
            client_id: None,
            created_at: chrono::Utc::now(),
            change_id: 3,
            deleted: false,
        };
        assert_map_order(&UploadAnswer::new(&AttachmentCommit { row: row.clone(), created: true }, 1));
        assert_map_order(&Manifest {
            change_cutoff: 1,
            operations: vec![ManifestOperation::from(&row)],
            repository_generation: 1,
        });
        assert_map_order(&DownloadManifest {
            current_version: 1,
            operation_count: OperationCount { delete: 0, download: 1 },
            operations: vec![DownloadOperation {
                attachment_id: String::new(),
                content_type: Some(String::new()),
                download_url: Some(String::new()),
                operation: "download",
                size: Some(1),
                version: 1,
            }],
            repository_generation: 1,
            total_download_size: 1,
        });
    }
}
