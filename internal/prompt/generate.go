package prompt

import (
	"errors"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/gorgo-llm/gorgo/internal/wire"
)

// SGLang's native API, POST /generate (its GenerateReqInput), carries no
// chat: its prompt is "text" (a string, or a batch: a list of strings) or
// "input_ids" (a list of token ids, or a batch of such lists), or
// "input_embeds" (which gorgo does not read: routed by load alone); its
// limits are in "sampling_params" (max_new_tokens, 128 when absent;
// min_new_tokens; n); it names no model, though a gateway in front of it
// may ("model"), but may name a LoRA adapter of its model ("lora_path":
// an adapter's name, or a batch's list of them).

// DefaultMaxNewTokens is SGLang's max_new_tokens when a /generate request
// gives none.
const DefaultMaxNewTokens = 128

var errGenerate = errors.New("either text or input_ids should be provided: text a string or a list of strings, input_ids a list of token ids or a list of such lists")

// ParseGenerate reads a native /generate body into r as ParseRequest reads
// a completion's: Text is the prompt (its input_ids, as their JSON stands
// for them, where given, even beside its text, as the engine prefills
// them; else its text), a batch's prompts each followed by a newline with their
// ends in PromptEnds; MaxTokens is sampling_params.max_new_tokens
// (DefaultMaxNewTokens when absent; -1 for null, no limit), MinTokens its min_new_tokens, N its
// n; Stream, Model, LoRAPath and RID as given. A batch's sampling_params may be a list,
// one per prompt: the first is read. Keys are read as SGLang reads them,
// case and all.
func ParseGenerate(body []byte, r *Request) error {
	*r = Request{Text: r.Text[:0], PromptEnds: r.PromptEnds[:0], Media: r.Media[:0], MaxTokens: DefaultMaxNewTokens, HasMaxTokens: true, N: 1}
	if !wire.ValidJSON(body) { // gjson's own recurses per level: a deep body would overflow the stack
		return errors.New("malformed JSON")
	}
	root := gjson.Parse(bytesString(body))
	if !isObject(root) {
		return errors.New("malformed JSON: the body must be a JSON object")
	}
	var text, ids, params gjson.Result
	embeds := false
	var err error
	root.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "text":
			text = v
		case "input_ids":
			ids = v
		case "input_embeds":
			embeds = v.Type != gjson.Null
		case "sampling_params":
			params = v
		case "stream":
			switch v.Type {
			case gjson.True, gjson.False:
				r.Stream = v.Bool()
			case gjson.Null:
			default:
				err = errors.New("stream must be a boolean")
			}
		// The strings kept are copied: root views the caller's body, whose
		// buffer outlives this request (a pool's), while the model may be
		// read after it (a span exported later).
		case "model":
			if v.Type == gjson.String {
				r.Model = strings.Clone(v.Str)
			}
		case "lora_path":
			r.LoRAPath = strings.Clone(loraPath(v))
		case "rid":
			r.RID = strings.Clone(ridOf(v))
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	hasText, hasIDs := text.Exists() && text.Type != gjson.Null, ids.Exists() && ids.Type != gjson.Null
	switch {
	case hasText && hasIDs && embeds:
		err = errors.New("either text, input_ids or input_embeds should be provided, not all three")
	case hasIDs:
		// With text too, the engine prefills the ids (the text is the
		// client's): they are the prompt, its length exact.
		err = r.generateIDs(ids)
	case hasText:
		err = r.generateText(text)
	case embeds:
		// Embeddings, not text: routed by load alone (an empty Text).
	default:
		err = errGenerate
	}
	if err != nil {
		return err
	}
	if isArray(params) {
		params = params.Get("0")
	}
	if isObject(params) {
		return r.samplingParams(params)
	}
	return nil
}

// ridOf is what RID keeps of an rid: a string's value, a list's JSON.
func ridOf(v gjson.Result) string {
	switch {
	case v.Type == gjson.String:
		return v.Str
	case isArray(v):
		return v.Raw
	}
	return ""
}

// stringOf is a string's value ("" for any other value).
func stringOf(v gjson.Result) string {
	if v.Type == gjson.String {
		return v.Str
	}
	return ""
}

