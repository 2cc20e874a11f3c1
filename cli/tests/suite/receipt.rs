//! `reeve receipt verify`, offline: a receipt the seller's key signed is
//! accepted with the files it names; one byte changed, another key's
//! signature, or a file it does not name is refused (exit 3), each saying
//! why.

use std::path::Path;
use std::process::{Command, Output};

use reeve_shared::payments::offer_receipt::{
    DeliveredFile, Delivery, ReceiptPayload, SellerKey, Signed, result_sha256, sha256_json,
};
use serde_json::json;
use sha2::Digest;

use crate::common::DEV_RECEIPT_KEY;

fn verify(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_reeve"))
        .current_dir(std::env::temp_dir())
        // Offline: no deployment to reach.
        .env("REEVE_ENDPOINT", "http://127.0.0.1:1")
        .args(["receipt", "verify"])
        .args(args)
        .output()
        .expect("reeve runs")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.display().to_string()
}

fn receipt_of(output: &[u8], result: &serde_json::Value) -> ReceiptPayload {
    ReceiptPayload {
        version: 1,
        network: "eip155:84532".into(),
        resource_url: "http://127.0.0.1:8080/v1/tasks/wordfreq".into(),
        payer: "0x857b06519e91e3a54538791bdbb0e22373e36b66".into(),
        issued_at: 1_765_000_000,
        transaction: format!("0x{}", "ab".repeat(32)),
        task: "01HZX3Y4P5Q6R7S8T9V0W1X2Y3".into(),
        kind: "wordfreq".into(),
        input_sha256: sha256_json(&json!({"text": "a b a"})),
        scheme: "exact".into(),
        asset: "0x036CbD53842c5426634e7929541eC2318f3dCF7e".into(),
        pay_to: "0x209693Bc6afc0C5328bA36FaF03C514EF312287C".into(),
        amount: "10000".into(),
        metered: None,
        credit: None,
        voucher: None,
        delivery: Some(Delivery {
            status: "completed".into(),
            result_sha256: Some(result_sha256(result)),
            outputs: vec![DeliveredFile {
                name: "counts.csv".into(),
                size: output.len() as u64,
                sha256: hex::encode(sha2::Sha256::digest(output)),
            }],
        }),
    }
}

#[tokio::test]
async fn a_receipt_verifies_offline_and_a_changed_one_is_refused() {
    let dir = std::env::temp_dir().join(format!("reeve-receipt-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = b"word,count\na,2\nb,1\n";
    let result = json!({"outputs": [{"name": "counts.csv", "size": csv.len(), "key": "k"}], "words": 3});
    let key = SellerKey::from_hex(DEV_RECEIPT_KEY).unwrap();
    let signer = key.address().to_checksum(None);
    let signed = key.sign(&receipt_of(csv, &result)).await.unwrap();
    let file = write(&dir, "receipt.json", serde_json::to_string(&signed).unwrap().as_bytes());
    let output = write(&dir, "counts.csv", csv);
    // The task as the API shows it, download links and all.
    let mut shown = result.clone();
    shown["outputs"][0]["url"] = json!("https://bucket.example/counts.csv?X-Amz-Signature=1");
    let task = write(&dir, "task.json", json!({"id": "x", "result": shown}).to_string().as_bytes());
    let input = write(&dir, "input.json", br#"{"text": "a b a"}"#);

    let out = verify(&[&file, "--signer", &signer, "--output", &output, "--result", &task, "--input", &input]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("receipt verified"), "{}", text(&out));
    assert!(text(&out).contains(&format!("counts.csv  sha256 {}", hex::encode(sha2::Sha256::digest(csv)))));
    // As a settlement response carries it, and with --json.
    let settlement = json!({"success": true, "extensions": {"offer-receipt": {"info": {"receipt": signed}}}});
    let wrapped = write(&dir, "settlement.json", settlement.to_string().as_bytes());
    let out = verify(&[&wrapped, "--signer", &signer, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((shown["verified"].as_bool(), shown["signer"].as_str()), (Some(true), Some(signer.as_str())));

    // One byte of the signed payload changed.
    let parts: Vec<&str> = signed.signature.split('.').collect();
    let mut payload = base64_decode(parts[1]);
    let at = payload.windows(7).position(|w| w == b"\"10000\"").unwrap() + 1;
    payload[at] = b'9';
    let changed =
        Signed { signature: format!("{}.{}.{}", parts[0], base64_encode(&payload), parts[2]), ..signed.clone() };
    let changed = write(&dir, "changed.json", serde_json::to_string(&changed).unwrap().as_bytes());
    let out = verify(&[&changed, "--signer", &signer]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("the signature does not match"), "{}", text(&out));

    // Signed by another key.
    let other = SellerKey::from_hex(&"42".repeat(32)).unwrap().sign(&receipt_of(csv, &result)).await.unwrap();
    let other = write(&dir, "other.json", serde_json::to_string(&other).unwrap().as_bytes());
    let out = verify(&[&other, "--signer", &signer]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("not by the published signer"), "{}", text(&out));

    // A file it does not name, a result it does not sign.
    let wrong = write(&dir, "wrong.csv", b"word,count\na,3\n");
    let out = verify(&[&file, "--signer", &signer, "--output", &wrong]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("is not a file the receipt says was delivered"), "{}", text(&out));
    let other_result = write(&dir, "result.json", br#"{"words": 4}"#);
    let out = verify(&[&file, "--signer", &signer, "--result", &other_result]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text).unwrap()
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}
