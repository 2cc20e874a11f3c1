//! `create_upload`: a presigned PUT, as `POST /v1/uploads` answers, or an
//! inline upload for agents that cannot PUT: the file in the call itself,
//! base64, stored by the server.

use std::time::Duration;

use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::adapters::mcp::context::McpContext;
use crate::adapters::mcp::failure::{ToolFailure, ToolResult};
use crate::adapters::mcp::tool::FixedTool;
use crate::adapters::mcp::{MAX_INLINE_BYTES, rfc3339};
use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::Catalog;
use crate::domain::uploads::{self, InlineFile, UploadRequest};

pub struct CreateUpload;

#[derive(Deserialize)]
pub struct CreateUploadArgs {
    filename: String,
    content_type: String,
    content_base64: Option<String>,
    size: Option<u64>,
}

impl FixedTool for CreateUpload {
    const NAME: &'static str = "create_upload";
    const READ_ONLY: bool = false;
    type Caller = SpaceIndex;
    type Args = CreateUploadArgs;

    fn description(catalog: &Catalog) -> String {
        let uploads = &catalog.uploads;
        format!(
            "Upload an input file. Either inline: content_base64 holds the file (at most {} bytes decoded), and it \
             is stored at once; or declare size and get a presigned URL to PUT the bytes to, sending exactly the \
             headers given (any size up to {} bytes). Answers an upload_id to name in a task's input. content_type \
             is one of: {}.",
            MAX_INLINE_BYTES.min(uploads.max_bytes as usize),
            uploads.max_bytes,
            uploads.content_types.join(", "),
        )
    }

    fn input_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "filename": { "type": "string", "minLength": 1, "maxLength": 255 },
                "content_type": { "type": "string" },
                "content_base64": { "type": "string",
                    "description": "The file itself, base64 (standard alphabet): an inline upload." },
                "size": { "type": "integer", "minimum": 1,
                    "description": "The exact size in bytes: a presigned upload (PUT the bytes yourself)." }
            },
            "required": ["filename", "content_type"],
            "additionalProperties": false
        })
    }

    fn output_schema() -> Value {
        let string = json!({ "type": "string" });
        json!({
            "type": "object",
            "properties": {
                "upload_id": string,
                "uploaded": { "type": "boolean", "description": "True for an inline upload: it is stored." },
                "size": { "type": "integer" },
                "url": string,
                "method": string,
                "headers": { "type": "object", "additionalProperties": { "type": "string" } },
                "expires_at": string
            },
            "required": ["upload_id", "uploaded", "size"]
        })
    }

    async fn call(ctx: &McpContext, space: SpaceIndex, args: CreateUploadArgs) -> ToolResult<Value> {
        let policy = &ctx.catalog.uploads;
        match (args.content_base64, args.size) {
            (Some(encoded), None) => {
                let bytes = decode(&encoded)?;
                let size = bytes.len();
                let file = InlineFile { filename: args.filename, content_type: args.content_type, bytes: bytes.into() };
                let id = uploads::store(&ctx.db, &ctx.aws.objects, &ctx.bucket, policy, &space, file).await?;
                Ok(json!({ "upload_id": id, "uploaded": true, "size": size }))
            }
            (None, Some(size)) => {
                let request = UploadRequest { filename: Some(args.filename), content_type: args.content_type, size };
                let expires_in = Duration::from_secs(policy.url_expiry_seconds.into());
                let presigned =
                    uploads::create(&ctx.db, &ctx.aws.objects, &ctx.bucket, policy, &space, request, expires_in)
                        .await?;
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
