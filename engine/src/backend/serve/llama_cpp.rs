//! Adapters on llama.cpp's own server (`serve.adapter_api = "llama-cpp"`).
//! `llama-server` loads LoRA adapters only when it starts (`--lora FILE`,
//! several allowed), then lets each request choose the scale of each
//! (`"lora": [{"id": N, "scale": S}]` in the body, every adapter it does
//! not list at 0). So one server serves the base model and every adapter
//! trained so far: started with `--lora-init-without-apply` (no adapter
//! applied unless a request asks) and every adapter's file in place of
//! `{loras}`; restarted, once the requests in flight have ended, when a
//! call names an adapter it was not started with. The ids are read back
//! from the server (`GET /lora-adapters`, which lists each adapter's id and
//! path), never assumed from the order of the options.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::shell_quote;

/// What `{loras}` becomes: no adapter applied by default, then one
/// `--lora FILE` per distinct adapter file (`DIR/adapter_file`), in
/// model-name order. Two models on one checkout (the same adapter tree
/// trained twice) share one file and so one id.
pub(super) fn loras_arg(adapters: &BTreeMap<String, PathBuf>, file: &str) -> String {
    let mut arg = String::from("--lora-init-without-apply");
    let mut seen = std::collections::BTreeSet::new();
    for dir in adapters.values() {
        let path = dir.join(file);
        if seen.insert(path.clone()) {
            arg.push_str(" --lora ");
            arg.push_str(&shell_quote(&path.to_string_lossy()));
        }
    }
    arg
}

/// The adapters whose file is not there, with that file's path: left out
/// of a start (llama-server would refuse to start at all).
pub(super) fn missing(adapters: &BTreeMap<String, PathBuf>, file: &str) -> Vec<(String, String)> {
    adapters
        .iter()
        .filter(|(_, dir)| !dir.join(file).is_file())
        .map(|(model, dir)| (model.clone(), dir.join(file).display().to_string()))
        .collect()
}

/// Reads the running server's adapter ids (`GET /lora-adapters` at
/// `origin`, `http://127.0.0.1:PORT`) and maps every adapter it was
/// started with to its id. An adapter the server does not list, or a list
/// that cannot be read, is an error: a request would otherwise be served
/// by the wrong weights without anyone knowing.
pub(super) async fn read_ids(
    origin: &str,
    adapters: &BTreeMap<String, PathBuf>,
    file: &str,
    api_key: Option<&str>,
    timeout: Duration,
) -> Result<BTreeMap<String, u64>, String> {
    let url = format!("{origin}/lora-adapters");
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let mut get = client.get(&url);
    if let Some(key) = api_key {
        get = get.bearer_auth(key);
    }
    let resp = get
        .send()
        .await
        .map_err(|e| format!("cannot list the adapters at {url}: {e}"))?;
    let status = resp.status();
    let body = resp.bytes().await.unwrap_or_default();
    if !status.is_success() {
        return Err(format!(
            "{url} answered HTTP {status}: is this llama.cpp's llama-server?"
        ));
    }
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&body)
        .map_err(|e| format!("{url} did not answer a JSON list of adapters: {e}"))?;
    let by_path: BTreeMap<String, u64> = listed
        .iter()
        .filter_map(|a| Some((a.get("path")?.as_str()?.to_string(), a.get("id")?.as_u64()?)))
        .collect();
    let mut ids = BTreeMap::new();
    for (model, dir) in adapters {
        let path = dir.join(file).to_string_lossy().into_owned();
        let id = by_path.get(&path).ok_or_else(|| {
            format!(
                "the server does not list adapter {model} ({path}) at {url}: does serve.command pass {{loras}} to llama-server?"
            )
        })?;
        ids.insert(model.clone(), *id);
    }
    Ok(ids)
}

