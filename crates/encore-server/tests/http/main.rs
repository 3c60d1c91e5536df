//! The OpenAI-compatible server over a real engine loop (CPU backend, `dummy:tiny`) and a
//! real HTTP listener on loopback, driven by a minimal HTTP/1.1 client: completions and
//! chat, whole and streamed (with the usage chunk), greedy output equal to `generate`,
//! 64 concurrent streaming clients, stop strings, a client leaving mid-stream frees its KV
//! blocks, the bad inputs' status codes and error bodies, bearer auth, models, health and
//! metrics, the fields refused or only logged, chat content parts, `/tokenize` and
//! `/detokenize`, tool calls (each format, every `tool_choice`, whole and streamed) and
//! reasoning, and `/openapi.json` (every route, and answers that fit it).
//!
//! One test binary in modules: `harness` (the server start-up and the HTTP client),
//! `generation`, `harmony` (gpt-oss's chat format), `errors`, `fields`, `lifecycle`, `tools`, `agents`, `openapi`, and
//! `clients` (the requests real client libraries send, each as the library sends it).

mod agents;
mod clients;
mod errors;
mod fields;
mod generation;
mod harmony;
mod harness;
mod lifecycle;
mod openapi;
mod tools;
