package prompt

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// wavBase64 is the base64 of a WAV file of the given length: 16-bit PCM at
// rate samples a second, channels channels, silent.
func wavBase64(rate, channels int, length time.Duration) string {
	n := int(length.Seconds()*float64(rate)) * channels * 2
	h := make([]byte, 44, 44+n)
	copy(h, "RIFF")
	binary.LittleEndian.PutUint32(h[4:], uint32(36+n))
	copy(h[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(h[16:], 16)
	binary.LittleEndian.PutUint16(h[20:], 1)
	binary.LittleEndian.PutUint16(h[22:], uint16(channels))
	binary.LittleEndian.PutUint32(h[24:], uint32(rate))
	binary.LittleEndian.PutUint32(h[28:], uint32(rate*channels*2))
	binary.LittleEndian.PutUint16(h[32:], uint16(channels*2))
	binary.LittleEndian.PutUint16(h[34:], 16)
	copy(h[36:], "data")
	binary.LittleEndian.PutUint32(h[40:], uint32(n))
	return base64.StdEncoding.EncodeToString(append(h, make([]byte, n)...))
}

func TestAudioLength(t *testing.T) { // and TestMediaKey below
	wav3 := wavBase64(16000, 1, 3*time.Second)
	wav2 := wavBase64(44100, 2, 2*time.Second)
	mp3 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xff, 0xfb, 0x90}, 16000)) // 48,000 bytes, not WAV
	for _, tt := range []struct {
		name, value string
		want        time.Duration
	}{
		{"input_audio wav", `{"data":"` + wav3 + `","format":"wav"}`, 3 * time.Second},
		{"input_audio stereo wav at 44.1 kHz", `{"format":"wav","data":"` + wav2 + `"}`, 2 * time.Second},
		{"input_audio mp3 at 16 kB a second", `{"data":"` + mp3 + `","format":"mp3"}`, 3 * time.Second},
		{"data URL", `"data:audio/wav;base64,` + wav3 + `"`, 3 * time.Second},
		{"data URL in an object", `{"url":"data:audio/wav;base64,` + wav2 + `"}`, 2 * time.Second},
		{"fetched", `{"url":"https://example.com/q.wav"}`, audioURLSeconds * time.Second},
		{"fetched, a string", `"https://example.com/q.wav"`, audioURLSeconds * time.Second},
		{"data URL without base64", `"data:audio/wav,abc"`, audioURLSeconds * time.Second},
		{"the last of data and url", `{"data":"` + wav3 + `","url":"https://x"}`, audioURLSeconds * time.Second},
		{"data not a string", `{"data":7}`, audioURLSeconds * time.Second},
		{"escaped header, read as the engines decode it", `{"data":"` + strings.Replace(wav3, "V", `\u0056`, 1) + `"}`, 3 * time.Second},
	} {
		var d decoder
		_, got := mediaKey([]byte(tt.value), &d, true)
		if tt.want == 0 { // an estimate: within a few percent of the data's size at 16 kB/s
			tt.want = time.Duration(float64(len(wav3)) * 3 / 4 / 16000 * float64(time.Second))
		}
		if diff := got - tt.want; diff < -10*time.Millisecond || diff > 10*time.Millisecond {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
		if _, ref := referenceMediaKey([]byte(tt.value)); ref != got {
			t.Errorf("%s: %v, the reference's %v", tt.name, got, ref)
		}
	}
}

// An audio clip stands for its length's tokens and a video for its own,
// each named by its value's hash, so that another clip is another prefix.
func TestAudioAndVideoArePartOfThePrompt(t *testing.T) {
	wav := wavBase64(16000, 1, 4*time.Second)
	est := Estimator{AudioTokensPerSecond: 10, VideoTokens: 300}
	audio := `{"data":"` + wav + `","format":"wav"}`
	body := `{"messages":[{"role":"user","content":[` +
		`{"type":"input_audio","input_audio":` + audio + `},` +
		`{"type":"text","text":"what is said?"},` +
		`{"type":"audio_url","audio_url":{"url":"https://x/a.mp3"}},` +
		`{"type":"video_url","video_url":{"url":"https://x/v.mp4"}},` +
		`{"type":"video_url","image_url":"not a video's"}]}]}`
	var r Request
	if err := est.ParseRequest([]byte(body), true, &r); err != nil {
		t.Fatal(err)
	}
	want := []byte("user\n")
	want = appendMedia(want, "audio", xxhash.Sum64String(`"`+wav+`"`)|1, 40*4)
	want = append(want, "what is said?"...)
	want = appendMedia(want, "audio", xxhash.Sum64String(`"https://x/a.mp3"`)|1, audioURLSeconds*10*4)
	want = appendMedia(want, "video", xxhash.Sum64String(`"https://x/v.mp4"`)|1, 300*4)
	want = append(want, '\n')
	if !bytes.Equal(r.Text, want) {
		t.Fatalf("text\n%q\nwant\n%q", r.Text, want)
	}
	if at := 5 + 160; len(r.Media) != 6 || r.Media[0] != 5 || r.Media[1] != at || r.Media[2] != at+len("what is said?") {
		t.Errorf("media at %v", r.Media)
	}
	check(t, []byte(body), true) // the reference reads it alike (at the default estimator)

	// The same question about another clip: another prefix, the same
	// opening keys.
	var other Request
	if err := est.ParseRequest([]byte(strings.Replace(body, "a.mp3", "b.mp3", 1)), true, &other); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(r.Text, other.Text) {
		t.Error("another clip gives the same prompt")
	}
	p1, i1 := OpeningKeys(&r, est)
	p2, i2 := OpeningKeys(&other, est)
	if p1 != p2 || i1 != i2 {
		t.Error("another clip changes the opening keys")
	}

	// A responses request's input reads them as a chat's.
	var in Request
	if err := est.ParseInput([]byte(`{"input":[{"role":"user","content":[{"type":"input_audio","input_audio":`+audio+`}]}]}`), &in); err != nil {
		t.Fatal(err)
	}
	if want := appendMedia([]byte("user\n"), "audio", xxhash.Sum64String(`"`+wav+`"`)|1, 160); !bytes.Equal(in.Text, append(want, '\n')) {
		t.Errorf("input: %q", in.Text)
	}
}

