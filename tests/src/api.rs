//! A small client of the gateway's OpenAI-style API, by hand (what the
//! SDKs send): for error cases and for tests that drive it from Rust.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The gateway at one address, `/v1/...` under it.
pub struct Api {
    pub http: reqwest::Client,
    /// `http://ADDR/v1`.
    pub base: String,
}

impl Api {
    pub fn new(addr: std::net::SocketAddr) -> Api {
        Api {
            http: reqwest::Client::new(),
            base: format!("http://{addr}/v1"),
        }
    }

    pub async fn send(&self, req: reqwest::RequestBuilder, key: Option<&str>) -> (u16, Value) {
        self.try_send(req, key).await.unwrap()
    }

    /// [`Api::send`], with a failure to reach the gateway returned.
    pub async fn try_send(
        &self,
        req: reqwest::RequestBuilder,
        key: Option<&str>,
    ) -> Result<(u16, Value), reqwest::Error> {
        let req = match key {
            Some(k) => req.bearer_auth(k),
            None => req,
        };
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await?;
        Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    }

    pub async fn get(&self, path: &str, key: &str) -> (u16, Value) {
        self.send(self.http.get(format!("{}{path}", self.base)), Some(key))
            .await
    }

    pub async fn post(&self, path: &str, key: &str, body: Value) -> (u16, Value) {
        self.try_post(path, key, body).await.unwrap()
    }

    pub async fn try_post(
        &self,
        path: &str,
        key: &str,
        body: Value,
    ) -> Result<(u16, Value), reqwest::Error> {
        let req = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap());
        self.try_send(req, Some(key)).await
    }

    /// `POST /v1/files` as multipart, the way the SDKs send it.
    pub async fn upload(&self, key: &str, bytes: &[u8]) -> (u16, Value) {
        self.try_upload(key, bytes).await.unwrap()
    }

    pub async fn try_upload(
        &self,
        key: &str,
        bytes: &[u8],
    ) -> Result<(u16, Value), reqwest::Error> {
        let boundary = "sluice-test-boundary-7f3a";
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
             Content-Type: application/jsonl\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(bytes);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let req = self
            .http
            .post(format!("{}/files", self.base))
            .header(
                "content-type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body);
        self.try_send(req, Some(key)).await
    }

    /// Uploads `bytes` and creates a batch of them; the batch object.
    pub async fn batch(&self, key: &str, bytes: &[u8], window: &str) -> Value {
        self.batch_to(key, bytes, window, "/v1/embeddings").await
    }

    /// [`Api::batch`] naming `endpoint` as the batch's.
    pub async fn batch_to(&self, key: &str, bytes: &[u8], window: &str, endpoint: &str) -> Value {
        let (status, file) = self.upload(key, bytes).await;
        assert_eq!(status, 200, "{file}");
        let (status, batch) = self
            .post("/batches", key, json!({"input_file_id": file["id"], "endpoint": endpoint, "completion_window": window}))
            .await;
        assert_eq!(status, 200, "{batch}");
        batch
    }

    /// Polls the batch until its status is final.
    pub async fn wait(&self, key: &str, id: &str, within: Duration) -> Value {
        self.wait_for(key, id, within)
            .await
            .unwrap_or_else(|b| panic!("batch not final in {within:?}: {b}"))
    }

    /// [`Api::wait`], returning the batch as last seen if it is not final
    /// in time (an unreachable gateway is retried until then).
    pub async fn wait_for(&self, key: &str, id: &str, within: Duration) -> Result<Value, Value> {
        let until = Instant::now() + within;
        loop {
            let url = format!("{}/batches/{id}", self.base);
            let b = match self.try_send(self.http.get(url), Some(key)).await {
                Ok((_, b)) => b,
                Err(e) => Value::String(e.to_string()),
            };
            if ["completed", "failed", "expired", "cancelled"]
                .contains(&b["status"].as_str().unwrap_or_default())
            {
                return Ok(b);
            }
            if Instant::now() > until {
                return Err(b);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn content(&self, key: &str, file_id: &Value) -> Vec<Value> {
        let resp = self
            .http
            .get(format!(
                "{}/files/{}/content",
                self.base,
                file_id.as_str().unwrap()
            ))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}
