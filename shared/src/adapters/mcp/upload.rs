//! `create_upload`: a presigned PUT, as `POST /v1/uploads` answers, or an
//! inline upload for agents that cannot PUT: the file in the call itself,
//! base64, stored by the server.

use std::time::Duration;

use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use super::context::McpContext;
use super::failure::{ToolFailure, ToolResult};
use super::{MAX_INLINE_BYTES, rfc3339};
use crate::domain::auth::SpaceIndex;
use crate::domain::uploads::{self, InlineFile, UploadRequest};

#[derive(Deserialize)]
pub struct CreateUpload {
    filename: String,
    content_type: String,
    content_base64: Option<String>,
    size: Option<u64>,
}

pub async fn create(ctx: &McpContext, space: &SpaceIndex, args: CreateUpload) -> ToolResult<Value> {
    let policy = &ctx.catalog.uploads;
    match (args.content_base64, args.size) {
        (Some(encoded), None) => {
            let bytes = decode(&encoded)?;
            let size = bytes.len();
            let file = InlineFile { filename: args.filename, content_type: args.content_type, bytes: bytes.into() };
            let id = uploads::store(&ctx.db, &ctx.aws.s3, &ctx.bucket, policy, space, file).await?;
            Ok(json!({ "upload_id": id, "uploaded": true, "size": size }))
        }
        (None, Some(size)) => {
            let request = UploadRequest { filename: Some(args.filename), content_type: args.content_type, size };
            let expires_in = Duration::from_secs(policy.url_expiry_seconds.into());
            let presigned =
                uploads::create(&ctx.db, &ctx.aws.s3, &ctx.bucket, policy, space, request, expires_in).await?;
            Ok(json!({
                "upload_id": presigned.id,
                "uploaded": false,
                "size": size,
                "url": presigned.url,
                "method": presigned.method,
                "headers": presigned.headers,
                "expires_at": rfc3339(presigned.expires_at),
            }))
        }
        _ => Err(ToolFailure::new(
            "invalid_arguments",
            "create_upload takes exactly one of content_base64 (an inline upload) and size (a presigned PUT)",
        )),
    }
}

/// The inline file, refused past [`MAX_INLINE_BYTES`] before it is decoded
/// (base64 is 4/3 the size of what it encodes).
fn decode(encoded: &str) -> ToolResult<Vec<u8>> {
    let too_large = || {
        ToolFailure::new(
            "upload_too_large",
            format!(
                "an inline upload is at most {MAX_INLINE_BYTES} bytes; declare `size` instead for a presigned URL \
                 to PUT a larger file to"
            ),
        )
    };
    let encoded = encoded.trim();
    if encoded.len() > MAX_INLINE_BYTES.div_ceil(3) * 4 {
        return Err(too_large());
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| ToolFailure::new("invalid_base64", "content_base64 is not base64 (standard alphabet)"))?;
    if bytes.len() > MAX_INLINE_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}