// Media share one allowance a request: past it a part is its line alone.
func TestMediaShareTheAllowance(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"messages":[{"role":"user","content":[`)
	const n = 600 // 600 videos of 4,096 tokens: 9.4 MiB, past 1 MiB
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"type":"video_url","video_url":"%d"},{"type":"audio_url","audio_url":"%d"}`, i, i)
	}
	b.WriteString(`]}]}`)
	var r Request
	if err := ParseRequest([]byte(b.String()), true, &r); err != nil {
		t.Fatal(err)
	}
	if max := maxMediaBytes + 2*n*len("video 0123456789abcdef\n"); len(r.Text) > max {
		t.Errorf("%d bytes of text, want at most %d", len(r.Text), max)
	}
	if got := bytes.Count(r.Text, []byte("video ")) + bytes.Count(r.Text, []byte("audio ")); got != 2*n {
		t.Errorf("%d media named, want %d", got, 2*n)
	}
}

func TestAudioBytes(t *testing.T) {
	for _, tt := range []struct {
		est  Estimator
		d    time.Duration
		want int
	}{
		{Estimator{}, 2 * time.Second, 50 * 4},
		{Estimator{AudioTokensPerSecond: 7}, 1500 * time.Millisecond, 11 * 4}, // 10.5 rounds up
		{Estimator{}, 0, 4}, // at least a token
		{Estimator{}, 24 * time.Hour, MaxMediaTokens * 4},        // at most MaxMediaTokens
		{Estimator{BytesPerToken: 64}, time.Hour, maxMediaBytes}, // at most the allowance
		{Estimator{AudioTokensPerSecond: 1 << 30}, time.Second, MaxAudioTokensPerSecond * 4},
	} {
		if got := tt.est.AudioBytes(tt.d); got != tt.want {
			t.Errorf("%+v %v: %d bytes, want %d", tt.est, tt.d, got, tt.want)
		}
	}
}

// A medium is named by its URL (or its data), not by what else its part
// says: the engines key it by its content, which the same URL gives.
func TestMediaKey(t *testing.T) {
	same := []string{`"https://x/cat.png"`, `{"url":"https://x/cat.png"}`, `{"url":"https://x/cat.png","detail":"low"}`,
		`{"detail":"high","url":"https://x/cat.png"}`, `{ "u\u0072l" : "https://x/cat.png" }`, `{"url":"https://x/dog.png","url":"https://x/cat.png"}`}
	var d decoder
	want, _ := mediaKey([]byte(same[0]), &d, false)
	for _, v := range same {
		if got, _ := mediaKey([]byte(v), &d, false); got != want {
			t.Errorf("%s: %x, want %x (the URL's)", v, got, want)
		}
		if got, _ := referenceMediaKey([]byte(v)); got != want {
			t.Errorf("reference %s: %x, want %x", v, got, want)
		}
	}
	for _, v := range []string{`"https://x/dog.png"`, `{"url":"https://x/cat.png","url":"https://x/dog.png"}`, `{"url":7}`, `{}`} {
		if got, _ := mediaKey([]byte(v), &d, false); got == want {
			t.Errorf("%s: named as the cat", v)
		}
	}
	if a, _ := mediaKey([]byte(`{"data":"AAAA","format":"wav"}`), &d, true); a != xxhash.Sum64String(`"AAAA"`)|1 {
		t.Error("an input_audio part is not named by its data")
	}
}
