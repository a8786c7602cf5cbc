// Package enginemetrics reads an engine replica's Prometheus /metrics: the
// request gauges, KV cache use and capacity, prefix-cache hit rate, token
// counters and LoRA adapters gorgo routes on, from SGLang's or vLLM's
// exposition. Each engine's names are a row of Dialects; Parse recognises
// the engine by them, and Scraper fetches and parses one replica's metrics.
package enginemetrics
