// Package prompt turns the prompt of an OpenAI-style request into what the
// engine model and the router reason about: an estimated token count and
// chained block hashes. The emulator, the replayer and the proxy share it,
// so that the same text always gives the same tokens and the same blocks.
//
// Tokens are estimated from bytes (BytesPerToken bytes per token, 4 by
// default, a common rule of thumb for English text and BPE vocabularies);
// a block is BlockTokens estimated tokens of the canonical prompt bytes.
package prompt

import (
	"math"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/gorgo-llm/gorgo/internal/prefix"
)

// DefaultBytesPerToken is the estimator's default.
const DefaultBytesPerToken = 4

// Message is one chat message.
type Message struct {
	Role    string
	Content string
}

// DefaultImageTokens is how many prompt tokens an image stands for by
// default: vision encoders give from 256 (Gemma 3) and 576 (LLaVA 1.5) to
// over a thousand for a megapixel (Qwen2.5-VL, one per 28×28 patch;
// InternVL's 256 per 448-pixel tile).
const DefaultImageTokens = 1024

// DefaultAudioTokensPerSecond is how many prompt tokens a second of audio
// stands for by default: Qwen2-Audio's and Qwen2.5-Omni's encoders give
// one per 40 ms (Voxtral's and Phi-4-multimodal's one per 80 ms,
// Ultravox's and Gemma 3n's one per 160 ms).
const DefaultAudioTokensPerSecond = 25

// DefaultVideoTokens is how many prompt tokens a video stands for by
// default: a few seconds' frames (Qwen2.5-VL samples two a second, each
// pair up to 768 tokens; LLaVA-OneVision gives 196 a frame, InternVL 256).
const DefaultVideoTokens = 4096

// MaxMediaTokens bounds Estimator.ImageTokens and VideoTokens, and the
// tokens an audio clip stands for.
const MaxMediaTokens = 1 << 16

// MaxAudioTokensPerSecond bounds Estimator.AudioTokensPerSecond.
const MaxAudioTokensPerSecond = 1000

// Estimator estimates tokens from bytes. The zero value uses
// DefaultBytesPerToken and the media defaults.
//
// An image, an audio clip or a video in a chat (or a responses request)
// stands for its encoder's tokens, which depend on the model and the
// media: the parser writes that many tokens' worth of bytes in its place,
// naming it by its hash, so that the same media gives the same cached
// blocks and other media others.
type Estimator struct {
	BytesPerToken int
	// ImageTokens is how many prompt tokens each image ("image_url"
	// parts; a responses request's "input_image") stands for.
	ImageTokens int
	// AudioTokensPerSecond is how many prompt tokens a second of audio
	// ("input_audio" and "audio_url" parts) stands for. A clip's length
	// is read from its data when the request carries it (a WAV header's
	// byte rate, else 16 kB a second, an MP3's at 128 kbit/s); a clip
	// the engine fetches counts as audioURLSeconds.
	AudioTokensPerSecond int
	// VideoTokens is how many prompt tokens each video ("video_url"
	// parts) stands for.
	VideoTokens int
}

// ImageBytes is how many bytes of a canonical prompt stand for an image:
// ImageTokens' worth, at most maxMediaBytes (a request's whole allowance).
func (e Estimator) ImageBytes() int { return e.mediaBytes(e.ImageTokens, DefaultImageTokens) }

// VideoBytes is how many bytes of a canonical prompt stand for a video:
// VideoTokens' worth, at most maxMediaBytes.
func (e Estimator) VideoBytes() int { return e.mediaBytes(e.VideoTokens, DefaultVideoTokens) }

// audioURLSeconds is how long an audio clip the engine fetches (a URL
// that is not a data URL) counts as: a spoken question's length.
const audioURLSeconds = 10

// AudioBytes is how many bytes of a canonical prompt stand for an audio
// clip of the given length (the tokens of AudioTokensPerSecond, at least
// one), at most maxMediaBytes.
func (e Estimator) AudioBytes(d time.Duration) int {
	rate := e.AudioTokensPerSecond
	if rate <= 0 {
		rate = DefaultAudioTokensPerSecond
	}
	rate = min(rate, MaxAudioTokensPerSecond)
	secs := min(max(d.Seconds(), 0), MaxMediaTokens) // not NaN: a Duration
	return e.mediaBytes(max(int(math.Ceil(secs*float64(rate))), 1), 1)
}

