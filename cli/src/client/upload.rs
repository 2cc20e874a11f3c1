//! `reeve upload`: a file through a presigned S3 PUT, with a progress bar;
//! `reeve task create --file` uploads through [`upload_file`] too.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use reqwest::Method;
use serde_json::{Value, json};

use super::output::{self, bar};
use super::{Client, ClientError, ClientOpts};

#[derive(Args, Debug)]
pub struct UploadArgs {
    /// The file to upload.
    pub file: PathBuf,
    /// Its content type (default: guessed from the extension).
    #[arg(long)]
    pub content_type: Option<String>,
}

/// The content type a file is uploaded as, from its extension.
fn guess_content_type(path: &Path) -> &'static str {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("txt" | "md" | "csv" | "log") => "text/plain",
        Some("json") => "application/json",
        Some("pdf") => "application/pdf",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        _ => "application/octet-stream",
    }
}

/// Presigns, PUTs the file with a progress bar, and answers its upload id.
pub(super) async fn upload_file(
    client: &mut Client,
    path: &Path,
    content_type: Option<&str>,
    quiet: bool,
) -> Result<Value, ClientError> {
    let local = |e: std::io::Error| ClientError::Usage(format!("cannot read {}: {e}", path.display()));
    let meta = std::fs::metadata(path).map_err(local)?;
    if !meta.is_file() {
        return Err(ClientError::Usage(format!("{} is not a file", path.display())));
    }
    let size = meta.len();
    let filename = path.file_name().and_then(|n| n.to_str()).unwrap_or("upload").to_owned();
    let content_type = content_type.unwrap_or_else(|| guess_content_type(path)).to_owned();
    let body = json!({ "filename": filename, "content_type": content_type, "size": size });
    let presigned = client.authed(Method::POST, "/v1/uploads", Some(&body), &[]).await?.body;
    let url = presigned["url"].as_str().unwrap_or_default().to_owned();

    let file = std::fs::File::open(path).map_err(local)?;
    let progress = bar(size, quiet);
    progress.set_message(filename.clone());
    let chunks = futures_util::stream::unfold((file, progress.clone()), |(mut file, progress)| async move {
        use std::io::Read;
        let mut buf = vec![0u8; 256 * 1024];
        match file.read(&mut buf) {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                progress.inc(n as u64);
                Some((Ok::<_, std::io::Error>(buf), (file, progress)))
            }
            Err(e) => Some((Err(e), (file, progress))),
        }
    });
    // The URL is signed for these exact headers, the length included.
    let mut put = client.http.put(&url).header("content-length", size).body(reqwest::Body::wrap_stream(chunks));
    for (name, value) in presigned["headers"].as_object().cloned().unwrap_or_default() {
        if !name.eq_ignore_ascii_case("content-length") {
            put = put.header(name, value.as_str().unwrap_or_default());
        }
    }
    let response = put.send().await.map_err(|e| ClientError::Unreachable {
        endpoint: url.split('?').next().unwrap_or_default().to_owned(),
        cause: e.to_string(),
    })?;
    if !response.status().is_success() {
        progress.abandon();
        let status = response.status().as_u16();
        let text: String = response.text().await.unwrap_or_default().chars().take(300).collect();
        return Err(ClientError::Refused { status, code: "upload_failed".into(), message: text });
    }
    progress.finish_and_clear();
    Ok(json!({
        "upload_id": presigned["upload_id"],
        "filename": filename,
        "content_type": content_type,
        "size": size,
    }))
}

pub async fn upload(client: &mut Client, opts: &ClientOpts, args: UploadArgs) -> Result<ExitCode, ClientError> {
    let uploaded = upload_file(client, &args.file, args.content_type.as_deref(), opts.json).await?;
    if opts.json {
        output::json(&uploaded);
    } else {
        println!("{}", uploaded["upload_id"].as_str().unwrap_or_default());
    }
    Ok(ExitCode::SUCCESS)
}
