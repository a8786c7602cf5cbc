package synth

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/gorgo-llm/gorgo/internal/prompt"
	"github.com/gorgo-llm/gorgo/internal/trace"
)

// chain returns n block ids: the first shared of the shared ones, then ids
// unique to tag.
func chain(n, shared int, tag uint64) []uint64 {
	ids := make([]uint64, n)
	for i := range ids {
		if i < shared {
			ids[i] = uint64(i)
		} else {
			ids[i] = tag<<32 | uint64(i)
		}
	}
	return ids
}

// canonical is what the emulator and the router read: prompt.Chat of the
// messages the replayer sends.
func canonical(r *trace.Request) []byte { return prompt.Chat(nil, Messages(r)) }

func TestSynthesisedPromptHasInputTokens(t *testing.T) {
	sizes := []int{511, 512, 513, 1023, 1024, 1025, 4096, 30000, 131072, 131073}
	for n := 1; n <= 600; n++ {
		sizes = append(sizes, n)
	}
	var e prompt.Estimator
	for _, n := range sizes {
		r := trace.Request{InputTokens: n, HashIDs: chain(trace.BlockCount(n), 0, uint64(n))}
		text := canonical(&r)
		got := e.Tokens(text)
		switch {
		case n == 1:
			// "user\n\n" alone is 6 bytes: 2 tokens is the closest possible.
			if got != 2 {
				t.Errorf("InputTokens 1: estimated %d, want 2", got)
			}
		case n%trace.BlockTokens == 1:
			// A last block of one token cannot hold the 6-byte overhead:
			// it is empty and the prompt is 2 bytes over.
			if got != n+1 || len(text) != 4*n+2 {
				t.Errorf("InputTokens %d: estimated %d from %d bytes, want %d from %d", n, got, len(text), n+1, 4*n+2)
			}
		default:
			if got != n || len(text) != 4*n {
				t.Errorf("InputTokens %d: estimated %d from %d bytes, want exactly %d from %d", n, got, len(text), n, 4*n)
			}
		}
		if n >= 100 && (got < n*99/100 || got > n*101/100) {
			t.Errorf("InputTokens %d: estimate %d is more than 1%% off", n, got)
		}
	}
}

func TestSynthesisedPromptsShareBlocks(t *testing.T) {
	var e prompt.Estimator
	for _, k := range []int{0, 1, 2, 5} {
		a := trace.Request{InputTokens: 7*512 + 100, HashIDs: chain(8, k, 1)}
		b := trace.Request{InputTokens: 6*512 + 7, HashIDs: chain(7, k, 2)}
		ca := AppendContent(nil, a.HashIDs, a.InputTokens)
		cb := AppendContent(nil, b.HashIDs, b.InputTokens)
		n := k * BlockBytes
		if !bytes.Equal(ca[:n], cb[:n]) {
			t.Errorf("k=%d: the first %d bytes differ", k, n)
		}
		if bytes.Equal(ca[n:n+BlockBytes], cb[n:n+BlockBytes]) {
			t.Errorf("k=%d: block %d is equal although its ids differ", k, k)
		}
		// What an engine hashing the canonical prompt sees: exactly k
		// equal blocks.
		ba := e.Blocks(canonical(&a), trace.BlockTokens, nil)
		bb := e.Blocks(canonical(&b), trace.BlockTokens, nil)
		common := 0
		for common < min(len(ba), len(bb)) && ba[common] == bb[common] {
			common++
		}
		if common != k {
			t.Errorf("k=%d: the canonical prompts share %d hashed blocks", k, common)
		}
	}
}

func TestTurnEndingOnABlockIsAPrefixOfTheNext(t *testing.T) {
	// Turn 1 ends exactly at the end of block 3; turn 2 continues its
	// blocks. The engine must see all 3 blocks of turn 1 again.
	ids := chain(5, 5, 0)
	one := trace.Request{InputTokens: 3 * 512, HashIDs: ids[:3]}
	two := trace.Request{InputTokens: 4*512 + 10, HashIDs: ids}
	c1, c2 := canonical(&one), canonical(&two)
	if !bytes.HasPrefix(c2, c1) {
		t.Fatalf("turn 1's canonical prompt is not a prefix of turn 2's")
	}
	var e prompt.Estimator
	b1 := e.Blocks(c1, trace.BlockTokens, nil)
	b2 := e.Blocks(c2, trace.BlockTokens, nil)
	if len(b1) != 3 || !slices.Equal(b1, b2[:3]) {
		t.Errorf("turn 1's %d hashed blocks are not turn 2's first", len(b1))
	}
}

func TestBlockTextIsDeterministicReadableAndCut(t *testing.T) {
	full := AppendBlockText(nil, 42, BlockBytes)
	if len(full) != BlockBytes {
		t.Fatalf("full block is %d bytes", len(full))
	}
	if again := AppendBlockText([]byte("x"), 42, BlockBytes); !bytes.Equal(again[1:], full) {
		t.Errorf("the text of id 42 is not deterministic")
	}
	for _, size := range []int{0, 1, 7, 100, 2042, 2043, 2047} {
		if got := AppendBlockText(nil, 42, size); !bytes.Equal(got, full[:size]) {
			t.Errorf("size %d is not a prefix of the full text", size)
		}
	}
	if other := AppendBlockText(nil, 43, BlockBytes); bytes.Equal(other, full) {
		t.Errorf("ids 42 and 43 give the same text")
	}
	words := bytes.Fields(full)
	if len(words) < 250 {
		t.Errorf("only %d words in a block", len(words))
	}
	for _, c := range full {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == ' ' || c == '.' || c == '\n') {
			t.Fatalf("unexpected byte %q in %q", c, full)
		}
	}
	if full[blockNewline] != '\n' {
		t.Errorf("no newline at byte %d", blockNewline)
	}
	if testing.Verbose() {
		fmt.Printf("block 42 starts: %.120s\n", full)
	}
}

