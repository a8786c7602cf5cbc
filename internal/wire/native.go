package wire

import "github.com/tidwall/gjson"

// SGLang's native API (POST /generate) answers in its own shape, not
// OpenAI's: a stream of SSE events, each
//
//	{"text": "...", "output_ids": [...], "meta_info": {"id": "...",
//	 "finish_reason": null, "prompt_tokens": 9, "completion_tokens": 3,
//	 "cached_tokens": 0, ...}}
//
// ending with [DONE], where text and output_ids are the whole answer so
// far (only the new part with --incremental-streaming-output), every
// chunk's meta_info counts the tokens, and finish_reason is null until the
// last chunk, then an object whose "type" is "stop", "length" or "abort".
// A stream that fails is an error chunk, {"error": {"message": ...}}, then
// [DONE]. A whole answer is one such object, or for a batch (a list of
// prompts, or n > 1) a list of them. Its keys are read as SGLang writes
// them, case and all.

// PeekNative reads one streamed chunk of SGLang's native API as PeekChunk
// reads an OpenAI one: a token when its text or output ids are not empty,
// its finish and abort from meta_info.finish_reason, its usage from
// meta_info's completion_tokens and cached_tokens, an error chunk.
func PeekNative(data []byte) Peek {
	p := Peek{CachedTokens: -1}
	root := gjson.Parse(bytesString(data))
	if !isObject(root) {
		return p
	}
	root.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "text":
			p.Token = p.Token || v.Type == gjson.String && len(v.Raw) > 2
		case "output_ids":
			p.Token = p.Token || isArray(v) && v.Get("#").Int() > 0
		case "error":
			p.Error = v.Type != gjson.Null
		case "meta_info":
			if isObject(v) {
				p.Finish, p.Abort, p.Usage, p.CompletionTokens, p.CachedTokens = nativeMeta(v)
			}
		}
		return true
	})
	return p
}

// nativeMeta reads a native answer's meta_info: whether it finished (and
// was given up), and its token counts (cached -1 when absent).
func nativeMeta(v gjson.Result) (finish, abort, usage bool, completion, cached int) {
	cached = -1
	v.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "finish_reason":
			finish = v.Type != gjson.Null
			abort = isObject(v) && v.Get("type").Str == "abort"
		case "completion_tokens":
			if v.Type == gjson.Number {
				usage, completion = true, max(int(v.Int()), 0)
			}
		case "cached_tokens":
			if v.Type == gjson.Number {
				cached = max(int(v.Int()), 0)
			}
		}
		return true
	})
	return finish, abort, usage, completion, cached
}

// PeekNativeBody reads a whole native answer's tokens as PeekBody reads an
// OpenAI one's usage: its completion tokens (a batch's summed) and cached
// prompt tokens (-1 when not reported, or for a batch, whose prompts'
// differ); (0, -1) for a body that is not valid JSON.
func PeekNativeBody(data []byte) (completionTokens, cachedTokens int) {
	if !ValidJSON(data) {
		return 0, -1
	}
	root := gjson.Parse(bytesString(data))
	switch {
	case isObject(root):
		_, _, _, completion, cached := nativeMeta(root.Get("meta_info"))
		return completion, cached
	case isArray(root):
		sum := 0
		root.ForEach(func(_, v gjson.Result) bool {
			if isObject(v) {
				_, _, _, completion, _ := nativeMeta(v.Get("meta_info"))
				sum += completion
			}
			return true
		})
		return sum, -1
	}
	return 0, -1
}

// NativeAbortedUnanswered is AbortedUnanswered for a whole native answer:
// SGLang answers a request given up by its abort_request with a 200 whose
// meta_info.finish_reason.type is "abort"; of no completion tokens, it was
// not answered at all.
func NativeAbortedUnanswered(body []byte) bool {
	if !ValidJSON(body) {
		return false
	}
	root := gjson.Parse(bytesString(body))
	if !isObject(root) {
		return false
	}
	_, abort, _, completion, _ := nativeMeta(root.Get("meta_info"))
	return abort && completion == 0
}

// PeekNativeTail reads a whole native answer too long to hold from its
// last bytes, as PeekTail reads an OpenAI one's: the last whole
// "meta_info" object in tail gives its completion and cached tokens (a
// batch's last answer's alone); (0, -1) when there is none.
func PeekNativeTail(tail []byte) (completionTokens, cachedTokens int) {
	completionTokens, cachedTokens = 0, -1
	lastObject(tail, `"meta_info"`, func(v gjson.Result) bool {
		_, _, usage, completion, cached := nativeMeta(v)
		if usage {
			completionTokens, cachedTokens = completion, cached
		}
		return usage
	})
	return completionTokens, cachedTokens
}
