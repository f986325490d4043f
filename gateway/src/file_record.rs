//! A file's record in the gateway bucket (`file.<id>`): what the File
//! object shows, and when the file expires.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::records;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileRecord {
    pub id: String,
    pub tenant: String,
    pub filename: String,
    /// `batch` (uploaded), `batch_output` (a batch's output or error file).
    pub purpose: String,
    pub bytes: u64,
    pub created_at: i64,
    /// When it answers 404 and is removed (`lifecycle`); None: kept until
    /// deleted (files recorded before expiry existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
}

impl FileRecord {
    pub fn key(id: &str) -> String {
        format!("file.{id}")
    }

    /// The File object as OpenAI returns it.
    pub fn to_api(&self) -> Value {
        json!({
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": null,
        })
    }

    /// Whether it has expired at `at` (it answers 404 from then on).
    pub fn expired(&self, at: i64) -> bool {
        self.expires_at.is_some_and(|t| t <= at)
    }
}

pub fn new_file_id() -> String {
    format!("file-{}", uuid::Uuid::now_v7().simple())
}

impl records::Owned for FileRecord {
    const KIND: &'static str = "file";
    fn key(id: &str) -> String {
        FileRecord::key(id)
    }
    fn tenant(&self) -> &str {
        &self.tenant
    }
}
