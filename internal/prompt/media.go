package prompt

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"slices"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"
)

// A chat's media: its images, audio clips and videos. The engines encode
// each into tokens of the prompt that the chat template places where the
// part stands, and cache them by the media's content: the router counts
// each as its tokens' worth of bytes named by its hash.

// maxMediaBytes bounds the bytes a request's media stand for in its
// canonical prompt, so that a body of many small media parts cannot grow
// it a thousandfold; past it a part is its line alone.
const maxMediaBytes = 1 << 20

// mediaNames name each kind of media in a canonical prompt, in the order
// of their fields in partFields (from "image_url").
var mediaNames = [...]string{"image", "audio", "audio", "video"}

// mediaKind is the field (its number in partFields) that holds the media
// of a part of type t: "image_url" (a responses request's "input_image"),
// "input_audio", "audio_url" or "video_url" (vLLM's and SGLang's types);
// 0 for another type.
func mediaKind(t []byte, inputParts bool) int {
	switch string(t) {
	case "image_url":
		return 3
	case "input_image":
		if inputParts {
			return 3
		}
	case "input_audio":
		return 4
	case "audio_url":
		return 5
	case "video_url":
		return 6
	}
	return 0
}

// appendMedia appends what stands for a medium in a canonical prompt: a
// line naming its kind and its hash (of its part's value: its URL or its
// data, so that the same image gives the same blocks and another image
// others), padded with spaces to size bytes in all (its tokens' worth).
func appendMedia(dst []byte, name string, hash uint64, size int) []byte {
	start := len(dst)
	dst = append(dst, name...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, hash, 16)
	dst = append(dst, '\n')
	if pad := size - (len(dst) - start); pad > 0 {
		dst = slices.Grow(dst, pad)
		for range pad {
			dst = append(dst, ' ')
		}
	}
	return dst
}

// mediaKey reads a media part's value (raw JSON, a string or an object):
// what names the medium, its URL (the string; an object's "url", or an
// "input_audio" part's base64 "data": the last that is a string, else the
// whole object), as a hash, so that the same URL names the same medium
// whatever else the part says ("detail", "format"); and, for an audio clip,
// how long it lasts, read from its data where the request carries it (a
// data URL's, or the "data"), else audioURLSeconds for a clip the engine
// fetches.
func mediaKey(raw []byte, dec *decoder, audio bool) (hash uint64, length time.Duration) {
	// A string as the engines read it, its escapes decoded, in quotes:
	// "https:\/\/x" and "https://x" are one URL.
	value := func(v []byte) []byte {
		if bytes.IndexByte(v, '\\') < 0 {
			return v
		}
		dec.val = append(unquote(append(dec.val[:0], '"'), v), '"')
		return dec.val
	}
	name := func(v []byte) {
		v = value(v)
		hash = xxhash.Sum64(v) | 1
		if audio {
			length = urlLength(v[1 : len(v)-1])
		}
	}
	if raw[0] == '"' {
		name(raw)
		return hash, length
	}
	hash, length = xxhash.Sum64(raw)|1, audioURLSeconds*time.Second
	d := dec.reset(raw)
	if _, err := d.ReadToken(); err != nil {
		return hash, length
	}
	for d.PeekKind() == '"' {
		k, err := d.ReadValue()
		if err != nil {
			break
		}
		dec.key = unquote(dec.key[:0], k) // before the value's read reuses k's bytes
		kind := d.PeekKind()
		v, err := d.ReadValue()
		if err != nil {
			break
		}
		switch {
		case kind != '"':
		case string(dec.key) == "url":
			name(v)
		case string(dec.key) == "data":
			v = value(v)
			hash = xxhash.Sum64(v) | 1
			if audio {
				length = clipLength(v[1 : len(v)-1])
			}
		}
	}
	return hash, length
}

// urlLength is how long the audio clip at url lasts: its data's length
// for a base64 data URL, else audioURLSeconds.
func urlLength(url []byte) time.Duration {
	if !bytes.HasPrefix(url, []byte("data:")) {
		return audioURLSeconds * time.Second
	}
	i := bytes.Index(url[:min(len(url), 256)], []byte(";base64,"))
	if i < 0 {
		return audioURLSeconds * time.Second
	}
	return clipLength(url[i+len(";base64,"):])
}

// clipLength is how long the audio clip of base64 data (as a JSON string
// holds it) lasts: a WAV file's data at its header's byte rate, else at
// 16 kB a second, an MP3's at 128 kbit/s.
func clipLength(data []byte) time.Duration {
	size, rate := len(bytes.TrimRight(data, "="))*3/4, 16000
	if r := wavByteRate(data); r > 0 {
		size, rate = size-wavHeaderBytes, int(r)
	}
	return time.Duration(float64(max(size, 0)) / float64(rate) * float64(time.Second))
}

// wavHeaderBytes is a canonical WAV header's length: the RIFF chunk's
// header, the "fmt " chunk and the "data" chunk's header.
const wavHeaderBytes = 44

// wavByteRate is the byte rate in the header of a WAV file's base64 data
// ("RIFF", "WAVE", then the "fmt " chunk, whose byte rate is at byte 28);
// 0 when data does not open so (another format, or JSON escapes in it).
func wavByteRate(data []byte) uint32 {
	const chars = 44 // the header's first 33 bytes
	if len(data) < chars || !bytes.HasPrefix(data, []byte("UklGR")) {
		return 0
	}
	var h [33]byte
	if n, err := base64.StdEncoding.Decode(h[:], data[:chars]); err != nil || n != len(h) ||
		string(h[:4]) != "RIFF" || string(h[8:16]) != "WAVEfmt " {
		return 0
	}
	return binary.LittleEndian.Uint32(h[28:32])
}