// mediaBytes is n tokens' worth of bytes (def when n is not positive,
// at most MaxMediaTokens), at most maxMediaBytes.
func (e Estimator) mediaBytes(n, def int) int {
	if n <= 0 {
		n = def
	}
	return min(e.Bytes(min(n, MaxMediaTokens)), maxMediaBytes)
}

func (e Estimator) bpt() int {
	if e.BytesPerToken <= 0 {
		return DefaultBytesPerToken
	}
	return e.BytesPerToken
}

// Tokens estimates the tokens of text: ceil(len / BytesPerToken), at least 1
// for non-empty text.
func (e Estimator) Tokens(text []byte) int {
	b := e.bpt()
	return (len(text) + b - 1) / b
}

// Bytes returns how many bytes stand for n tokens.
func (e Estimator) Bytes(n int) int { return n * e.bpt() }

// Blocks appends to dst the chained hashes of text in blocks of blockTokens
// estimated tokens: len = ceil(Tokens(text) / blockTokens).
func (e Estimator) Blocks(text []byte, blockTokens int, dst []uint64) []uint64 {
	return prefix.Chain(text, blockTokens*e.bpt(), dst)
}

// Chat appends the canonical bytes of a chat prompt to dst: each message as
// its role, a newline, its content and a newline. A conversation that grows
// by appending messages grows by appending bytes, so its earlier turns'
// blocks stay a prefix of its later turns'.
func Chat(dst []byte, msgs []Message) []byte {
	for _, m := range msgs {
		dst = append(dst, m.Role...)
		dst = append(dst, '\n')
		dst = append(dst, m.Content...)
		dst = append(dst, '\n')
	}
	return dst
}

// PrefixKeyTokens is how many leading prompt tokens the prefix key hashes
// (simple session affinity's key: the paper's 256).
const PrefixKeyTokens = 256

// InstructionsKey is the hash of the first instructions bytes of a
// canonical prompt (Request.Instructions: a chat's opening system or
// developer messages), at most PrefixKeyTokens tokens' worth, so that
// instructions that fill those tokens hash as PrefixKey; 0 when
// instructions is 0.
func InstructionsKey(text []byte, instructions int, est Estimator) uint64 {
	if instructions <= 0 {
		return 0
	}
	return xxhash.Sum64(text[:min(instructions, len(text), est.Bytes(PrefixKeyTokens))])
}

// ToolsKey is the hash of a chat's tools, the first tools bytes of its
// canonical prompt (Request.Tools); 0 for none.
func ToolsKey(text []byte, tools int) uint64 {
	if tools <= 0 {
		return 0
	}
	return xxhash.Sum64(text[:min(tools, len(text))])
}

// OpeningKeys are a parsed request's PrefixKey and InstructionsKey, of
// its messages (after its tools) with their media left out: an image (an
// audio clip, a video) is blocks of the prompt of its own, not what names
// a conversation or an application (the same question about another
// picture is the same application's). For a request without tools or
// media they are
// PrefixKey(r.Text) and InstructionsKey(r.Text, r.Instructions).
func OpeningKeys(r *Request, est Estimator) (prefixKey, instructionsKey uint64) {
	limit := est.Bytes(PrefixKeyTokens)
	prefixKey = hashSkipping(r.Text, r.Media, r.Tools, len(r.Text), limit)
	if r.Instructions > 0 {
		instructionsKey = hashSkipping(r.Text, r.Media, r.Tools, min(r.Tools+r.Instructions, len(r.Text)), limit)
	}
	return prefixKey, instructionsKey
}

// hashSkipping hashes the first limit bytes of text[from:to] outside the
// spans (pairs of offsets into text, in order).
func hashSkipping(text []byte, spans []int, from, to, limit int) uint64 {
	if len(spans) == 0 {
		return xxhash.Sum64(text[from:min(to, from+limit)])
	}
	var d xxhash.Digest
	d.Reset()
	at := from
	for i := 0; i+1 < len(spans) && limit > 0 && at < to; i += 2 {
		if spans[i+1] <= at {
			continue
		}
		end := min(spans[i], to)
		if end > at {
			n := min(end-at, limit)
			d.Write(text[at : at+n])
			limit -= n
		}
		at = max(at, spans[i+1])
	}
	if limit > 0 && at < to {
		d.Write(text[at:min(to, at+limit)])
	}
	return d.Sum64()
}

// PrefixKey is the hash of a canonical prompt's first PrefixKeyTokens
// tokens' bytes.
func PrefixKey(text []byte, est Estimator) uint64 {
	return xxhash.Sum64(text[:min(len(text), est.Bytes(PrefixKeyTokens))])
}