// loraPath is the one adapter lora_path names for every prompt: its
// string, or the string every element of its list is ("" when they
// differ, or one is null: the base model).
func loraPath(v gjson.Result) string {
	if v.Type == gjson.String {
		return v.Str
	}
	if !isArray(v) {
		return ""
	}
	name, one := "", true
	v.ForEach(func(_, p gjson.Result) bool {
		one = p.Type == gjson.String && p.Str != "" && (name == "" || p.Str == name)
		name = p.Str
		return one
	})
	if !one {
		return ""
	}
	return name
}

// generateText reads "text": a string, or a batch of them.
func (r *Request) generateText(v gjson.Result) error {
	switch {
	case v.Type == gjson.String:
		r.Text = append(r.Text, v.Str...)
		return nil
	case !isArray(v):
		return errGenerate
	}
	return r.generateBatch(v, func(s gjson.Result) bool {
		r.Text = append(r.Text, s.Str...)
		return s.Type == gjson.String
	})
}

// generateIDs reads "input_ids": a list of token ids, whose JSON stands
// for the text, or a batch of them.
func (r *Request) generateIDs(v gjson.Result) error {
	if !isArray(v) {
		return errGenerate
	}
	if v.Get("0").Type == gjson.Number {
		if !tokenIDs(v) {
			return errGenerate
		}
		r.Text = append(r.Text, v.Raw...)
		return nil
	}
	return r.generateBatch(v, func(list gjson.Result) bool {
		r.Text = append(r.Text, list.Raw...)
		return isArray(list) && tokenIDs(list)
	})
}

// generateBatch reads a batch, a non-empty list whose each element add
// appends to Text (false: not a prompt); more than one are each followed
// by a newline, their ends in PromptEnds.
func (r *Request) generateBatch(v gjson.Result, add func(gjson.Result) bool) error {
	n := v.Get("#").Int()
	ok := n > 0
	r.Batch = true
	v.ForEach(func(_, p gjson.Result) bool {
		if ok = add(p); ok && n > 1 {
			r.PromptEnds = append(r.PromptEnds, len(r.Text))
			r.Text = append(r.Text, '\n')
		}
		return ok
	})
	if !ok {
		return errGenerate
	}
	return nil
}

// tokenIDs reports whether v is a non-empty list of whole numbers.
func tokenIDs(v gjson.Result) bool {
	n := 0
	ok := true
	v.ForEach(func(_, id gjson.Result) bool {
		n++
		if id.Type != gjson.Number {
			ok = false
		} else if _, err := strconv.ParseInt(id.Raw, 10, 64); err != nil {
			ok = false
		}
		return ok
	})
	return ok && n > 0
}

// samplingParams reads the limits of a sampling_params object: as hints,
// a value that is not a whole number of at least 1 (0 for
// min_new_tokens) is marked Odd and read as absent, and the engine
// refuses it.
func (r *Request) samplingParams(v gjson.Result) error {
	var err error
	v.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "max_new_tokens":
			switch n, ok := wholeNumber(v); {
			case v.Type == gjson.Null: // None to SGLang: the context left
				r.MaxTokens, r.HasMaxTokens = -1, false
			case !ok || n < 0:
				err = errors.New("sampling_params.max_new_tokens must be a whole number of at least 0")
			default:
				r.MaxTokens = int(min(n, 1<<24))
			}
		case "min_new_tokens":
			if n, ok := wholeNumber(v); ok && n >= 0 {
				r.MinTokens = int(min(n, 1<<24))
			} else if v.Type != gjson.Null {
				r.Odd |= HintMinTokens
			}
		case "n":
			if n, ok := wholeNumber(v); ok && n >= 1 {
				r.N = int(min(n, 1<<16))
			} else if v.Type != gjson.Null {
				r.Odd |= HintN
			}
		}
		return err == nil
	})
	return err
}

// wholeNumber reads a JSON number that is a whole number.
func wholeNumber(v gjson.Result) (int64, bool) {
	if v.Type != gjson.Number {
		return 0, false
	}
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	return n, err == nil
}