/// The `lora` list of a request for `model` on a server started with the
/// adapters `ids`: the model's own adapter at scale 1, every other at 0
/// (the base model: all at 0). Every id is listed once (llama-server
/// applies the last entry of an id), so what the server applies never
/// depends on scales set through `POST /lora-adapters`. `None` when the
/// server has no adapter (the body stays as without one).
pub(super) fn request_loras(ids: &BTreeMap<String, u64>, model: &str) -> Option<serde_json::Value> {
    if ids.is_empty() {
        return None;
    }
    let own = ids.get(model);
    let distinct: std::collections::BTreeSet<u64> = ids.values().copied().collect();
    let list: Vec<serde_json::Value> = distinct
        .into_iter()
        .map(|id| {
            let scale = if Some(&id) == own { 1.0 } else { 0.0 };
            serde_json::json!({"id": id, "scale": scale})
        })
        .collect();
    Some(serde_json::Value::Array(list))
}

/// The origin (`http://127.0.0.1:PORT`) of a base URL ending in `/v1`.
pub(super) fn origin(base_url: &str) -> &str {
    base_url.strip_suffix("/v1").unwrap_or(base_url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> BTreeMap<String, PathBuf> {
        [
            ("m-b".to_string(), PathBuf::from("/t/b b")),
            ("m-a".to_string(), PathBuf::from("/t/a'a")),
        ]
        .into_iter()
        .collect()
    }

    #[test]
    fn loras_are_quoted_in_name_order_and_applied_to_none() {
        assert_eq!(
            loras_arg(&two(), "adapter.gguf"),
            "--lora-init-without-apply --lora '/t/a'\\''a/adapter.gguf' --lora '/t/b b/adapter.gguf'"
        );
        assert_eq!(
            loras_arg(&BTreeMap::new(), "x"),
            "--lora-init-without-apply"
        );
    }

    #[test]
    fn a_request_applies_its_own_adapter_and_zeroes_the_others() {
        let ids: BTreeMap<String, u64> = [("m-a".to_string(), 1), ("m-b".to_string(), 0)]
            .into_iter()
            .collect();
        assert_eq!(
            request_loras(&ids, "m-a").unwrap(),
            serde_json::json!([{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1.0}])
        );
        assert_eq!(
            request_loras(&ids, "base").unwrap(),
            serde_json::json!([{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}])
        );
        assert_eq!(request_loras(&BTreeMap::new(), "base"), None);
    }

    #[test]
    fn two_models_on_one_adapter_file_share_its_id_and_apply_it() {
        // Regression: both entries of the shared id were sent, the other
        // model's 0 last, and llama-server applies the last: the base model.
        let same: BTreeMap<String, PathBuf> = [
            ("m-c1".to_string(), PathBuf::from("/t/x")),
            ("m-c2".to_string(), PathBuf::from("/t/x")),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            loras_arg(&same, "adapter.gguf"),
            "--lora-init-without-apply --lora /t/x/adapter.gguf"
        );
        let ids: BTreeMap<String, u64> = [("m-c1".to_string(), 0), ("m-c2".to_string(), 0)]
            .into_iter()
            .collect();
        for model in ["m-c1", "m-c2"] {
            assert_eq!(
                request_loras(&ids, model).unwrap(),
                serde_json::json!([{"id": 0, "scale": 1.0}])
            );
        }
    }

    #[test]
    fn a_missing_adapter_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("adapter.gguf"), b"x").unwrap();
        let mut adapters = two();
        adapters.insert("m-c".into(), dir.path().to_path_buf());
        let gone = missing(&adapters, "adapter.gguf");
        assert_eq!(
            gone,
            [
                ("m-a".to_string(), "/t/a'a/adapter.gguf".to_string()),
                ("m-b".to_string(), "/t/b b/adapter.gguf".to_string())
            ]
        );
    }

    #[test]
    fn the_origin_drops_v1() {
        assert_eq!(origin("http://127.0.0.1:5/v1"), "http://127.0.0.1:5");
    }
}
