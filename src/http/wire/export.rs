//! Export jobs and observation statistics (docs/api.md §13, §17.8).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::present;
use crate::domain::export::{JobState, JobView};
use crate::domain::time;

/// Filters of a background export; query parameters of the same names win over the body. Values
/// may be strings, numbers or booleans; `form_type` (or `form_types`) also an array of strings.
#[derive(Deserialize, ToSchema)]
pub struct JobRequest {
    /// `parquet` (default), `json` or `csv`.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub format: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<String>>)]
    pub form_type: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<String>>)]
    pub form_types: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<i64>)]
    pub since_change_id: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<bool>)]
    pub include_deleted: Option<Value>,
}

/// An export job; `download_url` appears once it is done.
#[derive(Serialize, ToSchema)]
pub struct ExportJob {
    pub change_id: Option<i64>,
    #[schema(format = DateTime)]
    pub created_at: String,
    pub download_url: Option<String>,
    pub error: Option<String>,
    #[schema(format = DateTime)]
    pub expires_at: Option<String>,
    #[schema(format = DateTime)]
    pub finished_at: Option<String>,
    pub format: &'static str,
    pub job_id: String,
    pub owner: String,
    pub rows_done: u64,
    pub rows_total: Option<u64>,
    #[schema(format = DateTime)]
    pub started_at: Option<String>,
    /// `queued`, `running`, `done` or `failed`.
    pub state: &'static str,
}

impl From<&JobView> for ExportJob {
    fn from(job: &JobView) -> Self {
        ExportJob {
            change_id: job.change_id,
            created_at: time::format(job.created_at),
            download_url: (job.state == JobState::Done)
                .then(|| format!("/dataexport/jobs/{}/download", job.id)),
            error: job.error.clone(),
            expires_at: job.expires_at.map(time::format),
            finished_at: job.finished_at.map(time::format),
            format: job.format.as_str(),
            job_id: job.id.clone(),
            owner: job.owner.clone(),
            rows_done: job.rows_done,
            rows_total: job.rows_total,
            started_at: job.started_at.map(time::format),
            state: job.state.as_str(),
        }
    }
}

/// `GET /stats/observations`: totals by form type and a timeline.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservationStats {
    pub by_form_type: Vec<FormTypeCount>,
    #[schema(format = DateTime)]
    pub computed_at: Option<String>,
    pub timeline: Timeline,
    pub total_count: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FormTypeCount {
    pub count: i64,
    pub form_type: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timeline {
    /// `day` or `week`.
    pub bucket_unit: &'static str,
    pub buckets: Vec<Bucket>,
    #[schema(format = DateTime)]
    pub range_end: Option<String>,
    #[schema(format = DateTime)]
    pub range_start: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bucket {
    #[schema(format = DateTime)]
    pub bucket_start: String,
    pub count: i64,
    pub label: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::wire::tests::assert_map_order;

    #[test]
    fn fields_are_in_map_order() {
        assert_map_order(&ObservationStats {
            by_form_type: vec![FormTypeCount { count: 1, form_type: String::new() }],
            computed_at: None,
            timeline: Timeline {
                bucket_unit: "day",
                buckets: vec![Bucket { bucket_start: String::new(), count: 1, label: String::new() }],
                range_end: None,
                range_start: Some(String::new()),
            },
            total_count: 1,
        });
        assert_map_order(&ExportJob {
            change_id: None,
            created_at: String::new(),
            download_url: None,
            error: None,
            expires_at: None,
            finished_at: None,
            format: "csv",
            job_id: String::new(),
            owner: String::new(),
            rows_done: 0,
            rows_total: None,
            started_at: None,
            state: "queued",
        });
    }
}
