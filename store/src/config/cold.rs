//! The `[cold]` table: the archive's object store, and where it is.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::secret;
use crate::error::StoreError;

/// The `[cold]` table: where Parquet archives go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ColdConfig {
    /// `s3://bucket/prefix/` or `file:///absolute/dir/`. Default: "file:///var/lib/inferlog/cold/".
    pub url: String,
    /// S3 endpoint for S3-compatible servers (MinIO, SeaweedFS, Garage, Ceph); empty means AWS. Default: "".
    pub endpoint: String,
    /// S3 region. Default: "us-east-1".
    pub region: String,
    /// Allow plain-HTTP endpoints (a loopback test server). Default: false.
    pub allow_http: bool,
    /// S3 access key id; AWS_ACCESS_KEY_ID takes precedence. Default: none.
    pub access_key_id: Option<String>,
    /// File holding the S3 secret key; AWS_SECRET_ACCESS_KEY takes precedence. Default: none.
    pub secret_access_key_file: Option<PathBuf>,
    /// Rows per Parquet row group: the unit a scan reads or skips. Default: 262144.
    pub row_group_rows: usize,
    /// Rows per object; a larger day is split into `part-NNNN` objects. Default: 4000000.
    pub object_max_rows: u64,
    /// ZSTD level of the Parquet pages (1-22); on generated days level 1 was both faster and smaller than 3. Default: 1.
    pub zstd_level: i32,
    /// Parts of a multipart upload sent at once. Default: 4.
    pub upload_concurrency: usize,
    /// Sign each S3 request's body (SigV4 payload hash). Off, the body is sent
    /// as UNSIGNED-PAYLOAD, which S3 accepts: every object is read back and
    /// checked against its SHA-256 before a day may leave the hot tier, which
    /// covers what signing the payload would, without a second hash pass
    /// over every byte written. Default: false.
    pub sign_payload: bool,
}

impl Default for ColdConfig {
    fn default() -> Self {
        ColdConfig {
            url: "file:///var/lib/inferlog/cold/".into(),
            endpoint: String::new(),
            region: "us-east-1".into(),
            allow_http: false,
            access_key_id: None,
            secret_access_key_file: None,
            row_group_rows: 262_144,
            object_max_rows: 4_000_000,
            zstd_level: 1,
            upload_concurrency: 4,
            sign_payload: false,
        }
    }
}

impl ColdConfig {
    /// The S3 secret key from AWS_SECRET_ACCESS_KEY, else `secret_access_key_file`.
    pub fn secret_access_key(&self) -> Result<Option<String>, StoreError> {
        secret("AWS_SECRET_ACCESS_KEY", self.secret_access_key_file.as_ref(), "cold.secret_access_key_file")
    }

    pub fn validate(&self) -> Result<(), StoreError> {
        ColdLocation::parse(&self.url)?;
        if !(1024..=16_777_216).contains(&self.row_group_rows) {
            return Err(StoreError::Config("cold.row_group_rows must be 1024..=16777216".into()));
        }
        if self.object_max_rows < self.row_group_rows as u64 {
            return Err(StoreError::Config("cold.object_max_rows must be at least cold.row_group_rows".into()));
        }
        if !(1..=22).contains(&self.zstd_level) || self.upload_concurrency == 0 {
            return Err(StoreError::Config("cold.zstd_level must be 1..=22 and cold.upload_concurrency > 0".into()));
        }
        Ok(())
    }
}

/// Where the archive lives, parsed from `cold.url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColdLocation {
    S3 { bucket: String, prefix: String },
    Local { dir: std::path::PathBuf },
}

impl ColdLocation {
    pub fn parse(url: &str) -> Result<ColdLocation, StoreError> {
        let parsed = url::Url::parse(url).map_err(|e| StoreError::Config(format!("cold.url {url:?}: {e}")))?;
        match parsed.scheme() {
            "s3" => {
                let bucket = parsed.host_str().unwrap_or_default().to_owned();
                if bucket.is_empty() {
                    return Err(StoreError::Config(format!("cold.url {url:?}: no bucket")));
                }
                let prefix = parsed.path().trim_matches('/').to_owned();
                Ok(ColdLocation::S3 { bucket, prefix })
            }
            "file" => {
                let dir = parsed.to_file_path().map_err(|()| StoreError::Config(format!("cold.url {url:?}: not an absolute file path")))?;
                Ok(ColdLocation::Local { dir })
            }
            other => Err(StoreError::Config(format!("cold.url {url:?}: scheme {other} is not s3 or file"))),
        }
    }
}