func TestMessagesPreferTheTrace(t *testing.T) {
	r := trace.Request{InputTokens: 3, HashIDs: []uint64{9}, Messages: []trace.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}}}
	got := Messages(&r)
	want := []prompt.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}}
	if !slices.Equal(got, want) {
		t.Errorf("Messages = %v, want %v", got, want)
	}
	r.Messages = nil
	if got := Messages(&r); len(got) != 1 || got[0].Role != "user" || len(got[0].Content) != 4*3-6 {
		t.Errorf("synthesised messages %q", got)
	}
}

func BenchmarkAppendContent(b *testing.B) {
	ids := chain(60, 0, 1)
	var buf []byte
	b.ReportAllocs()
	b.SetBytes(int64(60 * BlockBytes))
	for b.Loop() {
		buf = AppendContent(buf[:0], ids, 60*512)
	}
}

// The simulator's prefix key is the one the live router reads from the
// prompt the replayer sends, whatever the prompt's length.
func TestPrefixKeyIsTheRoutersOwn(t *testing.T) {
	est := prompt.Estimator{}
	for _, n := range []int{1, 2, 5, 200, 254, 255, 256, 257, 258, 300, 511, 512, 513, 2000, 9000} {
		for _, ids := range [][]uint64{chain(trace.BlockCount(n), 0, uint64(n)), nil} {
			r := trace.Request{InputTokens: n, HashIDs: ids}
			if got, want := NewKeys(est).Of(&r), prompt.PrefixKey(canonical(&r), est); got != want {
				t.Errorf("%d tokens (%d ids): %x, the router reads %x", n, len(ids), got, want)
			}
		}
	}
	r := trace.Request{InputTokens: 3, Messages: []trace.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}}}
	if NewKeys(est).Of(&r) != prompt.PrefixKey(canonical(&r), est) {
		t.Error("a trace with messages")
	}
}

// Keys gives every request the router's key, whether or not it has seen
// the request's first block before.
func TestKeysRemembersFirstBlocks(t *testing.T) {
	est := prompt.Estimator{}
	keys := NewKeys(est)
	var reqs []trace.Request
	for _, n := range []int{5, 256, 300, 511, 512, 513, 9000} {
		for _, first := range []uint64{7, 8} { // shared first blocks, different lengths
			ids := chain(trace.BlockCount(n), 0, uint64(n))
			ids[0] = first
			reqs = append(reqs, trace.Request{InputTokens: n, HashIDs: ids})
		}
	}
	reqs = append(reqs, trace.Request{InputTokens: 3, Messages: []trace.Message{{Role: "user", Content: "hi"}}}, trace.Request{InputTokens: 9})
	for pass := range 2 {
		for i := range reqs {
			if got, want := keys.Of(&reqs[i]), prompt.PrefixKey(canonical(&reqs[i]), est); got != want {
				t.Errorf("pass %d, request %d (%d tokens): %x, want %x", pass, i, reqs[i].InputTokens, got, want)
			}
		}
	}
}

// The simulator's key of a request's instructions is the one the live
// router reads from the body the replayer sends.
func TestKeysOfInstructions(t *testing.T) {
	est := prompt.Estimator{}
	keys := NewKeys(est)
	long := string(bytes.Repeat([]byte("instructions "), 200)) // past the key's 256 tokens
	for _, msgs := range [][]trace.Message{
		{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}},
		{{Role: "developer", Content: "a"}, {Role: "system", Content: "b"}, {Role: "user", Content: "c"}},
		{{Role: "system", Content: long}, {Role: "user", Content: "hi"}},
		{{Role: "user", Content: "hi"}, {Role: "system", Content: "late"}},
		{{Role: "assistant", Content: "welcome"}, {Role: "system", Content: "late"}},
		nil,
	} {
		r := trace.Request{InputTokens: 40, HashIDs: []uint64{1, 2, 3}, Messages: msgs}
		body, err := json.Marshal(map[string]any{"messages": Messages(&r)})
		if err != nil {
			t.Fatal(err)
		}
		var parsed prompt.Request
		if err := prompt.ParseRequest(body, true, &parsed); err != nil {
			t.Fatal(err)
		}
		live := prompt.InstructionsKey(parsed.Text, parsed.Instructions, est)
		if got := keys.Instructions(&r); got != live || (live == 0) != (len(msgs) == 0 || msgs[0].Role == "user" || msgs[0].Role == "assistant") {
			t.Errorf("%v: simulated %x, live %x", msgs, got, live)
		}
		if len(msgs) > 0 && msgs[0].Content == long && live != prompt.PrefixKey(parsed.Text, est) {
			t.Error("instructions that fill the opening do not hash as the prefix key")
		}
	}
}
